"""kill -9 the worker process while a gate waits; a new worker replays the gate to the end.

The killed worker runs as its own process (``python -m cli.keel worker``) in its own
process group. The new worker keeps no cache (``max_cached_workflows=0``), so every
workflow task it runs replays the history from the start.

The tests wait out Temporal's own crash detection: the dead worker's sticky queue
(10 s schedule-to-start before the task moves to the normal queue), mid-activity the
record activity's start-to-close timeout (30 s) before its retry, and mid-task the
workflow task's own timeout (10 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingWorkflowTaskState
from temporalio.client import Client, WorkflowHandle

from keel.gates import GateDecision, GateRequest, GateState, GateStatus
from keel.refs import NOTIFY_HAS_TARGET
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
from tests.support.history import local_activity_names, local_activity_results
from workers.main import build_worker
from workflows.gate import ApprovalGate

TASK_IN_TRANSIT_S = 3.0

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
    # Replay ran nothing twice: the "opened" row and the webhook-target answer are local
    # activities of the first task (one marker each, patch gate-open-local); the
    # decision's row is one of the task that answered it (patch gate-handler-rows-local);
    # no activity at all, and no notice, since no webhook is configured.
    scheduled = await activity_events(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED)
    assert scheduled == []
    assert sorted(await local_activity_names(handle)) == [
        NOTIFY_HAS_TARGET.name,
        GATE_EVENT_ACTIVITY,
        GATE_EVENT_ACTIVITY,
    ]


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

    await sigkill(worker)  # no clean shutdown: the gate stays on the dead worker's sticky queue
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

    The row is a local activity of the gate's first workflow task (patch
    ``gate-open-local``), so the server hears of it only when that task completes. Made
    deterministic with two levers the test holds: the SQLite write lock (the row's insert
    blocks) and a proxy between worker and server (cut before the insert may proceed).
    After the task's timeout a new worker runs the first task again; its local activity
    must find the row and write nothing, so the audit trail still holds one 'opened' row.
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

        async def first_task_started() -> bool:
            task = (await handle.describe()).raw_description.pending_workflow_task
            return task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED

        await wait_until(first_task_started, timeout_s=60, what="the gate's first task to start")
        # STARTED is set when the server hands the task out, before the proxy has carried
        # it to the worker: give it time to arrive and reach the blocked insert (which
        # waits up to 10 s) before cutting.
        await asyncio.sleep(TASK_IN_TRANSIT_S)
        proxy.cut()
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    await wait_until(
        lambda: [e.event for e in audit_rows(settings, handle.id)] == ["opened"],
        timeout_s=30,
        what="the partitioned worker to write the 'opened' row",
    )
    await sigkill(worker)
    # The side effect happened, yet the server never heard: no marker, the task still open.
    assert await local_activity_names(handle) == []

    await approve_and_check(client, settings, handle)

    # The first task ran again after the crash: its local activity found the row already
    # there (returned False); the history holds that one answer, and the decision's row,
    # written once (True), in whichever order the two finished when the decision came with
    # that task.
    results = await local_activity_results(handle)
    assert sorted(r for r in results if r[0] == GATE_EVENT_ACTIVITY) == [
        (GATE_EVENT_ACTIVITY, False),
        (GATE_EVENT_ACTIVITY, True),
    ]


async def test_worker_sigkill_while_the_decision_row_waits(
    client: Client, settings: Settings, tmp_path: Path, spawned
) -> None:
    """A decision is answered once its audit row is written, in the same workflow task
    (``gate-handler-rows-local``).

    The worker is killed while that row waits (its insert waits on the SQLite write lock
    the test holds): the caller has no answer yet and the row is not in SQL. A new worker
    must answer the same Update, write the row once, and end the gate approved with
    nothing decided twice.
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
    answer: asyncio.Task[object] | None = None
    try:
        lock.execute("BEGIN IMMEDIATE")  # the audit insert now waits
        answer = asyncio.create_task(
            handle.execute_update(
                ApprovalGate.decide,
                GateDecision(decision="approve", actor="bob", comment="ship", request_id="r1"),
            )
        )

        async def decision_task_started() -> bool:
            task = (await handle.describe()).raw_description.pending_workflow_task
            return task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED

        await wait_until(decision_task_started, timeout_s=60, what="the decision's task")
        await asyncio.sleep(TASK_IN_TRANSIT_S)  # for the task to reach the blocked insert
        assert not answer.done(), "the decision was answered before its row was written"
        assert audit_events_on(lock, handle.id) == ["opened"]
        await sigkill(worker)
    finally:
        lock.execute("ROLLBACK")
        lock.close()

    assert answer is not None
    async with build_worker(client, settings, max_cached_workflows=0):
        state = await asyncio.wait_for(answer, timeout=120)
        result = await handle.result()
    assert isinstance(state, GateState) and state.status == GateStatus.APPROVED
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
