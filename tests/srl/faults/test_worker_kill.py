"""kill -9 the worker in the middle of an SRL step: no step lost, none recorded twice.

The kill lands inside ``srl.apply``, after the teacher answered (the answer is in the
history as the completed ``srl.generate``) and before the step row is written. Made
deterministic with the SQLite write lock: while the test holds it, every step's insert
waits, so the worker is known to be inside the step when it dies. A second worker picks
the steps up after the heartbeat timeout; each step is then one row, and the teacher was
asked once per step (the answers replay from the history).

A retry of ``srl.apply`` after its row was written (the other side of the same promise)
is ``test_apply_retried_after_its_row_is_written_returns_the_stored_step``.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.testing import ActivityEnvironment

from activities.llm import LLMGateway
from activities.srl.episode import SrlActivities
from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.state import State
from keel.srl.steps import ApplyInput, CollectionInput, GenerateInput
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.files import load_models_config
from store.srl_steps import list_steps, record_identity
from tests.support.faults import activity_attempts, sigkill, spawn_ready_worker, wait_until
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl
from workers.main import build_worker

pytestmark = pytest.mark.slow  # waits out the dead worker's heartbeat timeout


async def test_worker_killed_mid_step_loses_no_step_and_records_none_twice(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    with ScriptedOpenAIServer(default=ScriptedReply(content=SWAP_ANSWER)) as llm:
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        settings = settings.model_copy(update={"models_config": tmp_path / "models.yaml"})
        worker = await spawn_ready_worker(settings, tmp_path / "worker.log", spawned)
        collection = f"kill-{uuid.uuid4().hex[:8]}"
        digest, count = upload_tasks(
            artifact_store_from_settings(settings), tasks_jsonl(divide_tasks(3))
        )
        inp = CollectionInput(
            collection=collection, tasks_digest=digest, task_count=count,
            source="teacher", model="local", window=3, max_steps=1,
        )  # fmt: skip

        # srl.window writes the collection's identity before any step: written here first,
        # so the write lock held below stops the steps' inserts only.
        sessions = get_sessionmaker(settings.resolved_database_url)
        record_identity(sessions, inp.identity())
        db_file = settings.resolved_database_url.removeprefix("sqlite:///")
        lock = sqlite3.connect(db_file, isolation_level=None, timeout=10)
        try:
            lock.execute("BEGIN IMMEDIATE")  # every step's insert now waits for the lock
            handle = await start_collection(client, inp, task_queue=settings.task_queue)
            episodes = [client.get_workflow_handle(f"srl/{collection}/swap-{i}") for i in range(3)]

            async def all_inside_apply() -> bool:
                inside = 0
                for ep in episodes:
                    try:
                        desc = await ep.describe()
                    except RPCError:
                        return False  # the episode has not started yet
                    pending = desc.raw_description.pending_activities
                    inside += sum(
                        p.activity_type.name == "srl.apply"
                        and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                        for p in pending
                    )
                return inside == 3

            await wait_until(all_inside_apply, timeout_s=60, what="every episode inside srl.apply")
            assert len(llm.chat_requests) == 3
            await sigkill(worker)
        finally:
            lock.execute("ROLLBACK")
            lock.close()

        assert list_steps(sessions, collection) == []  # the killed worker wrote no step

        async with build_worker(client, settings, max_cached_workflows=0):
            result = await handle.result()
        assert len(llm.chat_requests) == 3  # the answers replayed from history

    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.failed_episodes) == (3, 3, 3, 0)
    rows = list_steps(sessions, collection)
    assert sorted(r.step_key for r in rows) == ["swap-0#1", "swap-1#1", "swap-2#1"]
    assert all(r.verified for r in rows)
    # Each apply ran twice (once on the killed worker), each generate once.
    for ep in episodes:
        attempts = dict(await activity_attempts(ep))
        assert attempts == {"srl.generate": 1, "srl.apply": 2}


async def test_apply_retried_after_its_row_is_written_returns_the_stored_step(
    settings: Settings,
) -> None:
    sessions = get_sessionmaker(settings.resolved_database_url)
    artifacts = artifact_store_from_settings(settings)
    acts = SrlActivities(
        sessions=sessions,
        artifacts=artifacts,
        llm=LLMGateway(load_models_config(settings.models_config)),
        prompts_path=settings.srl_prompts,
    )
    digest = artifacts.put_bytes(tasks_jsonl(divide_tasks(1)))
    env = ActivityEnvironment()
    gen = await env.run(
        acts.generate,
        GenerateInput(
            collection="c", tasks_digest=digest, task_index=0, step=1,
            source="gold_replay", state=State(),
        ),
    )  # fmt: skip
    inp = ApplyInput(
        collection="c", tasks_digest=digest, task_index=0, step=1, source="gold_replay",
        state=gen.state_before, generation=gen,
    )  # fmt: skip
    first = await env.run(acts.apply, inp)
    second = await env.run(acts.apply, inp)  # the same step again: a retry after the write
    assert first.recorded and not second.recorded
    assert first.model_copy(update={"recorded": False}) == second
    rows = list_steps(sessions, "c")
    assert len(rows) == 1 and rows[0].verified
