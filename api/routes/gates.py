"""Approval gates over HTTP: list pending, read one, open, approve, reject, comment.

A caller sees the gates they requested or may decide (``admin``: all). Any other gate id
answers 404, as a missing one does, so ids are not confirmed (``keel/access.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from api.deps import ApproverDep, Caller, CallerDep, ClientDep, RequesterDep, SessionsDep
from api.errors import ERROR_RESPONSES, ApiError
from api.idempotency import IdempotencyKey, idempotent, request_id_for
from client.temporal import describe_or_none, status_name
from keel.access import ACCESS_MEMO, RunAccess, access_for, may_read
from keel.digest import digest_json
from keel.gates import (
    GATE_ID_SEPARATOR,
    GATE_WORKFLOW_TYPE,
    MAX_WAIT_S,
    GateComment,
    GateDecision,
    GateRequest,
    GateState,
    GateStatus,
    gate_workflow_id,
)
from keel.search_attributes import GATE_STATUS_ATTRIBUTE
from workflows.gate import ApprovalGate, start_search_attributes

router = APIRouter(prefix="/gates", tags=["gates"], responses=ERROR_RESPONSES)

GateIdPath = Annotated[str, "gate workflow id, e.g. design/p1/ds3/gate/pre-codegen"]

# A gate answers queries and updates only while a worker runs; past this, 503 not a hang.
GATE_RPC_TIMEOUT = timedelta(seconds=10)

# How many gate histories one list request reads at once.
REQUEST_READS = 16

_REFUSAL_STATUS = {"gate_closed": 409, "self_approval": 403, "not_an_approver": 403}


class GateSummary(BaseModel):
    gate_id: str
    name: str | None
    status: str | None
    started_at: datetime | None
    # From the gate's request (its start event); None for a gate whose input is unreadable.
    parent_id: str | None = Field(
        default=None, description="What the gate belongs to: the id before '/gate/'"
    )
    requester: str | None = None
    subject: str | None = None
    approvers: list[str] | None = Field(
        default=None, description="Who may decide; empty: anyone with the approver role"
    )
    expires_at: datetime | None = Field(
        default=None, description="When a pending gate expires (its start plus expires_in_s)"
    )


class GateList(BaseModel):
    gates: list[GateSummary]


class OpenGateBody(BaseModel):
    """Open a gate. The caller is the requester; ``parent_id`` names what it belongs to."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    parent_id: str | None = Field(default=None, min_length=1, max_length=400)
    subject: str = Field(default="", max_length=2000)
    approvers: list[str] = Field(default_factory=list, max_length=100)
    details: dict[str, Any] = Field(default_factory=dict)
    expires_in_s: float = Field(default=24 * 3600, gt=0, le=MAX_WAIT_S)
    remind_every_s: float | None = Field(default=None, ge=1, le=MAX_WAIT_S)
    # No webhook_url here: notices from API-opened gates go to the worker's configured
    # KEEL_WEBHOOK_URL, so an API caller cannot point the worker at arbitrary hosts.


class DecisionBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field(default="", max_length=10_000)


class CommentBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    comment: str = Field(min_length=1, max_length=10_000)


