"""Step modes end to end (real Temporal, jail, ast-grep and SQL; a scripted teacher): the
expert's step 2 done first, in the default ``expert_prefix`` mode (step 2 starts from the
expert's step-1 file, its prompt shows the expert's step 1 and no expert-derived
feedback) and in ``free_running`` with ``expert_feedback`` (step 2 goes on from the
model's own file, its prompt says "removed code the goal keeps"). Each row names its mode
and whether expert-derived feedback went into the prompt."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from temporalio.client import Client

from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.steps import CollectionInput, CollectionResult
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.support.scripted_openai import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from tests.support.srl import (
    RENAME_F,
    SWAP_G,
    TWO_STEP_MID,
    TWO_STEP_POST,
    TWO_STEP_PRE,
    answer_with,
    tasks_jsonl,
    two_step_task,
)
from workers.main import build_worker

RENAMED_FIRST = "x = g(1, 2)\n"


def _prompt(req: RecordedRequest) -> str:
    return str(req.json["messages"][-1]["content"])


def renames_first(req: RecordedRequest) -> ScriptedReply:
    """The expert's step 2 first: rename ``f`` while it is there, else swap ``g``'s
    arguments (each correct in itself)."""
    if "f(" in _prompt(req).split("</state>")[-1]:  # the code, after the state
        return ScriptedReply(content=answer_with(RENAME_F, "rename"))
    return ScriptedReply(content=answer_with(SWAP_G, "swap"))


async def _collect(
    client: Client, settings: Settings, tmp_path: Path, **options: Any
) -> tuple[str, CollectionResult, list[dict[str, Any]], list[str]]:
    with ScriptedOpenAIServer(default=renames_first) as srv:
        run = settings.model_copy(
            update={"models_config": write_models_config(tmp_path / "models.yaml", srv.base_url)}
        )
        async with build_worker(client, run):
            collection = f"modes-{uuid.uuid4().hex[:8]}"
            digest, count = upload_tasks(
                artifact_store_from_settings(settings), tasks_jsonl([two_step_task()])
            )
            inp = CollectionInput(
                collection=collection,
                tasks_digest=digest,
                task_count=count,
                source="teacher",
                model="local",
                **options,
            )
            handle = await start_collection(client, inp, task_queue=settings.task_queue)
            result = await handle.result()
        prompts = [_prompt(r) for r in srv.requests]
    rows = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    return collection, result, [json.loads(r.record_json) for r in rows], prompts


async def test_expert_prefix_is_the_default_and_starts_step_2_from_the_experts_file(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    _, result, records, prompts = await _collect(client, settings, tmp_path)
    assert (result.totals.steps, result.totals.verified_episodes) == (2, 1)
    one, two = records
    # Step 1: the rename done first, compared with the expert's step 1 (the swap).
    assert (one["text_before"], one["text_after"]) == (TWO_STEP_PRE, RENAMED_FIRST)
    assert one["reward"]["effect"] == "destructive"
    assert round(one["reward"]["step_similarity"], 4) == 0.0775
    # Step 2 starts from the expert's step-1 file, not the model's; the rename is the
    # expert's step 2.
    assert (two["text_before"], two["text_after"]) == (TWO_STEP_MID, TWO_STEP_POST)
    assert (two["reward"]["effect"], two["reward"]["step_similarity"]) == ("equivalent", 1.0)
    assert two["reward"]["verified"] is True
    assert {(r["step_mode"], r["expert_feedback_in_prompt"]) for r in records} == {
        ("expert_prefix", False)
    }
    # The prompt shows the expert's step 1; nothing of the model's step 1.
    assert "step 1 (expert): applied `f($A, $B)` -> `f($B, $A)`" in prompts[1]
    state = prompts[1].split("<state>")[1].split("</state>")[0]
    assert "removed code" not in state and "rename" not in state  # the model's decision
    assert "x = f(2, 1)" in prompts[1].split("</state>")[-1]


async def test_free_running_goes_on_from_the_models_own_file(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    _, result, records, prompts = await _collect(
        client, settings, tmp_path, step_mode="free_running", expert_feedback=True
    )
    assert (result.totals.steps, result.totals.verified_episodes) == (2, 1)
    one, two = records
    assert one["reward"]["effect"] == "destructive"
    assert round(one["reward"]["step_similarity"], 4) == 0.0775
    # Step 2 goes on from the model's own file; its swap of g reaches post.
    assert (two["text_before"], two["text_after"]) == (RENAMED_FIRST, TWO_STEP_POST)
    assert two["reward"]["verified"] is True
    assert {(r["step_mode"], r["expert_feedback_in_prompt"]) for r in records} == {
        ("free_running", True)
    }
    assert "step 1: applied but it removed code the goal keeps" in prompts[1]


async def test_free_running_without_expert_feedback_says_only_what_the_jail_saw(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    _, _, records, prompts = await _collect(client, settings, tmp_path, step_mode="free_running")
    assert {(r["step_mode"], r["expert_feedback_in_prompt"]) for r in records} == {
        ("free_running", False)
    }
    assert "step 1: applied; the file changed" in prompts[1]
    assert "goal keeps" not in prompts[1] and "match the goal" not in prompts[1]
