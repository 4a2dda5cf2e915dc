"""A collection with ``batch`` > 0 (keel/srl/batch.py) on a real Temporal server, real jail
and real ast-grep: the same steps, rows and totals as child episodes give, no child
workflow, jail runs shared, a run again reusing every step, and a teacher's calls held to
``window`` in flight."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Worker

from activities.srl.jail import GroupedRuns
from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.steps import CollectionInput, CollectionResult
from sandbox import AstGrepAction
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.srl.conftest import HAND_TASKS, tasks_jsonl
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER, divide_tasks
from workers.main import build_worker


def _inp(settings: Settings, collection: str, tasks: list[dict], **kw: object) -> CollectionInput:
    digest, count = upload_tasks(artifact_store_from_settings(settings), tasks_jsonl(tasks))
    return CollectionInput(collection=collection, tasks_digest=digest, task_count=count, **kw)


async def _collect(
    client: Client, settings: Settings, inp: CollectionInput
) -> tuple[CollectionResult, list[str]]:
    """The result and the event types of every run's history (in run order)."""
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    result = await handle.result()
    types: list[str] = []
    async for wf in client.list_workflows(f"WorkflowId = 'srl/{inp.collection}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        types += [EventType.Name(e.event_type) for e in history.events]
    return result, types


def _comparable(record_json: str) -> dict:
    """A step record without what differs between two runs of one step (the jail's timing
    and exit, shared in a group) or between collections (the seed, drawn from its id)."""
    record = json.loads(record_json)
    record["sampling"].pop("seed")
    record["sandbox_result"] = {
        k: v
        for k, v in (record.get("sandbox_result") or {}).items()
        if k not in ("duration_ms", "exit_code")
    }
    return record


async def test_batched_gold_replay_records_what_child_episodes_record(
    client: Client, settings: Settings, worker: Worker
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    batched = f"batched-{uuid.uuid4().hex[:8]}"
    children = f"children-{uuid.uuid4().hex[:8]}"
    # 6 tasks in 4 languages, 2 a batch, 4 a run: two runs, three batches.
    result, types = await _collect(
        client, settings, _inp(settings, batched, HAND_TASKS, window=2, per_run=4, batch=2)
    )
    base, _ = await _collect(client, settings, _inp(settings, children, HAND_TASKS, window=2))

    assert result.totals == base.totals
    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.verified_episodes) == (6, 6, 6, 6)
    assert "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in types
    assert types.count("EVENT_TYPE_ACTIVITY_TASK_COMPLETED") == 2 + 3  # two windows, 3 batches
    rows = {r.step_key: r for r in list_steps(sessions, batched)}
    base_rows = {r.step_key: r for r in list_steps(sessions, children)}
    assert sorted(rows) == sorted(base_rows) == sorted(f"{t['task_id']}#1" for t in HAND_TASKS)
    for key, row in rows.items():
        assert _comparable(row.record_json) == _comparable(base_rows[key].record_json), key

    # Run again: every step is found recorded, nothing doubles.
    again, _ = await _collect(
        client, settings, _inp(settings, batched, HAND_TASKS, window=2, per_run=4, batch=2)
    )
    assert (again.totals.steps, again.totals.reused_steps) == (6, 6)
    assert len(list_steps(sessions, batched)) == 6


async def test_batched_teacher_holds_window_calls_in_flight_and_records_each_step(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """Twelve tasks, window 3, batches of 4 (so up to 8 episodes in flight): the server
    never has more than three calls at once; each step is one row and one llm_calls key."""
    in_flight = 0
    most = 0
    counting = threading.Lock()  # the server's handlers count in their own threads

    def reply(_req: object) -> ScriptedReply:
        nonlocal in_flight, most
        with counting:
            in_flight += 1
            most = max(most, in_flight)
        return ScriptedReply(content=SWAP_ANSWER, delay_s=0.3)

    with ScriptedOpenAIServer(default=reply) as srv:
        original = srv._completion_body

        def done(*args: object) -> object:
            nonlocal in_flight
            with counting:
                in_flight -= 1
            return original(*args)  # type: ignore[arg-type]

        setattr(srv, "_completion_body", done)  # noqa: B010 - counts each answer sent
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings):
            collection = f"teach-batch-{uuid.uuid4().hex[:8]}"
            inp = _inp(
                settings,
                collection,
                divide_tasks(12),
                source="teacher",
                model="local",
                window=3,
                batch=4,
                max_steps=1,
            )
            result, types = await _collect(client, settings, inp)
        asked = len(srv.chat_requests)

    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.failed_episodes) == (12, 12, 12, 0)
    assert asked == 12
    assert 1 <= most <= 3, most
    rows = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    assert sorted(r.step_key for r in rows) == sorted(f"swap-{i}#1" for i in range(12))
    assert all(r.verified and r.model == "local" for r in rows)
    assert types.count("EVENT_TYPE_ACTIVITY_TASK_COMPLETED") == 1 + 3  # window, 3 batches


async def test_grouped_runs_share_a_jail_run_and_answer_each_file() -> None:
    """Three steps with one action and one without a match: one shared run for the action,
    one for the re-parse, each step its own text, diff and parse errors."""
    jail = GroupedRuns(None, None)
    swap = AstGrepAction(pattern="divide($A, $B)", rewrite="divide($B, $A)", language="python")
    texts = ["d = divide(1, 2)\n", "e = divide(x, y)\n", "nothing = 0\n"]
    applied = await asyncio.gather(*(jail.apply(swap, "div.py", t) for t in texts))
    assert jail.runs == 1
    assert [a.changed_files for a in applied] == [
        {"div.py": "d = divide(2, 1)\n"},
        {"div.py": "e = divide(y, x)\n"},
        {},
    ]
    assert all(a.ok for a in applied)
    assert "+d = divide(2, 1)" in applied[0].diff and "divide(y, x)" not in applied[0].diff
    assert applied[2].diff == ""
    checks = await asyncio.gather(
        jail.parses("div.py", "d = divide(2, 1)\n", "python"),
        jail.parses("div.py", "d = divide(2,\n", "python"),
    )
    assert jail.runs == 2
    assert checks[0].ok and checks[0].errors == {"div.py": []}
    assert checks[1].ok and checks[1].errors["div.py"]  # its own file's error only
    spans = await asyncio.gather(*(jail.spans(swap, "div.py", t) for t in texts[:2]))
    assert jail.runs == 3
    assert [s.spans["div.py"] for s in spans] == [[(4, 16)], [(4, 16)]]


async def test_grouped_runs_fall_back_to_one_run_each_when_the_shared_run_fails() -> None:
    """A shared run that fails (here: a language ast-grep does not know) is run again per
    call, so each step gets its own run's error."""
    jail = GroupedRuns(None, None)
    bad = AstGrepAction(pattern="divide($A, $B)", rewrite="x", language="no-such-language")
    results = await asyncio.gather(
        *(jail.apply(bad, "div.py", t) for t in ("a = 1\n", "b = divide(1, 2)\n"))
    )
    assert jail.runs == 3  # the shared run, then one each
    assert not any(r.ok for r in results)
    assert all(r.error and "no-such-language" in r.error for r in results), results
