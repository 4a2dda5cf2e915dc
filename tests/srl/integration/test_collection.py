"""SRLCollection and SRLEpisode on a real Temporal server, real jail and real ast-grep:
gold replay, a teacher behind a scripted OpenAI-compatible server (malformed answers and
recovery), continue-as-new, a sandbox timeout, and idempotent step rows."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from activities.llm import LLMGateway
from activities.srl.episode import SrlActivities
from client.srl import start_collection, upload_tasks
from client.temporal import cause_chain
from keel.settings import Settings
from keel.srl.steps import CollectionInput, CollectionResult
from sandbox import SandboxLimits
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.files import load_models_config
from store.srl_steps import list_steps
from tests.srl.conftest import HAND_TASKS, tasks_jsonl
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER
from workflows.srl import SRLCollection, SRLEpisode


def _inp(settings: Settings, collection: str, tasks: list[dict], **kw: object) -> CollectionInput:
    digest, count = upload_tasks(artifact_store_from_settings(settings), tasks_jsonl(tasks))
    return CollectionInput(collection=collection, tasks_digest=digest, task_count=count, **kw)


async def _collect(client: Client, settings: Settings, inp: CollectionInput) -> CollectionResult:
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    return await handle.result()


async def test_gold_replay_verifies_every_task_and_continues_as_new(
    client: Client, settings: Settings, worker: Worker
) -> None:
    collection = f"gold-{uuid.uuid4().hex[:8]}"
    inp = _inp(settings, collection, HAND_TASKS, window=2, per_run=4)
    result = await _collect(client, settings, inp)

    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.verified_episodes) == (6, 6, 6, 6)
    assert (t.format_errors, t.sandbox_failures, t.failed_episodes) == (0, 0, 0)
    rows = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    assert sorted(r.step_key for r in rows) == sorted(f"{t['task_id']}#1" for t in HAND_TASKS)
    assert {(r.source, r.model, r.verified, r.step_similarity) for r in rows} == {
        ("gold_replay", "gold", True, 1.0)
    }
    assert {r.language for r in rows} == {"python", "javascript", "typescript", "java"}
    record = json.loads(rows[0].record_json)
    assert record["sandbox_result"]["reparses"] is True
    assert record["prompt"]["messages"][1]["content"].count("Task:") == 1

    # 6 tasks, 4 per run: the first run continued as new once, carrying its totals.
    runs = [e async for e in client.list_workflows(f"WorkflowId = 'srl/{collection}'")]
    assert len(runs) == 2

    # Run again: every step is already written, nothing doubles, the totals say the same.
    again = await _collect(client, settings, inp)
    assert again.totals.verified_steps == 6
    assert len(list_steps(get_sessionmaker(settings.resolved_database_url), collection)) == 6


MALFORMED = "I would rename it. <action>{not json</action>"


async def test_teacher_malformed_answer_is_a_recorded_step_then_recovers(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    with ScriptedOpenAIServer(
        [ScriptedReply(content=MALFORMED)], default=ScriptedReply(content=SWAP_ANSWER)
    ) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        from workers.main import build_worker

        async with build_worker(client, settings):
            collection = f"teach-{uuid.uuid4().hex[:8]}"
            task = next(t for t in HAND_TASKS if t["task_id"] == "py-swap")
            # Free running: step 2 goes on from step 1's outcome (the malformed answer).
            inp = _inp(
                settings,
                collection,
                [task],
                source="teacher",
                model="local",
                step_mode="free_running",
            )
            result = await _collect(client, settings, inp)
        prompts = [r.json["messages"][1]["content"] for r in srv.requests]

    assert result.totals.steps == 2 and result.totals.format_errors == 1
    assert result.totals.verified_steps == 1 and result.totals.verified_episodes == 1
    rows = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    assert [(r.step, r.format_ok, r.verified, r.reward_total) for r in rows] == [
        (1, False, False, -1.0),
        (2, True, True, rows[1].reward_total),
    ]
    assert rows[1].reward_total is not None and rows[1].reward_total >= 1.9
    assert rows[0].model == "local" and rows[0].source == "teacher"
    first = json.loads(rows[0].record_json)
    assert first["model_output"]["format_error"].startswith("missing_tag")
    assert first["model_output"]["raw"] == MALFORMED
    # The second prompt carries the first step's outcome in the state's history.
    assert "malformed answer (missing_tag)" in prompts[1]
    assert "malformed answer" not in prompts[0]


async def test_sandbox_timeout_is_a_recorded_step(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    acts = SrlActivities(
        sessions=sessions,
        artifacts=artifact_store_from_settings(settings),
        llm=LLMGateway(load_models_config(settings.models_config)),
        prompts_path=settings.srl_prompts,
        # No ast-grep run finishes in a millisecond: every action times out.
        sandbox_limits=SandboxLimits(wall_time_s=0.001),
    )
    collection = f"slow-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[SRLCollection, SRLEpisode],
        activities=acts.all(),
        activity_executor=ThreadPoolExecutor(2),
    ):
        # Free running: a failed step is followed by another, up to the cap.
        inp = _inp(settings, collection, HAND_TASKS[:1], max_steps=2, step_mode="free_running")
        result = await _collect(client, settings, inp)
    assert result.totals.steps == 2 and result.totals.sandbox_failures == 2
    assert result.totals.verified_steps == 0 and result.totals.failed_episodes == 0
    rows = list_steps(sessions, collection)
    assert len(rows) == 2 and not any(r.verified for r in rows)
    sandbox = json.loads(rows[0].record_json)["sandbox_result"]
    assert sandbox["ok"] is False and sandbox["timed_out"] is True
    assert sandbox["limit"] == "wall"  # which limit stopped it
    assert "timed out True" in sandbox["error"]


async def test_bad_task_file_fails_the_window_without_retrying(
    client: Client, settings: Settings, worker: Worker
) -> None:
    store = artifact_store_from_settings(settings)
    digest = store.put_bytes(b'{"task_id": "x"}\n')
    inp = CollectionInput(
        collection=f"bad-{uuid.uuid4().hex[:8]}", tasks_digest=digest, task_count=1
    )
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    with pytest.raises(WorkflowFailureError) as caught:
        await handle.result()
    messages = [str(e) for e in cause_chain(caught.value)]
    assert any("task file line 1: instruction: Field required" in m for m in messages), messages
    events = [e async for e in handle.fetch_history_events()]
    failed = [e for e in events if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED]
    assert len(failed) == 1  # final: not retried
