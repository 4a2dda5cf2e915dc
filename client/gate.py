"""Client calls for approval gates: open, list, describe, decide, comment.

Every caller of a gate's Update or Query goes through here: the API's ``/gates`` routes,
the design routes and CLI (a design round's gate is an ``ApprovalGate`` child), and the
``keel gates`` CLI. A gate's refusal (``gate_closed``, ``self_approval``,
``not_an_approver``) comes back as :class:`keel.gates.GateRefusal` with its code, whatever
path it took (the Update validator, or a gate that closed before the Update reached it);
the API maps codes to HTTP statuses, the CLIs to exit codes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from client.memos import access_memo_of, memo_of
from client.temporal import (
    describe_or_none,
    list_page,
    readers_clause,
    status_name,
    with_readers,
)
from keel.access import ACCESS_MEMO, RunAccess, access_for
from keel.gates import (
    GATE_COMMENT_UPDATE,
    GATE_DECIDE_UPDATE,
    GATE_ID_SEPARATOR,
    GATE_STATE_QUERY,
    GATE_SUMMARY_MEMO,
    GATE_WORKFLOW_TYPE,
    GateComment,
    GateDecision,
    GateRefusal,
    GateRequest,
    GateState,
    GateStatus,
    GateSummaryMemo,
    gate_update_id,
    start_search_attribute_values,
    summary_memo,
)
from keel.search_attributes import GATE_STATUS_ATTRIBUTE

#: A gate answers queries and updates only while a worker runs; past this, an error, not a hang.
GATE_RPC_TIMEOUT = timedelta(seconds=10)

#: How many gate histories one list reads at once, for rows without the summary memo
#: (gates started before it). Measured on the dev server, 30 gates: 22 ms without these
#: reads, 94 ms one after another, 78 ms 16 at once.
REQUEST_READS = 16

#: The gate refusals' codes (keel.gates.check_decision).
REFUSALS = ("gate_closed", "self_approval", "not_an_approver")


class GateNotFound(LookupError):
    """No gate with that id (or the id names a workflow that is not a gate)."""

    def __init__(self, gate_id: str) -> None:
        super().__init__(f"no gate {gate_id!r}")
        self.gate_id = gate_id


class GateNotRunning(RuntimeError):
    """The gate's workflow ended without a state to show (terminated, failed, timed out)."""

    def __init__(self, gate_id: str, status: str) -> None:
        super().__init__(f"gate {gate_id!r} ended as {status}")
        self.gate_id = gate_id
        self.status = status


class GateSummary(BaseModel):
    """One row of a gate list: what it waits on, who may decide it, when it expires."""

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


