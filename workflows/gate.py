"""``ApprovalGate``: a human decision point that any workflow can open as a child.

Decisions arrive by Update ``decide`` (the caller learns at once if it was refused) or
by Signal ``decide_signal`` for ``temporal workflow signal`` users (refusals are kept in
the state, since a signal cannot answer). Expiry is a timer with its own outcome;
reminders are timers that never cancel the gate. Every event goes to the audit table.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from keel.access import ACCESS_MEMO, READERS_SIGNAL, RunAccess, access_for, readers_of
    from keel.gates import (
        GATE_COMMENT_UPDATE,
        GATE_DECIDE_SIGNAL,
        GATE_DECIDE_UPDATE,
        GATE_STATE_QUERY,
        GATE_SUMMARY_MEMO,
        GATE_WORKFLOW_TYPE,
        CommentEntry,
        GateComment,
        GateDecision,
        GateNotice,
        GateRefusal,
        GateRequest,
        GateState,
        GateStatus,
        GateSummaryMemo,
        RefusedDecision,
        WebhookDelivery,
        WebhookTarget,
        check_decision,
        gate_workflow_id,
        start_search_attribute_values,
        summary_memo,
    )
    from keel.records import GateAuditEvent
    from keel.refs import NOTIFY_HAS_TARGET, NOTIFY_WEBHOOK, RECORD_GATE_EVENT
    from keel.search_attributes import (
        GATE_NAME_ATTRIBUTE,
        GATE_STATUS_ATTRIBUTE,
        READERS_ATTRIBUTE,
    )
    from workflows.common import call
    from workflows.readers import upsert_readers

STATUS_KEY = SearchAttributeKey.for_keyword(GATE_STATUS_ATTRIBUTE)
NAME_KEY = SearchAttributeKey.for_keyword(GATE_NAME_ATTRIBUTE)
READERS_KEY = SearchAttributeKey.for_keyword_list(READERS_ATTRIBUTE)

# Runs started before this patch kept one dedup table keyed by the bare request id, so a
# comment's key could swallow another actor's decision; they replay with that table.
SCOPED_DEDUP_PATCH = "gate-dedup-by-actor-action"
# Runs started before this patch wrote a handler's audit record (decision, comment, refusal)
# as a regular activity, which cost the caller two more workflow tasks before its answer.
LOCAL_HANDLER_AUDIT_PATCH = "gate-local-handler-audit"
# Runs started before this patch answered a decision only after its audit row was written
# (a local activity inside the answering workflow task: about 30 ms on the caller's path).
# Newer runs answer at once and write the row right after, in order, as a regular activity:
# the decision is already durable in history when the caller hears it (the Update's
# completion is an event), so a worker lost in between writes the row on replay.
AUDIT_AFTER_ANSWER_PATCH = "gate-audit-after-answer"
# Gates opened as children before this patch started without ``KeelReaders`` (who may read
# them, keel.access.readers_of); newer ones carry it from their start, so a caller's
# ``GET /gates`` finds them in one visibility query. The start command changes, hence a patch.
CHILD_READERS_PATCH = "gate-child-readers"
# A gate started with no ``KeelReaders`` at all (``temporal workflow start``, a client of
# its own) was listed to ``admin`` only; since this patch it sets them itself at its start,
# from its access memo or else its own request, so its approvers find it in their inbox.
SELF_READERS_PATCH = "gate-self-readers"
# Runs started before this patch queued the rows for one writer task, which wrote the next
# row when the last one's completion came. A worker picking a run up cold can run an
# Update's handler before it has applied completions already in history (it folds
# command-less workflow tasks; temporalio/sdk-python#1591), and replay then runs it after
# them: the handler's row went to a busy writer the first time and to a new one on replay,
# the commands came in another order and the run failed with a nondeterminism error (a
# server restart under load showed it). Newer runs start each row's activity where the row
# is made, so no command depends on when a completion is applied; rows may then be written
# out of order, and readers order them by time and their place in the run (``event_key``).
AUDIT_ROWS_AT_ONCE_PATCH = "gate-audit-rows-at-once"
# Runs started before this patch wrote the "opened" row and sent every notice as regular
# activities, even with no webhook configured (the activity then skipped it). Each one's
# completion was a workflow task, and a decision arriving meanwhile waited behind them.
# Newer runs write the "opened" row and ask whether notices go anywhere as two local
# activities inside the first workflow task, and send no notices when none would: an
# opened gate then has nothing in flight, and a decision is answered at once.
OPEN_LOCAL_PATCH = "gate-open-local"
# A gate list (``client.gate.list_gates``) read each row's request from its start event:
# one history read per row, most of ``GET /gates``'s time at volume. Since this patch a
# gate started without the summary memo (``keel.gates.GATE_SUMMARY_MEMO``: a child of a
# workflow, ``temporal workflow start``), or with one that is not its request's, sets it
# itself at its start, so lists read it from the visibility row. ``client.gate.start_gate``
# writes it at the start (then the gate issues no command for it).
SUMMARY_MEMO_PATCH = "gate-summary-memo"
# Runs started before this patch answered a decision, a comment or a refusal at once and
# wrote its row after, as a regular activity: its schedule, start and completion, and the
# workflow task that completion woke, cost the server more than the answer did (at 50
# concurrent decisions, 2.2 times a bare Update's CPU, bench/gate_concurrency.py). Newer
# runs write a handler's row as a local activity in the answering workflow task, which
# answers once the row is written: one workflow task per decision, the run's completion in
# it too when the decision closes the gate.
HANDLER_ROWS_LOCAL_PATCH = "gate-handler-rows-local"
# Each patch a run asks records a marker and an upsert of ``TemporalChangeVersion`` in its
# first workflow task: sixteen events for the eight above, and the server sends that task's
# events again with the next task, the decision's, where the worker matches them one by one
# (about 1.2 ms of a decision here, bench/gate_latency.py) after the upserts' visibility
# writes. Runs started since this patch ask it alone: it implies every patch above, none of
# which is then asked. Their first task also sets its search attributes in one upsert, and
# only those the start did not set (``client.gate.start_gate`` sets them all: no upsert);
# and the expiry timer is left to lapse with the run instead of being cancelled by the
# decision (one command less in the task that answers it). Older runs ask each patch, as
# they were recorded.
ONE_MARKER_PATCH = "gate-one-marker"


# Outside the SDK's sandbox. Gates are the family a team holds by the thousand, and the
# sandbox is entered per payload (six visitor passes a task, each running a code string in
# the run's module copy) and per activation: at 50 concurrent decisions
# (bench/gate_concurrency.py) the worker's CPU over 2,000 of them, half a bare floor's,
# went from 31-33 s to 20-22 s without it. The determinism guard stays where it catches a
# change before any run does: the replay suite (tests/test_replay.py) runs every recorded
# history, this workflow's included, inside the sandbox, and a clock read there fails it.
@workflow.defn(name=GATE_WORKFLOW_TYPE, sandboxed=False)
class ApprovalGate:
    @workflow.init
    def __init__(self, request: GateRequest) -> None:
        now = workflow.now()
        self._request = request
        self._state = GateState(
            gate_id=workflow.info().workflow_id,
            name=request.name,
            status=GateStatus.PENDING,
            requester=request.requester,
            subject=request.subject,
            approvers=request.approvers,
            details=request.details,
            opened_at=now,
            expires_at=now + timedelta(seconds=request.expires_in_s),
        )
        # dedup key → the state that request produced, so a retried decision applies once.
        self._applied: dict[str, GateState] = {}
        self._decide_patches()
        # Whether notices go anywhere: known from the start in older runs (always sent),
        # after the first task's local answer in open-local runs.
        self._notices_on: bool | None = None if self._open_local else True
        # Rows being written (at-once runs): the run ends only when all are.
        self._audit_writes: list[asyncio.Task[None]] = []
        # Audit rows waiting for the writer (after-answer runs), oldest first.
        self._pending_audit: list[GateAuditEvent] = []
        self._audit_writer: asyncio.Task[None] | None = None
        self._event_seq = 0
        # Older runs: the "opened" row is written, so decisions may come (their rows after
        # it). After-answer runs queue it here, first, so nothing has to wait for it.
        self._opened = False
        # Open-local runs write the "opened" row in the first task (``_open_locally``).
        self._opened_row: GateAuditEvent | None = None
        if self._audit_after_answer:
            row = self._record("opened", actor=request.requester, comment=request.subject)
            if self._open_local:
                self._opened_row = row
            else:
                self._pending_audit.append(row)
            self._opened = True
        self._lock = asyncio.Lock()
        # Notices run beside the gate: a slow or failing webhook never delays a decision.
        self._notices: list[asyncio.Task[None]] = []

    def _decide_patches(self) -> None:
        """Which of the gate's patches this run has, decided once when it starts (in this
        order: each ``workflow.patched`` call is part of the history)."""
        # Decided once here: validators are read-only and cannot consult the patch.
        self._one_marker = workflow.patched(ONE_MARKER_PATCH)
        if self._one_marker:
            self._scoped_dedup = self._local_handler_audit = self._audit_after_answer = True
            self._audit_at_once = self._open_local = self._handler_rows_local = True
        else:
            self._scoped_dedup = workflow.patched(SCOPED_DEDUP_PATCH)
            self._local_handler_audit = workflow.patched(LOCAL_HANDLER_AUDIT_PATCH)
            self._audit_after_answer = workflow.patched(AUDIT_AFTER_ANSWER_PATCH)
            self._audit_at_once = self._audit_after_answer and workflow.patched(
                AUDIT_ROWS_AT_ONCE_PATCH
            )
            self._open_local = self._audit_at_once and workflow.patched(OPEN_LOCAL_PATCH)
            self._handler_rows_local = self._open_local and workflow.patched(
                HANDLER_ROWS_LOCAL_PATCH
            )

    @workflow.run
    async def run(self, request: GateRequest) -> GateState:
        if self._one_marker:
            _upsert_missing_attributes(request)
        else:
            workflow.upsert_search_attributes(
                [STATUS_KEY.value_set(GateStatus.PENDING.value), NAME_KEY.value_set(request.name)]
            )
            if (
                workflow.patched(SELF_READERS_PATCH)
                and workflow.info().typed_search_attributes.get(READERS_KEY) is None
            ):
                upsert_readers(access_for(request.requester, [request.approvers]))
        if (
            self._one_marker or workflow.patched(SUMMARY_MEMO_PATCH)
        ) and _summary_memo() != summary_memo(request):
            workflow.upsert_memo({GATE_SUMMARY_MEMO: summary_memo(request)})
        if self._opened_row is not None:
            await self._open_locally(request, self._opened_row)
        elif self._audit_after_answer:
            self._start_audit_writer()
        else:
            await self._audit("opened", actor=request.requester, comment=request.subject)
            self._opened = True
        self._notify("gate.waiting")

        reminders = None
        if request.remind_every_s and request.max_reminders:
            reminders = asyncio.create_task(self._remind(request.remind_every_s))

        remaining = self._state.expires_at - workflow.now()
        if self._one_marker:
            # The timer is never cancelled: a decision closes the run with it pending.
            expiry = asyncio.create_task(workflow.sleep(remaining))
            await workflow.wait_condition(lambda: self._state.closed or expiry.done())
        else:
            with contextlib.suppress(TimeoutError):  # expiry is an outcome, not an error
                await workflow.wait_condition(lambda: self._state.closed, timeout=remaining)
        if not self._state.closed:
            async with self._lock:
                if not self._state.closed:
                    self._state.status = GateStatus.EXPIRED
                    self._state.decided_at = workflow.now()
                    await self._audit("expired", actor=None)
            self._notify("gate.expired")
        if reminders is not None:
            reminders.cancel()

        workflow.upsert_search_attributes([STATUS_KEY.value_set(self._state.status.value)])
        # Let in-flight handlers, their audit rows and notices finish before closing.
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._audit_writer is not None:
            await workflow.wait_condition(lambda: not self._pending_audit)
            await self._audit_writer
        await asyncio.gather(*self._audit_writes)
        await asyncio.gather(*self._notices)
        return self._state

    async def _open_locally(self, request: GateRequest, row: GateAuditEvent) -> None:
        """The "opened" row and whether notices go anywhere, as local activities in the
        first workflow task: when it completes, nothing of the opening is left in flight."""
        _, self._notices_on = await asyncio.gather(
            call(RECORD_GATE_EVENT, row, summary="audit opened", local=True),
            call(
                NOTIFY_HAS_TARGET,
                WebhookTarget(url=request.webhook_url or ""),
                summary="webhook target",
                local=True,
            ),
        )

    # -- decisions ---------------------------------------------------------------------

    @workflow.update(name=GATE_DECIDE_UPDATE)
    async def decide(self, decision: GateDecision) -> GateState:
        """Approve or reject. Refused (by the validator) on a closed gate, for an actor who
        is not an approver, and for the requester deciding their own request."""
        await workflow.wait_condition(lambda: self._opened)
        key = self._dedup_key("decide", decision.actor, decision.request_id)
        async with self._lock:
            if key in self._applied:
                return self._applied[key]
            try:
                check_decision(self._state, decision.actor)
            except GateRefusal as refusal:
                # The state can close between validation and this handler (a concurrent
                # decision won the lock): refuse the same way the validator would have.
                raise ApplicationError(
                    refusal.message, type=refusal.code, non_retryable=True
                ) from None
            await self._apply(decision)
            return self._state

    @decide.validator
    def _validate_decide(self, decision: GateDecision) -> None:
        if self._dedup_key("decide", decision.actor, decision.request_id) in self._applied:
            return
        try:
            check_decision(self._state, decision.actor)
        except GateRefusal as refusal:
            raise ApplicationError(refusal.message, type=refusal.code, non_retryable=True) from None

    @workflow.signal(name=GATE_DECIDE_SIGNAL)
    async def decide_signal(self, decision: GateDecision) -> None:
        """Signal form of ``decide`` for ``temporal workflow signal``; refusals are recorded."""
        await workflow.wait_condition(lambda: self._opened)
        key = self._dedup_key("decide", decision.actor, decision.request_id)
        async with self._lock:
            if key in self._applied:
                return
            try:
                check_decision(self._state, decision.actor)
            except GateRefusal as refusal:
                self._state.refused.append(
                    RefusedDecision(
                        actor=decision.actor,
                        decision=decision.decision,
                        reason=refusal.code,
                        at=workflow.now(),
                    )
                )
                await self._audit(
                    "refused",
                    in_handler=True,
                    actor=decision.actor,
                    comment=decision.comment,
                    request_id=decision.request_id or None,
                    details={"reason": refusal.code, "decision": decision.decision},
                )
                return
            await self._apply(decision)

    async def _apply(self, decision: GateDecision) -> None:
        # State changes before the await so the run loop sees the gate closed at once.
        self._state.status = (
            GateStatus.APPROVED if decision.decision == "approve" else GateStatus.REJECTED
        )
        self._state.decided_by = decision.actor
        self._state.decided_at = workflow.now()
        self._state.decision_comment = decision.comment
        key = self._dedup_key("decide", decision.actor, decision.request_id)
        if key:
            self._applied[key] = self._state.model_copy(deep=True)
        await self._audit(
            "approved" if decision.decision == "approve" else "rejected",
            in_handler=True,
            actor=decision.actor,
            comment=decision.comment,
            request_id=decision.request_id or None,
        )
        self._notify("gate.decided")

    def _dedup_key(self, action: str, actor: str, request_id: str) -> str:
        """Where a request's outcome is kept; empty (never stored) without a request id.

        Scoped by actor and action: a key one caller reused must not answer for another
        caller's request, nor a comment's key for a decision.
        """
        if not request_id:
            return ""
        if not self._scoped_dedup:
            return request_id
        return f"{action}\x1f{actor}\x1f{request_id}"

    # -- comments and state ------------------------------------------------------------

    @workflow.update(name=GATE_COMMENT_UPDATE)
    async def comment(self, entry: GateComment) -> GateState:
        await workflow.wait_condition(lambda: self._opened)
        key = self._dedup_key("comment", entry.actor, entry.request_id)
        async with self._lock:
            if key in self._applied:
                return self._applied[key]
            self._state.comments.append(
                CommentEntry(actor=entry.actor, comment=entry.comment, at=workflow.now())
            )
            if key:
                self._applied[key] = self._state.model_copy(deep=True)
            await self._audit(
                "comment",
                in_handler=True,
                actor=entry.actor,
                comment=entry.comment,
                request_id=entry.request_id or None,
            )
            return self._state

    @comment.validator
    def _validate_comment(self, entry: GateComment) -> None:
        if self._dedup_key("comment", entry.actor, entry.request_id) in self._applied:
            return
        if self._state.closed:
            raise ApplicationError(
                f"gate {self._state.gate_id} is already {self._state.status.value}",
                type="gate_closed",
                non_retryable=True,
            )

    @workflow.signal(name=READERS_SIGNAL)
    def refresh_readers(self) -> None:
        """Set ``KeelReaders`` from the access memo (``keel migrate-search-attributes``)."""
        upsert_readers(access_for(self._request.requester, [self._request.approvers]))

    @workflow.query(name=GATE_STATE_QUERY)
    def state(self) -> GateState:
        return self._state

    # -- side effects --------------------------------------------------------------------

    async def _remind(self, every_s: float) -> None:
        while self._state.reminders_sent < self._request.max_reminders:
            try:
                await workflow.wait_condition(
                    lambda: self._state.closed, timeout=timedelta(seconds=every_s)
                )
                return
            except TimeoutError:
                pass
            self._state.reminders_sent += 1
            await self._audit("reminder", actor=None)
            self._notify("gate.reminder")

    async def _audit(
        self,
        event: str,
        *,
        actor: str | None,
        comment: str = "",
        request_id: str | None = None,
        details: dict[str, object] | None = None,
        in_handler: bool = False,
    ) -> None:
        """Write one audit row (idempotent by ``event_key``).

        Runs since ``gate-handler-rows-local`` write a handler's row (decision, comment,
        refusal) as a local activity of the task that answers it, so the answer comes once
        the row is written; other rows (opened, reminder, expired) start their activity
        where they are made. Runs from ``gate-audit-after-answer`` on answered at once and
        wrote the row after; runs from before it wrote each row before going on (a
        handler's as a local activity inside the answering task, or before that a regular
        one). The gate closes only when every row is written.
        """
        record = self._record(
            event, actor=actor, comment=comment, request_id=request_id, details=details
        )
        if in_handler and self._handler_rows_local:
            await call(RECORD_GATE_EVENT, record, summary=f"audit {event}", local=True)
            return
        if self._audit_at_once:
            self._write_at_once(record)
            return
        if self._audit_after_answer:
            self._pending_audit.append(record)
            self._start_audit_writer()
            return
        await call(
            RECORD_GATE_EVENT,
            record,
            summary=f"audit {event}",
            local=in_handler and self._local_handler_audit,
        )

    def _record(
        self,
        event: str,
        *,
        actor: str | None,
        comment: str = "",
        request_id: str | None = None,
        details: dict[str, object] | None = None,
    ) -> GateAuditEvent:
        """The next audit row: its key is the run and the row's place in it."""
        self._event_seq += 1
        info = workflow.info()
        return GateAuditEvent(
            gate_id=info.workflow_id,
            gate_name=self._request.name,
            event=event,  # type: ignore[arg-type]
            actor=actor,
            comment=comment,
            request_id=request_id,
            event_key=f"{info.run_id}:{self._event_seq}",
            at=workflow.now(),
            details=details or {},
        )

    def _write_at_once(self, record: GateAuditEvent) -> None:
        self._audit_writes.append(asyncio.create_task(self._write_row(record)))

    async def _write_row(self, record: GateAuditEvent) -> None:
        await call(RECORD_GATE_EVENT, record, summary=f"audit {record.event}")

    def _start_audit_writer(self) -> None:
        if self._audit_at_once:
            # The "opened" row made in __init__, where no task can start yet.
            while self._pending_audit:
                self._write_at_once(self._pending_audit.pop(0))
            return
        if self._audit_writer is None or self._audit_writer.done():
            self._audit_writer = asyncio.create_task(self._write_pending_audit())

    async def _write_pending_audit(self) -> None:
        """Write the handlers' audit rows one at a time, in the order they happened."""
        while self._pending_audit:
            record = self._pending_audit[0]
            await call(RECORD_GATE_EVENT, record, summary=f"audit {record.event}")
            self._pending_audit.pop(0)

    def _notify(self, event: str) -> None:
        if self._notices_on is False:
            return
        self._notices.append(asyncio.create_task(self._deliver(event)))

    async def _deliver(self, event: str) -> None:
        if self._notices_on is None:
            # A decision came in the first task, before its local answer.
            await workflow.wait_condition(lambda: self._notices_on is not None)
            if not self._notices_on:
                return
        info = workflow.info()
        notice = GateNotice(
            event=event,  # type: ignore[arg-type]
            gate_id=info.workflow_id,
            name=self._request.name,
            status=self._state.status,
            subject=self._request.subject,
            requester=self._request.requester,
            expires_at=self._state.expires_at,
            reminder=self._state.reminders_sent,
            at=workflow.now(),
        )
        try:
            await call(
                NOTIFY_WEBHOOK,
                WebhookDelivery(
                    url=self._request.webhook_url or "",
                    notice=notice,
                    idempotency_key=f"{info.run_id}:{event}:{self._state.reminders_sent}",
                ),
                summary=f"notify {event}",
            )
        except ActivityError as err:
            # A notice that cannot be delivered must not decide the gate.
            workflow.logger.warning("gate notice %s not delivered: %s", event, err.cause)


