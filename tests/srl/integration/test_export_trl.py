"""``srl export`` as a trainer loads it (docs/srl-export.md): a teacher collection (real
Temporal, real jail, a scripted OpenAI-compatible server), an expert set made from it and
replayed (gold replay with the teacher's reasoning), and a gold replay of hand tasks
without an expert set (think text from each task's instruction), exported to Parquet and
loaded with Hugging Face ``datasets``. Checked: the columns TRL's SFT trainer
(``messages``; ``prompt`` + ``completion``) and GRPO trainer (``prompt``, reward columns)
read, and their feature types.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import datasets
from pydantic import TypeAdapter
from temporalio.client import Client

from cli.srl import write_export
from client.srl import collection_tasks, expert_task_file, start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.errors import StepFormatError
from keel.srl.rewards import paper_reward
from keel.srl.step import Action, PatternAction, RuleAction, parse_step
from keel.srl.steps import CollectionInput
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.srl.conftest import HAND_TASKS
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl
from workers.main import build_worker

CONSTANT_THINK = "Expert action for this task."
EXPERT: TypeAdapter[PatternAction | RuleAction] = TypeAdapter(Action)


def srl_reward(completions: list, expert_action: list, **kwargs: object) -> list:
    """docs/srl-export.md's GRPO reward function, as written there."""
    scores = []
    for completion, expert in zip(completions, expert_action, strict=False):
        try:
            action = parse_step(completion[0]["content"]).action
        except StepFormatError:
            action = None  # malformed: -1
        scores.append(paper_reward(action, EXPERT.validate_json(expert)))
    return scores


async def _collect(
    client: Client, settings: Settings, collection: str, data: bytes, **kw: object
) -> None:
    digest, count = upload_tasks(artifact_store_from_settings(settings), data)
    inp = CollectionInput(collection=collection, tasks_digest=digest, task_count=count, **kw)  # type: ignore[arg-type]
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    result = await handle.result()
    assert result.totals.failed_episodes == 0


async def test_the_export_loads_as_trl_conversational_data(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    artifacts = artifact_store_from_settings(settings)
    run = uuid.uuid4().hex[:8]
    teacher, gold_expert, gold_plain = f"trl-t-{run}", f"trl-e-{run}", f"trl-g-{run}"
    with ScriptedOpenAIServer(default=ScriptedReply(content=SWAP_ANSWER)) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings):
            await _collect(
                client, settings, teacher, tasks_jsonl(divide_tasks(2)), source="teacher",
                model="local",
            )  # fmt: skip
            experts, _ = expert_task_file(sessions, artifacts, teacher)
            await _collect(client, settings, gold_expert, experts, source="gold_replay")
            await _collect(client, settings, gold_plain, tasks_jsonl(HAND_TASKS))
        sent = [r.json["messages"] for r in srv.requests]

    files = []
    for collection in (teacher, gold_expert, gold_plain):
        rows = list_steps(sessions, collection)
        tasks = collection_tasks(sessions, artifacts, collection)
        out = tmp_path / collection
        files.append(str(write_export(rows, out, tasks)["parquet"]))

    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "hf")
    )
    print(ds.features)
    Value, List = datasets.Value, datasets.List
    chat = List({"role": Value("string"), "content": Value("string")})
    f = ds.features
    for name in ("messages", "prompt", "completion"):
        assert f[name] == chat, (name, f[name])
    for name in ("reward", "paper_reward", "text_similarity", "reward_total"):
        assert f[name] == Value("float64"), (name, f[name])
    assert f["tests_passed"] == Value("bool")
    assert f["tests_passed_fraction"] == Value("float64")
    assert f["verified"] == Value("bool") and f["format_ok"] == Value("bool")
    for name in ("prompt_tokens", "completion_tokens", "step", "sample"):
        assert f[name] == Value("int64"), (name, f[name])
    for name in ("effect", "finish_reason", "source", "think", "think_source", "prompt_json"):
        assert f[name] == Value("string"), (name, f[name])
    assert f["logprobs"] == List(Value("float64"))
    assert f["token_ids"] == List(Value("int64"))

    rows = ds.to_list()
    assert len(rows) == 2 + 2 + len(HAND_TASKS)
    for row in rows:
        # messages = the chat sent, then the answer; prompt + completion the same split.
        assert row["messages"] == row["prompt"] + row["completion"]
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert [m["role"] for m in row["completion"]] == ["assistant"]
        assert row["prompt"] == json.loads(row["prompt_json"])["messages"]
        assert row["tests_passed"] is None  # no task here has tests
        assert row["reward"] == row["reward_total"] and isinstance(row["paper_reward"], float)
        assert row["effect"] == "equivalent" and row["text_similarity"] == 1.0
        # The completion is an answer the parser reads back, with the row's think text.
        step = parse_step(row["completion"][0]["content"])
        assert step.think == row["think"] and CONSTANT_THINK not in row["think"]
        assert json.loads(row["action"]) == step.action.model_dump(mode="json")

    # docs/srl-export.md's GRPO reward function gives each recorded completion its
    # paper_reward.
    completions = [r["completion"] for r in rows]
    experts = [r["expert_action"] for r in rows]
    assert srl_reward(completions, experts) == [r["paper_reward"] for r in rows]

    by_source = {
        c: [r for r in rows if r["collection"] == c] for c in (teacher, gold_expert, gold_plain)
    }
    # The teacher's rows: the exact chat the server was sent, the answer it gave.
    t_rows = by_source[teacher]
    assert sorted(json.dumps(r["prompt"]) for r in t_rows) == sorted(json.dumps(m) for m in sent)
    for r in t_rows:
        assert (r["source"], r["think_source"], r["think"]) == (
            "teacher",
            "model",
            "swap the arguments",
        )
        assert r["completion"][0]["content"] == SWAP_ANSWER
        assert (r["finish_reason"], r["prompt_tokens"], r["completion_tokens"]) == ("stop", 5, 3)
        assert r["logprobs"] is None  # the gateway returns none
    # The expert set's replay thinks the teacher's reasoning.
    for r in by_source[gold_expert]:
        assert (r["source"], r["think_source"], r["think"]) == (
            "gold_replay", "expert", "swap the arguments",
        )  # fmt: skip
        assert CONSTANT_THINK in r["raw"]  # what the replay recorded; the export replaces it
    # A replay without an expert set thinks from each task's instruction: one a task.
    plain = by_source[gold_plain]
    assert {(r["source"], r["think_source"]) for r in plain} == {("gold_replay", "instruction")}
    for r in plain:
        task = next(t for t in HAND_TASKS if t["task_id"] == r["task_id"])
        assert " ".join(task["instruction"].split()) in r["think"]
    assert len({r["think"] for r in plain}) == len(plain)
