"""kill -9 the worker inside ``design.codegen`` after the model answered: the run resumes
on another worker and the model is not asked a second time.

The pipeline runs with ``codegen="litellm"`` against the scripted OpenAI server, whose
answer is a small, valid repository. The kill is made deterministic with the SQLite write
lock (as in tests/srl/faults/test_worker_kill.py): while the test holds it, the codegen
activity's ``agent_runs`` write, its last step after the answer was recorded under the
node key, waits. The test waits for that record (the reference file next to the
artifacts) while the activity is still running, and then kills the worker. A second
worker takes the activity over after its heartbeat timeout, finds the recorded answer
and the run completes; the scripted server saw one request in all.

The lock also holds up the gateway's ``llm_calls`` row of the model call, which gives up
after SQLite's busy timeout (10 s) and is only logged; the ``agent_runs`` write waits as
long, so the test has that long to see the record (it polls every 50 ms).
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client

from activities.design.pipeline import CODEGEN_REFS_DIR
from client.design import start_design
from keel.design import steps
from keel.design.steps import DesignInput, DesignResult
from keel.settings import Settings
from store.db import get_sessionmaker
from store.models import AgentRunRow
from tests.design.unit.design_data import golden_cases
from tests.support.design_repo import MODEL_FILES
from tests.support.faults import sigkill, spawn_ready_worker, wait_until
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

pytestmark = pytest.mark.slow  # waits out the dead worker's heartbeat timeout


def recorded_refs(settings: Settings) -> list[Path]:
    root = settings.artifacts_dir / CODEGEN_REFS_DIR
    return [p for p in root.glob("*/*") if p.is_file() and not p.name.startswith(".")]


async def test_worker_killed_after_the_codegen_answer_does_not_ask_the_model_again(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    reply = ScriptedReply(content=json.dumps({"files": MODEL_FILES}))
    with ScriptedOpenAIServer(default=reply) as llm:
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        settings = settings.model_copy(update={"models_config": tmp_path / "models.yaml"})
        worker = await spawn_ready_worker(settings, tmp_path / "worker.log", spawned)
        inp = DesignInput(
            project=f"p-{uuid.uuid4().hex[:8]}",
            decision_set="ds1",
            requester="alice",
            intake=golden_cases()["batch_training"]["constraints"],
            require_approval=False,
            codegen="litellm",
            codegen_model="local",
        )

        db_file = settings.resolved_database_url.removeprefix("sqlite:///")
        lock = sqlite3.connect(db_file, isolation_level=None, timeout=10)
        try:
            lock.execute("BEGIN IMMEDIATE")  # the codegen's agent_runs write now waits
            handle = await start_design(client, inp, task_queue=settings.task_queue)

            async def answer_recorded_inside_codegen() -> bool:
                if not recorded_refs(settings):
                    return False
                desc = await handle.describe()
                return any(
                    p.activity_type.name == steps.CODEGEN.name
                    and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                    for p in desc.raw_description.pending_activities
                )

            await wait_until(
                answer_recorded_inside_codegen,
                timeout_s=120,
                what="the codegen answer recorded while design.codegen runs",
            )
            assert len(llm.chat_requests) == 1
            await sigkill(worker)
        finally:
            lock.execute("ROLLBACK")
            lock.close()

        sessions = get_sessionmaker(settings.resolved_database_url)
        with sessions() as s:  # the killed attempt wrote no agent_runs row
            assert list(s.scalars(select(AgentRunRow))) == []

        async with build_worker(client, settings, max_cached_workflows=0):
            result: DesignResult = await handle.result()
        assert len(llm.chat_requests) == 1  # the second attempt took the recorded answer

    assert result.status == "completed"
    assert result.file_count == len(MODEL_FILES)
    starts = []
    scheduled: dict[int, str] = {}
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = e.activity_task_started_event_attributes
            starts.append((scheduled[a.scheduled_event_id], a.attempt))
    assert (steps.CODEGEN.name, 2) in starts  # the killed attempt was retried
    with sessions() as s:
        row = s.scalars(select(AgentRunRow).where(AgentRunRow.agent == "codegen")).one()
    assert (row.provider, row.model) == ("litellm", "local")
    assert row.output_json["reused_answer"] is True
