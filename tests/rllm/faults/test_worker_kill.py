"""kill -9 the worker after the model answered and before the run's stats row is written.

Since patch ``rllm-local-load-and-stats`` the stats record is a local activity: it runs
inside the workflow task that follows the model's answer, and the answer itself is in the
history as the completed ``rllm.generate``. A worker killed in between must cost neither a
second model call (the answer replays from history) nor a second stats row (the insert is
idempotent by ``run_key``).

Made deterministic with the SQLite write lock: while the test holds it, the local activity
blocks inside its insert, so the worker is known to be between the two.
"""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from keel.rllm.run import RllmRunInput, RllmRunResult
from keel.settings import Settings
from store.db import get_sessionmaker
from store.files import bundle_files
from store.models import RllmRunRow
from tests.support.faults import activity_events, sigkill, spawn_ready_worker, wait_until
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

pytestmark = pytest.mark.slow  # waits out the dead worker's workflow task timeout

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
ANSWER = '{"summary": "Workflows survive crashes.", "sentences": 1}'


async def test_worker_killed_between_model_answer_and_stats_record(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    with ScriptedOpenAIServer(default=ScriptedReply(content=ANSWER)) as llm:
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        settings = settings.model_copy(update={"models_config": tmp_path / "models.yaml"})
        worker = await spawn_ready_worker(settings, tmp_path / "worker.log", spawned)

        db_file = settings.resolved_database_url.removeprefix("sqlite:///")
        lock = sqlite3.connect(db_file, isolation_level=None, timeout=10)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the stats insert now waits for the lock
            handle = await client.start_workflow(
                "RllmApp",
                RllmRunInput(
                    path="summary.rllm",
                    files=bundle_files(EXAMPLES / "summary.rllm"),
                    input={"text": "Workers crash; workflows resume."},
                ),
                id=f"rllm/summary/fault-{uuid.uuid4()}",
                task_queue=settings.task_queue,
                result_type=RllmRunResult,
            )

            async def answered() -> bool:
                done = await activity_events(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
                return "rllm.generate" in done

            await wait_until(answered, timeout_s=60, what="the model's answer in the history")
            assert len(llm.chat_requests) == 1
            await sigkill(worker)
        finally:
            lock.execute("ROLLBACK")
            lock.close()

        # The killed worker never completed the workflow task that records the stats.
        sessions = get_sessionmaker(settings.resolved_database_url)
        with sessions() as s:
            assert s.scalars(select(RllmRunRow).where(RllmRunRow.app == "summary")).all() == []

        async with build_worker(client, settings, max_cached_workflows=0):
            result: RllmRunResult = await handle.result()
        assert result.output == {"summary": "Workflows survive crashes.", "sentences": 1}
        assert len(llm.chat_requests) == 1  # the answer replayed from history: one model call
        with sessions() as s:
            rows = s.scalars(select(RllmRunRow).where(RllmRunRow.app == "summary")).all()
        assert [(r.workflow_id, r.status) for r in rows] == [(handle.id, "ok")]  # one row