def start_search_attributes(request: GateRequest) -> TypedSearchAttributes:
    """The attributes a gate is started with, so visibility lists it as pending before its
    first workflow task runs (the run upserts the same values)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(SearchAttributeKey.for_keyword(key), value)
            for key, value in start_search_attribute_values(request).items()
        ]
    )


async def start_gate(
    client: Client,
    request: GateRequest,
    *,
    gate_id: str,
    task_queue: str,
    access: RunAccess | None = None,
) -> WorkflowHandle[Any, GateState]:
    """Start a standalone gate: its access record (``access``, else its requester and
    approvers) in its memo and in ``KeelReaders``, so the callers who may read it find it,
    and its summary (``keel.gates.GateSummaryMemo``) in its memo, so lists need not read
    its history.

    Raises:
        FileExistsError: a gate with that id exists.
    """
    access = access or access_for(request.requester, [request.approvers])
    try:
        return await client.start_workflow(
            GATE_WORKFLOW_TYPE,
            request,
            id=gate_id,
            task_queue=task_queue,
            memo={ACCESS_MEMO: access, GATE_SUMMARY_MEMO: summary_memo(request)},
            search_attributes=with_readers(start_search_attributes(request), {ACCESS_MEMO: access}),
            result_type=GateState,
        )
    except WorkflowAlreadyStartedError:
        raise FileExistsError(f"gate {gate_id!r} already exists") from None


async def open_gate(
    client: Client,
    request: GateRequest,
    *,
    gate_id: str,
    task_queue: str,
    access: RunAccess | None = None,
) -> GateState:
    """Start a standalone gate (:func:`start_gate`) and return its first state.

    Raises:
        FileExistsError: a gate with that id exists.
    """
    handle = await start_gate(
        client, request, gate_id=gate_id, task_queue=task_queue, access=access
    )
    state: GateState = await handle.query(
        GATE_STATE_QUERY, result_type=GateState, rpc_timeout=GATE_RPC_TIMEOUT
    )
    return state


async def describe(client: Client, gate_id: str) -> WorkflowExecutionDescription:
    """The gate's workflow description.

    Raises:
        GateNotFound: no gate has that id.
    """
    if GATE_ID_SEPARATOR not in gate_id:
        raise GateNotFound(gate_id)
    desc = await describe_or_none(client, gate_id, GATE_WORKFLOW_TYPE)
    if desc is None:
        raise GateNotFound(gate_id)
    return desc


async def request_of(client: Client, wf: Any) -> GateRequest | None:
    """The request gate ``wf`` (a description or a list row) was started with, read from
    its start event, or None when it is unreadable."""
    handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            (req,) = await client.data_converter.decode(payloads, [GateRequest])
        except (ValueError, TypeError):
            return None
        return req  # type: ignore[no-any-return]
    return None


async def summary_memo_of(wf: Any) -> GateSummaryMemo | None:
    """Gate ``wf``'s summary memo (a description or a list row: no RPC), None when it has
    none (a gate started before the memo, or one whose first task has not run yet) or it
    is unreadable."""
    return await memo_of(wf, GATE_SUMMARY_MEMO, GateSummaryMemo)


async def summary_of(
    client: Client, wf: Any, reads: asyncio.Semaphore | None = None
) -> GateSummaryMemo | None:
    """Gate ``wf``'s summary: its memo, else (a gate without one) read from its request
    in its start event, holding ``reads`` (when given) while it reads; None when neither
    is readable."""
    memo = await summary_memo_of(wf)
    if memo is not None:
        return memo
    async with reads or contextlib.nullcontext():
        req = await request_of(client, wf)
    return None if req is None else summary_memo(req)


async def access_of(client: Client, wf: Any) -> RunAccess | None:
    """Who may see gate ``wf``: the access memo the API wrote when it opened the gate,
    else its requester and approvers from its summary memo, else from its own request in
    its start event (a gate opened before the summary memo, or not yet past its first
    workflow task)."""
    access = await access_memo_of(wf)
    if access is not None:
        return access
    return _summary_access(await summary_of(client, wf))


def _summary_access(summary: GateSummaryMemo | None) -> RunAccess | None:
    """Who may see a gate by its summary (its requester and approvers), None without one."""
    return None if summary is None else access_for(summary.requester, [summary.approvers])


class GatePage(BaseModel):
    """One page of a gate list and the token of the next (None: this was the last)."""

    gates: list[GateSummary]
    next_page_token: bytes | None = None


async def list_gates(
    client: Client,
    status: GateStatus = GateStatus.PENDING,
    *,
    limit: int = 100,
    readers: list[str] | None = None,
    page_token: bytes | None = None,
    visible: Callable[[RunAccess | None], bool] | None = None,
) -> GatePage:
    """One page of gates with ``status``, newest first, from Temporal's visibility store.

    ``readers`` (``keel.access.reader_terms``) narrows the one visibility query to gates
    whose ``KeelReaders`` holds one of them; None asks for every gate. ``visible`` is a
    defence on the rows that come back (their access memo, else their summary): a row it
    refuses is left out of the page, which may then hold fewer than ``limit``.

    Each row's summary (requester, subject, approvers, expiry) comes from its summary memo
    in the visibility row; only a row without one (a gate started before the memo) costs a
    read of its start event, ``REQUEST_READS`` at once.

    Raises:
        client.temporal.BadPageToken: ``page_token`` is not one a list handed out.
    """
    query = f'WorkflowType = "{GATE_WORKFLOW_TYPE}" AND {GATE_STATUS_ATTRIBUTE} = "{status.value}"'
    clause = readers_clause(readers)
    if clause:
        query += f" AND {clause}"
    rows, next_token = await list_page(client, query, page_size=limit, page_token=page_token)
    reads = asyncio.Semaphore(REQUEST_READS)
    summaries = await asyncio.gather(*(summary_of(client, wf, reads) for wf in rows))
    gates: list[GateSummary] = []
    for wf, summary in zip(rows, summaries, strict=True):
        if visible is not None:
            access = await access_memo_of(wf)
            if not visible(access if access is not None else _summary_access(summary)):
                continue
        gates.append(_gate_row(wf, status, summary))
    return GatePage(gates=gates, next_page_token=next_token)


def _gate_row(wf: Any, status: GateStatus, summary: GateSummaryMemo | None) -> GateSummary:
    """One row of a gate list: visibility row ``wf`` and its summary (None: unreadable)."""
    parent, _, name = wf.id.rpartition(GATE_ID_SEPARATOR)
    return GateSummary(
        gate_id=wf.id,
        name=name,
        status=status.value,
        started_at=wf.start_time,
        parent_id=parent or None,
        requester=summary.requester if summary else None,
        subject=summary.subject if summary else None,
        approvers=summary.approvers if summary else None,
        expires_at=(
            wf.start_time + timedelta(seconds=summary.expires_in_s)
            if summary and wf.start_time
            else None
        ),
    )


async def state(
    client: Client, gate_id: str, desc: WorkflowExecutionDescription | None = None
) -> GateState:
    """A gate's state: its query while it waits, its result once decided or expired.

    Raises:
        GateNotFound: no gate has that id.
        GateNotRunning: it ended without a state (terminated, failed, timed out).
    """
    desc = desc or await describe(client, gate_id)
    handle = client.get_workflow_handle(gate_id, result_type=GateState)
    if desc.status == WorkflowExecutionStatus.RUNNING:
        running: GateState = await handle.query(
            GATE_STATE_QUERY, result_type=GateState, rpc_timeout=GATE_RPC_TIMEOUT
        )
        return running
    if desc.status == WorkflowExecutionStatus.COMPLETED:
        return await handle.result()
    raise GateNotRunning(gate_id, status_name(desc))


async def _update(
    client: Client, gate_id: str, update: str, arg: GateDecision | GateComment
) -> GateState:
    handle: WorkflowHandle[Any, GateState] = client.get_workflow_handle(
        gate_id, result_type=GateState
    )
    try:
        result: GateState = await handle.execute_update(
            update,
            arg,
            id=gate_update_id(update, arg.actor, arg.request_id),
            result_type=GateState,
            rpc_timeout=GATE_RPC_TIMEOUT,
        )
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type in REFUSALS:
            raise GateRefusal(cause.type, cause.message) from None
        raise
    except RPCError as err:
        # No running workflow with that id: it closed between a check and the Update (or
        # never existed: the caller tells which, with describe()).
        if err.status == RPCStatusCode.NOT_FOUND:
            raise GateRefusal("gate_closed", f"gate {gate_id!r} is closed") from None
        raise
    return result


async def decide(client: Client, gate_id: str, decision: GateDecision) -> GateState:
    """Approve or reject through the gate's Update; its refusals raise
    :class:`keel.gates.GateRefusal` (``gate_closed`` also for a gate that is not running)."""
    return await _update(client, gate_id, GATE_DECIDE_UPDATE, decision)


async def comment(client: Client, gate_id: str, entry: GateComment) -> GateState:
    """Add a comment to a pending gate through its Update."""
    return await _update(client, gate_id, GATE_COMMENT_UPDATE, entry)


async def when_open(client: Client, gate_id: str, wait_s: float) -> bool:
    """Whether gate ``gate_id`` exists, waiting up to ``wait_s`` for it (a workflow notes
    its gate just before it starts the child)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while True:
        if await describe_or_none(client, gate_id) is not None:
            return True
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
