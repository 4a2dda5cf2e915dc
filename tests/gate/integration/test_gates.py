"""ApprovalGate against the real dev server: decisions, refusals, signals, reminders, audit."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from client.gate import decide
from client.gate import start_gate as start_gate_with_client
from keel.gates import GateComment, GateDecision, GateRequest, GateState, GateStatus
from keel.settings import Settings
from keel.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from services.processes import find_binary
from store.db import make_engine, make_sessionmaker
from store.records import list_gate_events
from tests.support.webhook_receiver import WebhookReceiver
from workers.main import build_worker
from workflows.gate import ApprovalGate


def audit_events(settings: Settings, gate_id: str) -> list[str]:
    sessions = make_sessionmaker(make_engine(settings.resolved_database_url))
    return [e.event for e in list_gate_events(sessions, gate_id)]


async def start_gate(client: Client, settings: Settings, **kw: object):
    req = GateRequest(name="deploy", requester="alice", approvers=["bob"], **kw)  # type: ignore[arg-type]
    return await client.start_workflow(
        ApprovalGate.run,
        req,
        id=f"test/{uuid.uuid4()}/gate/deploy",
        task_queue=settings.task_queue,
    )


async def refusal(handle, decision: GateDecision) -> str:
    with pytest.raises(WorkflowUpdateFailedError) as info:
        await handle.execute_update(ApprovalGate.decide, decision)
    assert isinstance(info.value.cause, ApplicationError)
    return info.value.cause.type or ""


async def test_approve_by_update(client, settings, worker):
    handle = await start_gate(client, settings, subject="ship v2")
    state = await handle.execute_update(
        ApprovalGate.decide,
        GateDecision(decision="approve", actor="bob", comment="lgtm", request_id="r1"),
    )
    assert state.status == GateStatus.APPROVED
    result = await handle.result()
    assert isinstance(result, GateState)
    assert (result.status, result.decided_by, result.decision_comment) == (
        GateStatus.APPROVED,
        "bob",
        "lgtm",
    )
    assert audit_events(settings, handle.id) == ["opened", "approved"]


async def test_reject_by_signal(client, settings, worker):
    handle = await start_gate(client, settings)
    await handle.signal(
        ApprovalGate.decide_signal, GateDecision(decision="reject", actor="bob", comment="no")
    )
    result = await handle.result()
    assert result.status == GateStatus.REJECTED
    assert audit_events(settings, handle.id) == ["opened", "rejected"]


async def test_forged_and_duplicate_decisions_refused(client, settings, worker):
    handle = await start_gate(client, settings)
    assert await refusal(handle, GateDecision(decision="approve", actor="alice")) == "self_approval"
    assert await refusal(handle, GateDecision(decision="approve", actor="mallory")) == (
        "not_an_approver"
    )
    # A forged signal cannot decide either; it is kept as a refusal.
    await handle.signal(ApprovalGate.decide_signal, GateDecision(decision="approve", actor="eve"))
    state = await handle.query(ApprovalGate.state)
    assert state.status == GateStatus.PENDING
    assert [(r.actor, r.reason) for r in state.refused] == [("eve", "not_an_approver")]

    ok = GateDecision(decision="approve", actor="bob", request_id="req-1")
    # The same request sent twice at once (a client retry; client.gate.decide sends it
    # under one Update id): applied once, the same answer; and again once the gate closed
    # (in the task that answered), still the same answer.
    first, again = await asyncio.gather(
        decide(client, handle.id, ok), decide(client, handle.id, ok)
    )
    assert first == again
    assert first.status == GateStatus.APPROVED
    await handle.result()
    assert await decide(client, handle.id, ok) == first
    # The gate is closed: the server itself refuses any further decision.
    with pytest.raises(RPCError, match="already completed"):
        await handle.execute_update(
            ApprovalGate.decide, GateDecision(decision="reject", actor="bob", request_id="r2")
        )
    assert audit_events(settings, handle.id) == ["opened", "refused", "approved"]


async def test_comments_and_state_query(client, settings, worker):
    handle = await start_gate(client, settings)
    state = await handle.execute_update(
        ApprovalGate.comment, GateComment(actor="carol", comment="what about rollback?")
    )
    assert [c.comment for c in state.comments] == ["what about rollback?"]
    await handle.execute_update(ApprovalGate.decide, GateDecision(decision="approve", actor="bob"))
    result = await handle.result()
    assert result.comments[0].actor == "carol"
    assert audit_events(settings, handle.id) == ["opened", "comment", "approved"]


async def test_pending_gates_listed_by_search_attribute(client, settings, worker):
    handle = await start_gate(client, settings)
    query = f'KeelGateStatus = "pending" AND WorkflowId = "{handle.id}"'
    for _ in range(100):
        found = [wf.id async for wf in client.list_workflows(query)]
        if found:
            break
        await asyncio.sleep(0.1)
    assert found == [handle.id]
    await handle.signal(ApprovalGate.decide_signal, GateDecision(decision="approve", actor="bob"))
    await handle.result()


async def test_reminders_and_notices_are_signed_webhooks(client, settings):
    secret = settings.webhook_secret.get_secret_value()
    with WebhookReceiver(statuses=[503]) as receiver:  # first delivery fails: retried
        allowed = settings.model_copy(update={"webhook_allowed_prefixes": [receiver.url]})
        async with build_worker(client, allowed):
            handle = await start_gate(
                client, settings, webhook_url=receiver.url, remind_every_s=1.0, max_reminders=2
            )
            for _ in range(200):
                if receiver.events().count("gate.reminder") >= 2:
                    break
                await asyncio.sleep(0.05)
            await handle.signal(
                ApprovalGate.decide_signal, GateDecision(decision="approve", actor="bob")
            )
            result = await handle.result()
            for _ in range(100):
                if "gate.decided" in receiver.events():
                    break
                await asyncio.sleep(0.05)
    assert result.reminders_sent == 2
    events = receiver.events()
    assert events.count("gate.waiting") == 2  # the 503 and its retry
    assert events.count("gate.reminder") == 2 and "gate.decided" in events
    for d in receiver.deliveries:
        ts = int(d.headers[TIMESTAMP_HEADER])
        assert verify(secret, ts, d.body, d.headers[SIGNATURE_HEADER], now=time.time())
        assert not verify("wrong-secret", ts, d.body, d.headers[SIGNATURE_HEADER], now=time.time())
    assert audit_events(settings, handle.id).count("reminder") == 2


async def test_temporal_cli_start_and_signal_with_plain_json(client, settings, worker):
    wid = f"cli/{uuid.uuid4()}/gate/release"
    temporal = find_binary("temporal")
    addr = ["--address", settings.resolved_temporal_address]
    payload = {"name": "release", "requester": "alice", "approvers": ["bob"], "subject": "v1"}
    subprocess.run(
        [temporal, "workflow", "start", "--type", "ApprovalGate", "--task-queue",
         settings.task_queue, "--workflow-id", wid, "--input", json.dumps(payload), *addr],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    decision = {"decision": "approve", "actor": "bob", "comment": "from the CLI"}
    subprocess.run(
        [temporal, "workflow", "signal", "--workflow-id", wid, "--name", "decide_signal",
         "--input", json.dumps(decision), *addr],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    result = await client.get_workflow_handle(wid, result_type=GateState).result()
    assert result.status == GateStatus.APPROVED and result.decision_comment == "from the CLI"


async def test_a_new_gate_asks_one_patch_and_leaves_its_expiry_timer(client, settings, worker):
    """Patch ``gate-one-marker``: a gate started through ``client.gate.start_gate`` records
    one patch marker (not one per earlier gate patch, each with its own upsert), sets no
    search attribute it was started with, and its decision does not cancel the expiry
    timer: the task that answers it holds the Update, the row's marker, the status and the
    run's completion only."""
    handle = await start_gate_with_client(
        client,
        GateRequest(name="deploy", requester="alice", approvers=["bob"]),
        gate_id=f"test/{uuid.uuid4()}/gate/deploy",
        task_queue=settings.task_queue,
    )

    async def first_task_done() -> bool:
        history = (await handle.fetch_history()).events
        return any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history)

    # Decide after the gate's first task, as a person would: under load an Update sent at
    # once can reach the worker with the start, and both are answered in one task.
    deadline = asyncio.get_running_loop().time() + 30
    while not await first_task_done():
        assert asyncio.get_running_loop().time() < deadline, "the gate's first task"
        await asyncio.sleep(0.05)
    await handle.execute_update(ApprovalGate.decide, GateDecision(decision="approve", actor="bob"))
    assert (await handle.result()).status == GateStatus.APPROVED
    events = (await handle.fetch_history()).events
    patches = [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert len(patches) == 1 and b"gate-one-marker" in patches[0]
    types = [e.event_type for e in events]
    # The patch's own TemporalChangeVersion upsert, and the status at the close.
    assert types.count(EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES) == 2
    assert EventType.EVENT_TYPE_TIMER_CANCELED not in types
    last_task = max(
        i for i, t in enumerate(types) if t == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    assert types[last_task + 1 :] == [
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
    ]
    assert audit_events(settings, handle.id) == ["opened", "approved"]
