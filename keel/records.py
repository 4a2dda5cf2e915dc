"""Records that Keel writes to its SQL store: gate audit events and LLM call logs.

Pure pydantic models, no I/O: activities build them and ``store.records`` persists them.
Each carries its own idempotency key so that a retried activity writes its row once.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, Field

GateEventKind = Literal[
    "opened", "comment", "approved", "rejected", "expired", "reminder", "refused"
]


class GateAuditEvent(BaseModel):
    """One entry of a gate's audit trail.

    ``event_key`` is the idempotency key (e.g. ``"<workflow run id>:<seq>"``): writing the
    same key twice keeps the first row.
    """

    gate_id: str = Field(description="Workflow id of the gate, e.g. '<parent id>/gate/<name>'")
    gate_name: str
    event: GateEventKind
    actor: str | None = None
    comment: str = ""
    request_id: str | None = None
    event_key: str = Field(min_length=1)
    at: AwareDatetime
    details: dict[str, Any] = Field(default_factory=dict)


class LLMCallLog(BaseModel):
    """Usage and outcome of one LLM call made through LiteLLM.

    ``call_key`` is the idempotency key: workflow run id + activity id + attempt, so each
    attempt is logged once even when the logging itself is retried.
    """

    call_key: str = Field(min_length=1)
    workflow_id: str | None = None
    model_name: str = Field(description="Keel's name for the model (configs/models.yaml)")
    litellm_model: str = Field(description="The model string passed to LiteLLM")
    provider: str
    status: Literal["ok", "error"]
    error_code: str | None = None
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    total_tokens: int = Field(default=0, ge=0)
    latency_ms: float = Field(ge=0)
    cost_usd: float | None = None
    created_at: AwareDatetime