def _not_found(gate_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no gate {gate_id!r}")


async def _gate_access(client: ClientDep, wf: Any) -> RunAccess | None:
    """Who may see gate ``wf`` (a ``describe()`` or a ``list_workflows`` row): the memo the
    API wrote when it opened the gate, else the gate's own request from its start event
    (gates opened by workflows or ``temporal workflow start`` carry no memo)."""
    try:
        access: RunAccess | None = await wf.memo_value(ACCESS_MEMO, None, type_hint=RunAccess)
    except (ValueError, TypeError):
        access = None
    if access is not None:
        return access
    req = await _gate_request(client, wf)
    return None if req is None else access_for(req.requester, [req.approvers])


async def _gate_request(client: ClientDep, wf: Any) -> GateRequest | None:
    """The request gate ``wf`` was started with (its start event's input), or None."""
    handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            (req,) = await client.data_converter.decode(payloads, [GateRequest])
        except (ValueError, TypeError):
            return None
        return req  # type: ignore[no-any-return]
    return None


async def _gate_handle(  # type: ignore[no-untyped-def]
    client: ClientDep, gate_id: str, caller: Caller
):
    """The handle of gate ``gate_id``; 404 unless it exists, is an ApprovalGate, and the
    caller may see it."""
    if GATE_ID_SEPARATOR not in gate_id:
        raise _not_found(gate_id)
    desc = await describe_or_none(client, gate_id, GATE_WORKFLOW_TYPE)
    if desc is None:
        raise _not_found(gate_id)
    handle = client.get_workflow_handle(gate_id, result_type=GateState)
    if not may_read(await _gate_access(client, desc), caller.actor, caller.roles):
        raise _not_found(gate_id)
    return handle, desc


async def _send_update(handle: Any, gate_id: str, update: Any, arg: Any) -> GateState:
    """Run a gate Update, mapping the gate's refusals and a gate that closed meanwhile."""
    try:
        state: GateState = await handle.execute_update(update, arg, rpc_timeout=GATE_RPC_TIMEOUT)
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type in _REFUSAL_STATUS:
            raise ApiError(_REFUSAL_STATUS[cause.type], cause.type, cause.message) from None
        raise
    except RPCError as err:
        # The gate closed between our check and the update reaching it.
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ApiError(409, "gate_closed", f"gate {gate_id!r} is closed") from None
        raise
    return state


async def _read_state(client: ClientDep, gate_id: str, caller: Caller) -> GateState:
    handle, desc = await _gate_handle(client, gate_id, caller)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        return await handle.query(ApprovalGate.state, rpc_timeout=GATE_RPC_TIMEOUT)
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result()
    raise ApiError(409, "gate_not_running", f"gate {gate_id!r} ended as {status_name(desc)}")


@router.get("", response_model=GateList)
async def list_gates(
    client: ClientDep,
    caller: CallerDep,
    status: GateStatus = GateStatus.PENDING,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> GateList:
    """Gates by status (pending by default), newest first, from Temporal's visibility store:
    those the caller requested or may decide (``admin``: all), each with what it waits on,
    who may decide it and when it expires (the console's approval inbox reads this)."""
    query = f'WorkflowType = "{GATE_WORKFLOW_TYPE}" AND {GATE_STATUS_ATTRIBUTE} = "{status.value}"'
    rows: list[Any] = []
    async for wf in client.list_workflows(query):
        if len(rows) >= limit:
            break
        if may_read(await _gate_access(client, wf), caller.actor, caller.roles):
            rows.append(wf)
    # One history read per row for its request, a few at a time. Measured on the dev
    # server, 30 gates: 22 ms without these reads, 94 ms one after another, 78 ms 16 at once.
    limiter = asyncio.Semaphore(REQUEST_READS)

    async def request_of(wf: Any) -> GateRequest | None:
        async with limiter:
            return await _gate_request(client, wf)

    requests = await asyncio.gather(*(request_of(wf) for wf in rows))
    gates: list[GateSummary] = []
    for wf, req in zip(rows, requests, strict=True):
        parent, _, name = wf.id.rpartition(GATE_ID_SEPARATOR)
        gates.append(
            GateSummary(
                gate_id=wf.id,
                name=name,
                status=status.value,
                started_at=wf.start_time,
                parent_id=parent or None,
                requester=req.requester if req else None,
                subject=req.subject if req else None,
                approvers=req.approvers if req else None,
                expires_at=(
                    wf.start_time + timedelta(seconds=req.expires_in_s)
                    if req and wf.start_time
                    else None
                ),
            )
        )
    return GateList(gates=gates)


@router.post("", status_code=201, response_model=GateState)
async def open_gate(
    request: Request,
    body: OpenGateBody,
    client: ClientDep,
    sessions: SessionsDep,
    caller: RequesterDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Open a standalone gate; its id is ``<parent_id>/gate/<name>``."""

    async def run() -> tuple[int, Any]:
        parent = body.parent_id or (
            f"api/{digest_json([caller.actor, idempotency_key])[7:23]}"
            if idempotency_key
            else f"api/{uuid.uuid4()}"
        )
        gate_id = gate_workflow_id(parent, body.name)
        req = GateRequest(requester=caller.actor, **body.model_dump(exclude={"parent_id"}))
        try:
            handle = await client.start_workflow(
                ApprovalGate.run,
                req,
                id=gate_id,
                task_queue=request.app.state.settings.task_queue,
                memo={ACCESS_MEMO: access_for(caller.actor, [req.approvers])},
                search_attributes=start_search_attributes(req),
            )
        except WorkflowAlreadyStartedError:
            raise ApiError(409, "conflict", f"gate {gate_id!r} already exists") from None
        state = await handle.query(ApprovalGate.state, rpc_timeout=GATE_RPC_TIMEOUT)
        return 201, state.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


@router.get("/{gate_id:path}", response_model=GateState)
async def get_gate(gate_id: str, client: ClientDep, caller: CallerDep) -> GateState:
    """One gate's state, pending or closed; 404 for a gate the caller may not see."""
    return await _read_state(client, gate_id, caller)


async def _decide(
    request: Request,
    gate_id: str,
    decision: str,
    body: DecisionBody,
    client: ClientDep,
    sessions: SessionsDep,
    caller: ApproverDep,
    idempotency_key: str | None,
) -> Any:
    async def run() -> tuple[int, Any]:
        if GATE_ID_SEPARATOR not in gate_id:
            raise _not_found(gate_id)
        # One RPC on the way that succeeds: the Update itself. The gate accepts a decision
        # only from a caller who may see it (a named approver, any approver when it names
        # none, or admin; ApproverDep let no one else through), so the read check that
        # _gate_handle makes would only repeat it. Every refusal and error goes through
        # that check first, so a caller who may not see a gate learns no more than 404.
        handle = client.get_workflow_handle(gate_id, result_type=GateState)
        decision_in = GateDecision(
            decision=decision,  # type: ignore[arg-type]
            actor=caller.actor,
            comment=body.comment,
            request_id=request_id_for(caller, idempotency_key),
        )
        try:
            state = await _send_update(handle, gate_id, ApprovalGate.decide, decision_in)
        except Exception:
            _, desc = await _gate_handle(client, gate_id, caller)
            if desc.status != WorkflowExecutionStatus.RUNNING:
                raise ApiError(409, "gate_closed", f"gate {gate_id!r} is closed") from None
            raise
        return 200, state.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


@router.post("/{gate_id:path}/approve", response_model=GateState)
async def approve_gate(
    request: Request,
    gate_id: str,
    body: DecisionBody,
    client: ClientDep,
    sessions: SessionsDep,
    caller: ApproverDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Approve as the calling approver. 403 for the requester or a non-approver, 409 if closed."""
    return await _decide(
        request, gate_id, "approve", body, client, sessions, caller, idempotency_key
    )


@router.post("/{gate_id:path}/reject", response_model=GateState)
async def reject_gate(
    request: Request,
    gate_id: str,
    body: DecisionBody,
    client: ClientDep,
    sessions: SessionsDep,
    caller: ApproverDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Reject as the calling approver. 403 for the requester or a non-approver, 409 if closed."""
    return await _decide(
        request, gate_id, "reject", body, client, sessions, caller, idempotency_key
    )


@router.post("/{gate_id:path}/comments", response_model=GateState)
async def comment_gate(
    request: Request,
    gate_id: str,
    body: CommentBody,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Comment on a pending gate as the caller."""

    async def run() -> tuple[int, Any]:
        handle, desc = await _gate_handle(client, gate_id, caller)
        if desc.status != WorkflowExecutionStatus.RUNNING:
            raise ApiError(409, "gate_closed", f"gate {gate_id!r} is closed")
        state = await _send_update(
            handle,
            gate_id,
            ApprovalGate.comment,
            GateComment(
                actor=caller.actor,
                comment=body.comment,
                request_id=request_id_for(caller, idempotency_key),
            ),
        )
        return 200, state.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip
