"""kill -9 the worker in the middle of a batched collection (``batch`` > 0,
keel/srl/batch.py): no finished episode is lost, none is recorded twice, and none is asked
of the model again.

Six one-step tasks, window 3, batches of 3 (both batches in flight at once). The model
answers the first three requests at once and holds the next three; once the three
answered steps are rows in SQL and three requests are held, the worker dies. A second
worker picks both batches up after the heartbeat timeout: a batch that had ended keeps its
result, and a retried one finds its recorded steps (no model call) and asks again only
for the steps the dead worker had not recorded.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.steps import CollectionInput
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.support.faults import sigkill, spawn_ready_worker, wait_until
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl
from workers.main import build_worker

pytestmark = pytest.mark.slow  # waits out the dead worker's heartbeat timeout


async def test_worker_killed_mid_batch_loses_no_finished_episode(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    held = threading.Event()
    with ScriptedOpenAIServer(default=ScriptedReply(content=SWAP_ANSWER)) as llm:
        llm.enqueue(*[ScriptedReply(content=SWAP_ANSWER)] * 3)
        llm.enqueue(*[ScriptedReply(content=SWAP_ANSWER, hold=held)] * 3)
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        settings = settings.model_copy(update={"models_config": tmp_path / "models.yaml"})
        worker = await spawn_ready_worker(settings, tmp_path / "worker.log", spawned)
        collection = f"kill-batch-{uuid.uuid4().hex[:8]}"
        digest, count = upload_tasks(
            artifact_store_from_settings(settings), tasks_jsonl(divide_tasks(6))
        )
        inp = CollectionInput(
            collection=collection, tasks_digest=digest, task_count=count,
            source="teacher", model="local", window=3, batch=3, max_steps=1,
        )  # fmt: skip
        sessions = get_sessionmaker(settings.resolved_database_url)
        try:
            handle = await start_collection(client, inp, task_queue=settings.task_queue)

            async def three_recorded_three_held() -> bool:
                return len(list_steps(sessions, collection)) == 3 and llm.holding == 3

            await wait_until(
                three_recorded_three_held, timeout_s=60, what="3 steps recorded, 3 calls held"
            )
            before = {r.step_key: r.record_json for r in list_steps(sessions, collection)}
            await sigkill(worker)
        finally:
            held.set()  # the held calls answer a dead worker (or none)

        async with build_worker(client, settings, max_cached_workflows=0):
            result = await handle.result()
        asked = len(llm.chat_requests)

    t = result.totals
    assert (t.episodes, t.steps, t.verified_steps, t.failed_episodes) == (6, 6, 6, 0)
    rows = {r.step_key: r.record_json for r in list_steps(sessions, collection)}
    assert sorted(rows) == sorted(f"swap-{i}#1" for i in range(6))  # each step once
    # The steps recorded before the kill are the same rows, never asked again: the model
    # answered 6 steps and was asked again only for the 3 the dead worker held.
    assert all(rows[key] == record for key, record in before.items())
    assert asked == 9, asked
    assert t.reused_steps <= 3