def _upsert_missing_attributes(request: GateRequest) -> None:
    """Set, in one upsert, the attributes the gate was not started with: ``pending``, its
    name, and ``KeelReaders`` (from its access memo, else its request); none when the
    start set them all."""
    started = workflow.info().typed_search_attributes
    updates: list[SearchAttributeUpdate[Any]] = []
    if started.get(STATUS_KEY) != GateStatus.PENDING.value:
        updates.append(STATUS_KEY.value_set(GateStatus.PENDING.value))
    if started.get(NAME_KEY) != request.name:
        updates.append(NAME_KEY.value_set(request.name))
    if started.get(READERS_KEY) is None:
        access = _access_memo() or access_for(request.requester, [request.approvers])
        updates.append(READERS_KEY.value_set(readers_of(access)))
    if updates:
        workflow.upsert_search_attributes(updates)


def _access_memo() -> RunAccess | None:
    """The access memo this gate was started with; None for none or one it cannot read."""
    try:
        access: RunAccess | None = workflow.memo_value(ACCESS_MEMO, None, type_hint=RunAccess)
    except (ValueError, TypeError):
        return None
    return access


def _summary_memo() -> GateSummaryMemo | None:
    """The summary memo this gate was started with; None for none or one it cannot read.
    Any but its request's own is replaced, so a list never shows what the gate does not
    enforce."""
    try:
        memo: GateSummaryMemo | None = workflow.memo_value(
            GATE_SUMMARY_MEMO, None, type_hint=GateSummaryMemo
        )
    except (ValueError, TypeError):
        return None
    return memo


def start_search_attributes(request: GateRequest) -> TypedSearchAttributes:
    """The attributes a gate is started with, so visibility lists it as pending before its
    first workflow task runs (the run upserts the same values)."""
    return TypedSearchAttributes(
        [
            SearchAttributePair(SearchAttributeKey.for_keyword(key), value)
            for key, value in start_search_attribute_values(request).items()
        ]
    )


async def open_gate(request: GateRequest) -> GateState:
    """Open gate ``request.name`` as a child of the calling workflow and wait for its outcome.

    The child's id is ``<parent id>/gate/<name>``, so people and tools can find it.
    """
    info = workflow.info()
    attributes = start_search_attributes(request)
    if workflow.patched(CHILD_READERS_PATCH):
        readers = readers_of(access_for(request.requester, [request.approvers]))
        attributes = TypedSearchAttributes([*attributes, SearchAttributePair(READERS_KEY, readers)])
    return await workflow.execute_child_workflow(
        ApprovalGate.run,
        request,
        id=gate_workflow_id(info.workflow_id, request.name),
        task_queue=info.task_queue,
        search_attributes=attributes,
    )
