"""Approval gate models: the inputs, messages and outputs of the ``ApprovalGate`` workflow.

A gate is a human decision point that any workflow can open as a child workflow. These
models are the whole contract: the workflow, the API, the CLI and ``temporal workflow
start``/``signal`` users all speak them as plain JSON.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keel.digest import digest_json
from keel.ids import GATE_NAME_PATTERN
from keel.search_attributes import GATE_NAME_ATTRIBUTE, GATE_STATUS_ATTRIBUTE

GATE_WORKFLOW_TYPE = "ApprovalGate"
GATE_ID_SEPARATOR = "/gate/"
#: The gate's Update, Query and Signal names (workflows/gate.py; client/gate.py calls them).
GATE_DECIDE_UPDATE = "decide"
GATE_COMMENT_UPDATE = "comment"
GATE_STATE_QUERY = "state"
GATE_DECIDE_SIGNAL = "decide_signal"


class GateStatus(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"


def gate_workflow_id(parent_workflow_id: str, name: str) -> str:
    """The deterministic id of gate ``name`` opened by workflow ``parent_workflow_id``."""
    return f"{parent_workflow_id}{GATE_ID_SEPARATOR}{name}"


def gate_update_id(update: str, actor: str, request_id: str) -> str | None:
    """The Update id a gate request with a ``request_id`` is sent under: one per update,
    actor and request id, so the server itself answers a retry with the first answer, at
    once while it runs and also after the gate has closed (a gate may close in the task
    that answers its decision). ``None`` (a fresh id) without a request id."""
    if not request_id:
        return None
    return f"{update}/{digest_json([actor, request_id])[7:39]}"


#: The longest a gate waits, and the longest between reminders (one year): the workflow's
#: timers, and every API that opens a gate, stay within it.
MAX_WAIT_S = 365 * 24 * 3600


class GateRequest(BaseModel):
    """Input of ``ApprovalGate``: what is asked, by whom, of whom, and for how long."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=128, pattern=GATE_NAME_PATTERN)
    requester: str = Field(min_length=1, max_length=256)
    subject: str = Field(default="", max_length=2000, description="What is being approved.")
    approvers: list[str] = Field(
        default_factory=list,
        description="Actors allowed to decide. Empty: any approver except the requester.",
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        description="Small summary shown to approvers (digests, not payloads).",
    )
    expires_in_s: float = Field(default=24 * 3600, gt=0, le=MAX_WAIT_S)
    # Bounded like expiry: a larger interval overflows the workflow timer (never fires).
    remind_every_s: float | None = Field(default=None, gt=0, le=MAX_WAIT_S)
    max_reminders: int = Field(default=10, ge=0, le=1000)
    webhook_url: str | None = Field(
        default=None,
        description="Where notices and reminders are POSTed (HMAC-signed). "
        "Falls back to the worker's KEEL_WEBHOOK_URL.",
    )

    @field_validator("approvers")
    @classmethod
    def _unique_approvers(cls, v: list[str]) -> list[str]:
        return sorted(set(v))


class GateDecision(BaseModel):
    """A decision on a gate, sent by Update (``decide``) or Signal (``decide_signal``)."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["approve", "reject"]
    actor: str = Field(min_length=1, max_length=256)
    comment: str = Field(default="", max_length=10_000)
    request_id: str = Field(
        default="",
        max_length=256,
        description="Idempotency key: the same request_id twice applies once.",
    )


class GateComment(BaseModel):
    """A comment on a pending gate (Update ``comment``)."""

    model_config = ConfigDict(extra="forbid")

    actor: str = Field(min_length=1, max_length=256)
    comment: str = Field(min_length=1, max_length=10_000)
    request_id: str = Field(default="", max_length=256)


class CommentEntry(BaseModel):
    actor: str
    comment: str
    at: datetime


class RefusedDecision(BaseModel):
    """A signal-borne decision the gate refused (signals cannot answer, so it is kept here)."""

    actor: str
    decision: str
    reason: str
    at: datetime


class GateState(BaseModel):
    """What ``state`` queries and updates return, and the gate's final result."""

    gate_id: str
    name: str
    status: GateStatus
    requester: str
    subject: str
    approvers: list[str]
    details: dict[str, Any]
    opened_at: datetime
    expires_at: datetime
    decided_by: str | None = None
    decided_at: datetime | None = None
    decision_comment: str = ""
    comments: list[CommentEntry] = Field(default_factory=list)
    reminders_sent: int = 0
    refused: list[RefusedDecision] = Field(default_factory=list)

    @property
    def closed(self) -> bool:
        return self.status != GateStatus.PENDING


