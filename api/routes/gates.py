"""Approval gates over HTTP: list pending, read one, open, approve, reject, comment.

A caller sees the gates they requested or may decide (``admin``: all). Any other gate id
answers 404, as a missing one does, so ids are not confirmed (``keel/access.py``).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client, WorkflowExecutionDescription, WorkflowExecutionStatus

from api.deps import Caller, CallerDep, ClientDep
from api.errors import ERROR_RESPONSES, ApiError, refusal_error
from api.idempotency import request_id_for
from api.routes.shared import ApproverPost, CallerPost, RequesterPost
from client import gate as gates
from client.gate import GateNotFound, GateNotRunning, GateSummary
from client.temporal import BadPageToken, decode_page_token, encode_page_token
from keel.access import may_read, reader_terms
from keel.gates import (
    MAX_WAIT_S,
    GateComment,
    GateDecision,
    GateRefusal,
    GateRequest,
    GateState,
    GateStatus,
    gate_workflow_id,
)
from keel.ids import GATE_NAME_PATTERN

router = APIRouter(prefix="/gates", tags=["gates"], responses=ERROR_RESPONSES)

GateIdPath = Annotated[str, "gate workflow id, e.g. design/p1/ds3/gate/pre-codegen"]


class GateList(BaseModel):
    gates: list[GateSummary]
    next_page_token: str | None = Field(
        default=None,
        description="Pass back as ?page_token= for the next page; None: this was the last",
    )


class OpenGateBody(BaseModel):
    """Open a gate. The caller is the requester; ``parent_id`` names what it belongs to."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=GATE_NAME_PATTERN)
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


async def _visible(client: Client, gate_id: str, caller: Caller) -> WorkflowExecutionDescription:
    """The gate's description; 404 unless it exists, is an ApprovalGate, and the caller
    may see it."""
    try:
        desc = await gates.describe(client, gate_id)
    except GateNotFound:
        raise _not_found(gate_id) from None
    if not may_read(await gates.access_of(client, desc), caller.actor, caller.roles):
        raise _not_found(gate_id)
    return desc


async def _read_state(client: Client, gate_id: str, caller: Caller) -> GateState:
    desc = await _visible(client, gate_id, caller)
    try:
        return await gates.state(client, gate_id, desc)
    except GateNotRunning as err:
        raise ApiError(409, "gate_not_running", str(err)) from None


@router.get("", response_model=GateList)
async def list_gates(
    client: ClientDep,
    caller: CallerDep,
    status: GateStatus = GateStatus.PENDING,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> GateList:
    """Gates by status (pending by default), newest first, a page of at most ``limit``:
    those the caller requested or may decide (``admin``: all), each with what it waits on,
    who may decide it and when it expires (the console's approval inbox reads this).

    One visibility query asks for the caller's gates by their ``KeelReaders`` search
    attribute, so the answer costs the same among ten gates or ten thousand; follow
    ``next_page_token`` for the rest."""
    try:
        page = await gates.list_gates(
            client,
            status,
            limit=limit,
            readers=reader_terms(caller.actor, caller.roles),
            page_token=decode_page_token(page_token),
            visible=lambda access: may_read(access, caller.actor, caller.roles),
        )
    except BadPageToken as err:
        raise ApiError(422, "validation_failed", str(err)) from None
    return GateList(gates=page.gates, next_page_token=encode_page_token(page.next_page_token))


@router.post("", status_code=201, response_model=GateState)
async def open_gate(body: OpenGateBody, client: ClientDep, post: RequesterPost) -> Any:
    """Open a standalone gate; its id is ``<parent_id>/gate/<name>``."""

    async def run() -> tuple[int, Any]:
        parent = body.parent_id or f"api/{post.key_digest(width=16) or uuid.uuid4()}"
        req = GateRequest(requester=post.caller.actor, **body.model_dump(exclude={"parent_id"}))
        try:
            # Its access record: its requester and approvers (client.gate.start_gate).
            state = await gates.open_gate(
                client,
                req,
                gate_id=gate_workflow_id(parent, body.name),
                task_queue=post.settings.task_queue,
            )
        except FileExistsError as err:
            raise ApiError(409, "conflict", str(err)) from None
        return 201, state.model_dump(mode="json")

    return await post.answer_once(body, run)


@router.get("/{gate_id:path}", response_model=GateState)
async def get_gate(gate_id: str, client: ClientDep, caller: CallerDep) -> GateState:
    """One gate's state, pending or closed; 404 for a gate the caller may not see."""
    return await _read_state(client, gate_id, caller)


async def _pending(client: Client, gate_id: str, caller: Caller) -> None:
    """404 unless the caller may see the gate (:func:`_visible`), 409 unless it is pending."""
    desc = await _visible(client, gate_id, caller)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise ApiError(409, "gate_closed", f"gate {gate_id!r} is closed")


def _decision_route(decision: Literal["approve", "reject"]) -> Callable[..., Awaitable[Any]]:
    """The route that decides ``decision`` (approve and reject differ in nothing else)."""

    async def route(gate_id: str, body: DecisionBody, client: ClientDep, post: ApproverPost) -> Any:
        caller = post.caller

        async def run() -> tuple[int, Any]:
            # One RPC on the way that succeeds: the Update itself. The gate accepts a
            # decision only from a caller who may see it (a named approver, any approver
            # when it names none, or admin; ApproverPost let no one else through), so the
            # read check that _visible makes would only repeat it. Every refusal and error
            # goes through that check first, so a caller who may not see a gate learns no
            # more than 404.
            decision_in = GateDecision(
                decision=decision,
                actor=caller.actor,
                comment=body.comment,
                request_id=request_id_for(caller, post.key),
            )
            try:
                state = await gates.decide(client, gate_id, decision_in)
            except Exception as err:
                await _pending(client, gate_id, caller)
                if isinstance(err, GateRefusal):
                    raise refusal_error(err) from None
                raise
            return 200, state.model_dump(mode="json")

        return await post.answer_once(body, run)

    # The name and docstring FastAPI makes the operation's id and description of.
    route.__name__ = route.__qualname__ = f"{decision}_gate"
    route.__doc__ = (
        f"{decision.capitalize()} as the calling approver. "
        "403 for the requester or a non-approver, 409 if closed."
    )
    return route


approve_gate = router.post("/{gate_id:path}/approve", response_model=GateState)(
    _decision_route("approve")
)
reject_gate = router.post("/{gate_id:path}/reject", response_model=GateState)(
    _decision_route("reject")
)


@router.post("/{gate_id:path}/comments", response_model=GateState)
async def comment_gate(gate_id: str, body: CommentBody, client: ClientDep, post: CallerPost) -> Any:
    """Comment on a pending gate as the caller."""
    caller = post.caller

    async def run() -> tuple[int, Any]:
        await _pending(client, gate_id, caller)
        entry = GateComment(
            actor=caller.actor, comment=body.comment, request_id=request_id_for(caller, post.key)
        )
        try:
            state = await gates.comment(client, gate_id, entry)
        except GateRefusal as err:
            raise refusal_error(err) from None
        return 200, state.model_dump(mode="json")

    return await post.answer_once(body, run)
