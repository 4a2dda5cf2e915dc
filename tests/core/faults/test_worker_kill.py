"""kill -9 the worker process while a gate waits; a new worker replays the gate to the end.

The killed worker runs as its own process (``python -m cli.keel worker``) in its own
process group. The new worker keeps no cache (``max_cached_workflows=0``), so every
workflow task it runs replays the history from the start.

Both tests wait out Temporal's own crash detection: the dead worker's sticky queue
(10 s schedule-to-start before the task moves to the normal queue) and, mid-activity,
the record activity's start-to-close timeout (30 s) before its retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState
from temporalio.client import Client, WorkflowHandle

from keel.gates import GateDecision, GateRequest, GateStatus
from keel.records import GateAuditEvent
from keel.settings import Settings
from services.processes import LOOPBACK
from tests.support.faults import (
    GATE_EVENT_ACTIVITY,
    activity_events,
    audit_rows,
    sigkill,
    spawn_ready_worker,
    spawn_worker,
    wait_until,
)
from tests.support.history import local_activity_names
from workers.main import build_worker
from workflows.gate import ApprovalGate

pytestmark = pytest.mark.slow  # 15-20 s and 40-50 s: Temporal's timeouts, not our work


async def start_gate(client: Client, settings: Settings) -> WorkflowHandle:
    return await client.start_workflow(
        ApprovalGate.run,
        GateRequest(name="deploy", requester="alice", approvers=["bob"], subject="ship v3"),
        id=f"fault/{uuid.uuid4()}/gate/deploy",
        task_queue=settings.task_queue,
    )


async def approve_and_check(client: Client, settings: Settings, handle: WorkflowHandle) -> None:
    """Approve with a cache-less worker; each audit row exists once, keyed by run and sequence."""
    async with build_worker(client, settings, max_cached_workflows=0):
        state = await handle.execute_update(
            ApprovalGate.decide,
            GateDecision(
                decision="approve", actor="bob", comment="after the crash", request_id="r1"
            ),
        )
        assert state.status == GateStatus.APPROVED
        result = await handle.result()
    assert (result.status, result.decided_by, result.decision_comment) == (
        GateStatus.APPROVED,
        "bob",
        "after the crash",
    )
    run_id = (await handle.describe()).run_id
    assert [(r.event, r.event_key) for r in audit_rows(settings, handle.id)] == [
        ("opened", f"{run_id}:1"),
        ("approved", f"{run_id}:2"),
    ]
    # Replay scheduled nothing twice: the "opened" record is one activity, completed once
    # (a retry after the crash is another attempt of the same activity); the decision's
    # record is one more, scheduled right after the Update was answered.
    scheduled = await activity_events(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    completed = await activity_events(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED)
    assert scheduled.count(GATE_EVENT_ACTIVITY) == 2
    assert completed.count(GATE_EVENT_ACTIVITY) == 2
    assert await local_activity_names(handle) == []


async def test_worker_sigkill_while_gate_waits(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    worker = spawn_worker(settings, tmp_path / "worker.log", spawned)
    handle = await start_gate(client, settings)
    await wait_until(
        lambda: (
            not worker.running() or [e.event for e in audit_rows(settings, handle.id)] == ["opened"]
        ),
        timeout_s=120,
        what="the worker process to write the gate's 'opened' row",
    )
    assert worker.running(), f"worker exited early:\n{(tmp_path / 'worker.log').read_text()}"

    sigkill(worker)  # no clean shutdown: the gate stays on the dead worker's sticky queue
    await approve_and_check(client, settings, handle)


class CuttableProxy:
    """A loopback TCP proxy to the Temporal server whose connections can all be cut at once.

    Cutting it partitions one worker from the server while the worker goes on running, so
    an activity can finish its side effect without the server ever hearing of it.
    """

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._transports: list[asyncio.BaseTransport] = []

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, LOOPBACK, 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"{LOOPBACK}:{port}"

    def cut(self) -> None:
        assert self._server is not None
        self._server.close()  # refuse reconnects
        for transport in self._transports:
            transport.abort()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None or not self._server.is_serving():
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._transports += [writer.transport, up_writer.transport]
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


async def test_worker_sigkill_after_side_effect_before_completion(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    """The hard case: the 'opened' row is written, the server never hears, the worker dies.

    Made deterministic with two levers the test holds: the SQLite write lock (the record
    activity blocks inside its insert) and a proxy between worker and server (cut before
    the insert may proceed). The retry after start-to-close must find the row and write
    nothing, so the audit trail still holds one 'opened' row.
    """
    proxy = CuttableProxy(settings.resolved_temporal_address)
    worker_log = tmp_path / "worker.log"
    worker = await spawn_ready_worker(
        settings, worker_log, spawned, temporal_address=await proxy.start()
    )

    db_file = settings.resolved_database_url.removeprefix("sqlite:///")
    lock = sqlite3.connect(db_file, isolation_level=None, timeout=10)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the worker's insert now waits (busy timeout 10 s)
        handle = await start_gate(client, settings)

        async def record_in_flight() -> bool:
            pending = (await handle.describe()).raw_description.pending_activities
            return any(
                p.activity_type.name == GATE_EVENT_ACTIVITY
                and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                for p in pending
            )

        await wait_until(record_in_flight, timeout_s=60, what="the 'opened' record to start")
        proxy.cut()
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    await wait_until(
        lambda: [e.event for e in audit_rows(settings, handle.id)] == ["opened"],
        timeout_s=30,
        what="the partitioned worker to write the 'opened' row",
    )
    sigkill(worker)
    # The side effect happened, yet the server still waits for attempt 1 to report.
    pending = (await handle.describe()).raw_description.pending_activities
    assert [(p.activity_type.name, p.attempt) for p in pending] == [(GATE_EVENT_ACTIVITY, 1)]

    await approve_and_check(client, settings, handle)

    # Attempt 2 ran after the crash and found the row already there (returned False).
    records: dict[int, str] = {}  # scheduled event id -> the row's event
    attempts: dict[int, int] = {}
    outcomes: dict[str, tuple[int, bool]] = {}
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == GATE_EVENT_ACTIVITY:
                (row,) = await client.data_converter.decode(
                    scheduled.input.payloads, [GateAuditEvent]
                )
                records[event.event_id] = row.event
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            started = event.activity_task_started_event_attributes
            attempts[started.scheduled_event_id] = started.attempt
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            done = event.activity_task_completed_event_attributes
            if done.scheduled_event_id in records:
                (written,) = await client.data_converter.decode(done.result.payloads, [bool])
                outcomes[records[done.scheduled_event_id]] = (
                    attempts[done.scheduled_event_id],
                    written,
                )
    # opened: retried after the kill, a no-op; approved: written once, after the answer
    # (rows are written side by side since gate-audit-rows-at-once: either may end first).
    assert outcomes == {"opened": (2, False), "approved": (1, True)}
    assert await local_activity_names(handle) == []


async def test_worker_sigkill_after_the_answer_before_the_audit_row(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    """A decision is answered before its audit row is written (``gate-audit-after-answer``).

    The worker is killed in that window: the Update has come back, the row is not in SQL
    (its insert waits on the SQLite write lock the test holds). A new worker must write
    the row once, and the gate must end approved with nothing decided twice.
    """
    worker = await spawn_ready_worker(settings, tmp_path / "worker.log", spawned)
    handle = await start_gate(client, settings)
    await wait_until(
        lambda: [e.event for e in audit_rows(settings, handle.id)] == ["opened"],
        timeout_s=60,
        what="the 'opened' row",
    )

    db_file = settings.resolved_database_url.removeprefix("sqlite:///")
    lock = sqlite3.connect(db_file, isolation_level=None, timeout=10)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the audit insert now waits
        state = await handle.execute_update(
            ApprovalGate.decide,
            GateDecision(decision="approve", actor="bob", comment="ship", request_id="r1"),
        )
        # The answer came back while the row could not be written.
        assert state.status == GateStatus.APPROVED
        assert audit_events_on(lock, handle.id) == ["opened"]

        async def approved_row_in_flight() -> bool:
            pending = (await handle.describe()).raw_description.pending_activities
            return any(
                p.activity_type.name == GATE_EVENT_ACTIVITY
                and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                for p in pending
            )

        await wait_until(approved_row_in_flight, timeout_s=60, what="the 'approved' row to start")
        sigkill(worker)
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    async with build_worker(client, settings, max_cached_workflows=0):
        result = await handle.result()
    assert (result.status, result.decided_by) == (GateStatus.APPROVED, "bob")
    run_id = (await handle.describe()).run_id
    assert [(r.event, r.event_key) for r in audit_rows(settings, handle.id)] == [
        ("opened", f"{run_id}:1"),
        ("approved", f"{run_id}:2"),
    ]


def audit_events_on(conn: sqlite3.Connection, gate_id: str) -> list[str]:
    """The gate's audit events, read on the connection that holds the write lock."""
    rows = conn.execute(
        "SELECT event FROM gate_audit WHERE gate_id = ? ORDER BY at", (gate_id,)
    ).fetchall()
    return [event for (event,) in rows]
