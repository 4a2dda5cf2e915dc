"""Collections that resume, and samples with their own seeds, on a real Temporal server,
real jail and ast-grep, and a scripted OpenAI-compatible server that counts requests:

- a finished teacher collection run again asks no model and records nothing new;
- a half-finished one (a subset collected first, or an episode cut short by the step cap)
  asks only for what is missing;
- a run naming another model or source under the same id fails, naming both;
- ``samples=3``: three episodes a task, three recorded seeds, the seeds sent;
- the Parquet export has the record's parts as columns.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from temporalio.client import Client, WorkflowFailureError

from cli.srl import write_export
from client.srl import CollectionMismatch, check_identity, start_collection, upload_tasks
from client.temporal import cause_chain
from keel.settings import Settings
from keel.srl.rewards import REWARD_VERSION
from keel.srl.steps import CollectionInput, CollectionResult, EpisodeResult
from keel.srl.trajectory import sample_seed
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl
from workers.main import build_worker

MALFORMED = "no tags at all"


def _inp(settings: Settings, collection: str, tasks: list[dict], **kw: object) -> CollectionInput:
    digest, count = upload_tasks(artifact_store_from_settings(settings), tasks_jsonl(tasks))
    fields: dict[str, object] = {"source": "teacher", "model": "local", **kw}
    return CollectionInput(collection=collection, tasks_digest=digest, task_count=count, **fields)  # type: ignore[arg-type]


async def _collect(client: Client, settings: Settings, inp: CollectionInput) -> CollectionResult:
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    return await handle.result()


def _pre(request_json: dict) -> str:
    """Which task a request was for: the ``divide(...)`` call its prompt shows."""
    content = request_json["messages"][1]["content"]
    start = content.index("divide(")
    return content[start : content.index(")", start) + 1]


@pytest.fixture
def scripted(settings: Settings, tmp_path: Path):  # type: ignore[no-untyped-def]
    with ScriptedOpenAIServer(default=ScriptedReply(content=SWAP_ANSWER)) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        yield srv


async def test_a_finished_collection_run_again_asks_no_model(
    client: Client, settings: Settings, scripted: ScriptedOpenAIServer
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    collection = f"resume-{uuid.uuid4().hex[:8]}"
    inp = _inp(settings, collection, divide_tasks(4), window=2, per_run=3)
    async with build_worker(client, settings):
        first = await _collect(client, settings, inp)
        assert len(scripted.requests) == 4
        rows = list_steps(sessions, collection)
        again = await _collect(client, settings, inp)

    assert len(scripted.requests) == 4  # not one more model call
    assert (first.totals.steps, first.totals.verified_steps, first.totals.reused_steps) == (
        4,
        4,
        0,
    )
    t = again.totals
    assert (t.episodes, t.steps, t.verified_steps, t.reused_steps) == (4, 4, 4, 4)
    assert t.failed_episodes == 0
    assert list_steps(sessions, collection) == rows  # the same rows, nothing rewritten


async def test_a_half_finished_collection_asks_only_for_what_is_missing(
    client: Client, settings: Settings, scripted: ScriptedOpenAIServer
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    tasks = divide_tasks(4)
    collection = f"half-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, settings):
        # The first run got through two of the four tasks (collected as a subset).
        await _collect(client, settings, _inp(settings, collection, tasks[:2]))
        assert sorted(_pre(r.json) for r in scripted.requests) == ["divide(10, 2)", "divide(11, 2)"]
        full = await _collect(client, settings, _inp(settings, collection, tasks))
    asked = sorted(_pre(r.json) for r in scripted.requests[2:])
    assert asked == ["divide(12, 2)", "divide(13, 2)"]
    assert (full.totals.steps, full.totals.reused_steps, full.totals.verified_steps) == (4, 2, 4)
    assert sorted(r.task_id for r in list_steps(sessions, collection)) == [
        f"swap-{i}" for i in range(4)
    ]


async def test_an_episode_cut_short_goes_on_from_its_last_recorded_step(
    client: Client, settings: Settings, scripted: ScriptedOpenAIServer
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    collection = f"cut-{uuid.uuid4().hex[:8]}"
    scripted.enqueue(ScriptedReply(content=MALFORMED))
    tasks = divide_tasks(1)
    async with build_worker(client, settings):
        free = {"step_mode": "free_running"}  # step 2 goes on from step 1's outcome
        first = await _collect(
            client, settings, _inp(settings, collection, tasks, max_steps=1, **free)
        )
        assert first.totals.verified_episodes == 0 and len(scripted.requests) == 1
        more = await _collect(
            client, settings, _inp(settings, collection, tasks, max_steps=3, **free)
        )
    # Step 1 (malformed) is reused; only step 2 is asked for, and it sees step 1's outcome.
    assert len(scripted.requests) == 2
    assert "malformed answer (missing_tag)" in scripted.requests[1].json["messages"][1]["content"]
    t = more.totals
    assert (t.steps, t.reused_steps, t.format_errors, t.verified_episodes) == (2, 1, 1, 1)
    assert [(r.step, r.format_ok, r.verified) for r in list_steps(sessions, collection)] == [
        (1, False, False),
        (2, True, True),
    ]


async def test_another_model_or_source_under_the_same_id_is_refused(
    client: Client, settings: Settings, scripted: ScriptedOpenAIServer
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    collection = f"same-{uuid.uuid4().hex[:8]}"
    tasks = divide_tasks(2)
    async with build_worker(client, settings):
        await _collect(client, settings, _inp(settings, collection, tasks))
        for change, was, now in [
            ({"model": "other"}, "model 'local'", "model 'other'"),
            ({"source": "gold_replay"}, "source 'teacher'", "source 'gold_replay'"),
        ]:
            inp = _inp(settings, collection, tasks, **change)
            # The client's early answer ...
            with pytest.raises(CollectionMismatch) as early:
                check_identity(sessions, inp)
            assert was in str(early.value) and now in str(early.value)
            # ... and the workflow's own guard, for a start that skips it.
            with pytest.raises(WorkflowFailureError) as caught:
                await _collect(client, settings, inp)
            messages = [str(e) for e in cause_chain(caught.value)]
            assert any(was in m and now in m for m in messages), messages
    assert len(scripted.requests) == 2  # the refused runs asked nothing
    assert len(list_steps(sessions, collection)) == 2


async def test_samples_are_episodes_with_their_own_recorded_seeds(
    client: Client, settings: Settings, scripted: ScriptedOpenAIServer, tmp_path: Path
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    collection = f"samples-{uuid.uuid4().hex[:8]}"
    inp = _inp(settings, collection, divide_tasks(2), samples=3, temperature=0.7, top_p=0.9)
    async with build_worker(client, settings):
        result = await _collect(client, settings, inp)
        ids = [f"srl/{collection}/swap-0", f"srl/{collection}/swap-0~s1"]
        episodes = [
            await client.get_workflow_handle(i, result_type=EpisodeResult).result() for i in ids
        ]
    assert all(e.verified for e in episodes)
    assert (result.totals.episodes, result.totals.steps, result.totals.verified_steps) == (6, 6, 6)
    rows = list_steps(sessions, collection)
    assert len(rows) == 6
    for task_id in ("swap-0", "swap-1"):
        mine = [r for r in rows if r.task_id == task_id]
        assert [r.sample for r in mine] == [0, 1, 2]
        # Step 1 of sample k sends the sample's seed + 1.
        assert [r.seed for r in mine] == [sample_seed(collection, task_id, k) + 1 for k in range(3)]
        assert len({r.seed for r in mine}) == 3
        record = json.loads(mine[1].record_json)
        assert record["sampling"] == {
            "sample": 1,
            "seed": mine[1].seed,
            "temperature": 0.7,
            "top_p": 0.9,
            "max_tokens": 512,
        }
        out = record["model_output"]
        assert (out["prompt_tokens"], out["completion_tokens"], out["finish_reason"]) == (
            5,
            3,
            "stop",
        )
        assert out["latency_s"] > 0
    sent = sorted(
        (r.json["seed"], r.json["temperature"], r.json["top_p"]) for r in scripted.requests
    )
    assert sent == sorted((r.seed, 0.7, 0.9) for r in rows)

    # The Parquet export: the record's parts are columns of their own.
    paths = write_export(rows, tmp_path / "export")
    table = pq.read_table(paths["parquet"])
    for name in (
        "think", "action", "state_update", "prompt", "prompt_json", "seed", "sample", "temperature",
        "top_p", "max_tokens", "prompt_tokens", "completion_tokens", "finish_reason",
        "latency_s", "cost_usd", "paper_reward", "reward_version", "effect",
        "expert_action", "expert_text_after", "text_before", "text_after",
    ):  # fmt: skip
        assert name in table.column_names, name
    assert table.schema.field("paper_reward").type == pa.float64()
    cols = table.to_pydict()
    # Both rewards, typed, with what they are computed from.
    assert all(isinstance(p, float) for p in cols["paper_reward"]), cols["paper_reward"]
    assert set(cols["reward_version"]) == {REWARD_VERSION}
    assert all(t is not None for t in cols["text_before"] + cols["text_after"])
    assert cols["sample"] == [r.sample for r in rows]
    assert cols["seed"] == [r.seed for r in rows]
    assert set(cols["think"]) == {"swap the arguments"}
    assert json.loads(cols["action"][0]) == {
        "kind": "pattern",
        "language": "python",
        "pattern": "divide($A, $B)",
        "rewrite": "divide($B, $A)",
    }
    assert json.loads(cols["state_update"][0]) == {"decisions": ["swap"]}
    # The record's prompt as JSON (the `prompt` column before TRL's chat columns) ...
    assert json.loads(cols["prompt_json"][0])["messages"][1]["content"].count("divide(10, 2)") == 1
    # ... and the chat sent as TRL reads it (tests/srl/integration/test_export_trl.py).
    assert cols["prompt"][0] == json.loads(cols["prompt_json"][0])["messages"]
    assert set(cols["finish_reason"]) == {"stop"}
    assert set(cols["prompt_tokens"]) == {5} and set(cols["completion_tokens"]) == {3}