class GateRefusal(Exception):
    """Why a decision cannot be applied; carries a stable code for API mapping."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_decision(state: GateState, actor: str) -> None:
    """Raise ``GateRefusal`` if ``actor`` may not decide the gate in ``state``.

    Pure so the Update validator, the Signal handler and the API share one rule set.
    """
    if state.closed:
        raise GateRefusal("gate_closed", f"gate {state.gate_id} is already {state.status.value}")
    if actor == state.requester:
        raise GateRefusal("self_approval", f"{actor} requested this gate and cannot decide it")
    if state.approvers and actor not in state.approvers:
        raise GateRefusal("not_an_approver", f"{actor} is not an approver of this gate")


class GateNotice(BaseModel):
    """Body of a webhook notice about a gate (``gate.waiting``, ``gate.reminder``, ``gate.decided``)."""

    event: Literal["gate.waiting", "gate.reminder", "gate.decided", "gate.expired"]
    gate_id: str
    name: str
    status: GateStatus
    subject: str
    requester: str
    expires_at: datetime
    reminder: int = 0
    at: datetime


class DesignNotice(BaseModel):
    """Body of a webhook notice about a design pipeline (plan §22.5). It lives here, beside
    :class:`GateNotice`, because ``notify.webhook`` delivers both."""

    event: Literal["plan.ready", "gate.waiting", "run.complete", "run.error"]
    project_id: str
    decision_set_id: str
    workflow_id: str
    node_name: str | None = None
    gate_id: str | None = None
    plan_round: int | None = None
    status: str | None = Field(None, description="run.complete: the outcome")
    version: int | None = Field(None, description="run.complete: the stored version")
    message: str | None = Field(None, description="run.error: what failed")
    at: datetime


class WebhookDelivery(BaseModel):
    """Input of the ``notify.webhook`` activity. ``url`` empty means the worker's default."""

    url: str = ""
    notice: GateNotice | DesignNotice
    idempotency_key: str


class WebhookTarget(BaseModel):
    """Input of the ``notify.has_target`` activity: a request's webhook url, empty for none."""

    url: str = ""


class WebhookResult(BaseModel):
    delivered: bool
    status_code: int | None = None
    skipped_reason: str = ""


#: The memo key of a gate's summary (:class:`GateSummaryMemo`).
GATE_SUMMARY_MEMO = "keel_gate"


class GateSummaryMemo(BaseModel):
    """What a gate list shows of a gate's request, kept in its memo under
    :data:`GATE_SUMMARY_MEMO` so a list reads it from the visibility row instead of one
    history read per gate. ``client.gate.start_gate`` writes it at the start; a gate
    started without it (a child of a workflow, ``temporal workflow start``), or with one
    that is not its request's, sets it itself in its first workflow task (patch
    ``gate-summary-memo``)."""

    model_config = ConfigDict(extra="ignore")

    requester: str = Field(min_length=1)
    subject: str = ""
    approvers: list[str] = Field(default_factory=list)
    expires_in_s: float = Field(gt=0)


def summary_memo(request: GateRequest) -> GateSummaryMemo:
    """The summary memo of a gate started with ``request``."""
    return GateSummaryMemo(
        requester=request.requester,
        subject=request.subject,
        approvers=list(request.approvers),
        expires_in_s=request.expires_in_s,
    )


def start_search_attribute_values(request: GateRequest) -> dict[str, str]:
    """The keyword search attributes a gate is started with (``pending`` and its name), so
    visibility lists it as pending before its first workflow task runs; the run upserts
    the same values."""
    return {GATE_STATUS_ATTRIBUTE: GateStatus.PENDING.value, GATE_NAME_ATTRIBUTE: request.name}
