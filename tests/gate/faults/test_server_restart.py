"""Restart the Temporal dev server on the same SQLite file: a pending gate survives.

The server is killed with SIGKILL (a crash: WAL with ``synchronous=normal`` must keep
every committed event) or stopped with SIGTERM (a clean stop), then started again on the
same file and port. A new client and a new worker that keeps no cache find the gate
pending with its original ``opened_at`` and can decide it.
"""

from __future__ import annotations

import signal
import uuid

import pytest

from client.temporal import connect
from keel.gates import GateDecision, GateRequest, GateState, GateStatus
from services.processes import TemporalDevServer, free_port, pid_alive
from tests.support.faults import audit_rows, fault_settings, wait_until
from tests.support.history import local_activity_names
from workers.main import build_worker
from workflows.gate import ApprovalGate


@pytest.mark.parametrize("how", ["sigkill", "sigterm"])
async def test_pending_gate_survives_server_restart(tmp_path, spawned, how: str) -> None:
    db_file, port = tmp_path / "temporal.db", free_port()

    first = TemporalDevServer(
        db_file=db_file, log_path=tmp_path / "temporal-1.log", port=port, ui_port=None
    )
    spawned.append(first)
    first.start()
    settings = fault_settings(tmp_path / "keel", first.address)
    client = await connect(settings)

    handle = await client.start_workflow(
        ApprovalGate.run,
        GateRequest(name="release", requester="alice", approvers=["bob"], subject="v4"),
        id=f"fault/{uuid.uuid4()}/gate/release",
        task_queue=settings.task_queue,
    )
    async with build_worker(client, settings):
        # Settled: the first task (the "opened" row and the webhook-target answer, both
        # local activities) is in history, so nothing is in flight when the server goes down.
        async def settled() -> bool:
            done = await local_activity_names(handle)
            return sorted(done) == ["notify.has_target", "records.gate_event"]

        await wait_until(settled, timeout_s=60, what="the gate's first task")
        before = await handle.query(ApprovalGate.state)
    assert before.status == GateStatus.PENDING

    assert first.process is not None
    old_pid = first.process.pid
    if how == "sigkill":
        first.kill()
        assert first.process.proc is not None
        assert first.process.proc.returncode == -signal.SIGKILL
    else:
        first.stop()
    assert not pid_alive(old_pid)

    second = TemporalDevServer(
        db_file=db_file, log_path=tmp_path / "temporal-2.log", port=port, ui_port=None
    )
    spawned.append(second)
    second.start()
    client = await connect(settings, address=second.address)
    gate = client.get_workflow_handle(handle.id, result_type=GateState)

    async with build_worker(client, settings, max_cached_workflows=0):
        after = await gate.query(ApprovalGate.state)
        assert after.status == GateStatus.PENDING
        assert after.opened_at == before.opened_at
        assert after.expires_at == before.expires_at
        state = await gate.execute_update(
            ApprovalGate.decide,
            GateDecision(decision="approve", actor="bob", comment="after restart", request_id="r1"),
        )
        assert state.status == GateStatus.APPROVED
        result = await gate.result()

    assert (result.status, result.decided_by, result.opened_at) == (
        GateStatus.APPROVED,
        "bob",
        before.opened_at,
    )
    assert [r.event for r in audit_rows(settings, handle.id)] == ["opened", "approved"]
    second.stop()
    assert second.process is not None and not pid_alive(second.process.pid)
