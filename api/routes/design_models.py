"""The request and response bodies of the design routes (``api/routes/design.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from keel.design.policy import PolicySettings
from keel.design.steps import DesignOptions, DesignStatus, selected_validators
from keel.ids import SHORT_ID_PATTERN

_ID = SHORT_ID_PATTERN


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateProjectBody(_Body):
    id: str = Field(pattern=_ID, examples=["churn"])
    name: str = Field(default="", max_length=200)


class ProjectCreated(BaseModel):
    project_id: str


class ProjectView(BaseModel):
    id: str
    name: str
    owner_id: str
    created_at: datetime


class ProjectList(BaseModel):
    projects: list[ProjectView]


class ConstraintsBody(DesignOptions):
    """A decision set's options: everything of ``DesignInput`` but the project (the path),
    the decision set id (minted here) and the requester (the caller)."""


class DecisionSetStarted(BaseModel):
    decision_set_id: str
    project_id: str
    stream_url: str
    previous_decision_set: str | None = None


class EventView(BaseModel):
    seq: int
    key: str
    type: str
    payload: dict[str, Any]


class EventsView(BaseModel):
    decision_set_id: str
    project_id: str
    status: str | None
    done: bool
    events: list[EventView]


class ArtifactView(BaseModel):
    path: str
    kind: str
    digest: str
    size_bytes: int | None = None
    download_url: str | None = Field(
        None, description="GET it for a signed URL of the archive (archives only)"
    )
    validation: Literal["passed", "failed"] | None = Field(
        None,
        description="archives: 'failed' when the tree it holds failed a validator (the "
        "archive is still served, marked as failing), else 'passed'",
    )


class DecisionSetView(BaseModel):
    decision_set_id: str
    project_id: str
    workflow_id: str
    run_status: str | None = Field(description="The pipeline's Temporal status; None: no run")
    live: DesignStatus | None = Field(
        None, description="Query status of a running pipeline: phase, node, questions, round"
    )
    stored: dict[str, Any] | None = Field(
        None, description="The decision set row: version, status, parent, constraints, plan"
    )
    cost: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    diff: dict[str, Any] | None = None
    repairs: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The repair rounds after failed validators: round, validators failed "
        "before it, findings, files changed, validators after (as ``design show``)",
    )
    nodes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Per node, the provider and model that answered it (``rules``: none)",
    )
    artifacts: list[ArtifactView] = Field(default_factory=list)
    smoke: dict[str, Any] | None = Field(
        None,
        description="The smoke validator of the last validation (make smoke in the jail): "
        "status, summary, steps, metrics, one prediction per serving entry point (input and "
        "output) and the drift report over the served rows; None: no validation report",
    )


class AnswersBody(_Body):
    answers: dict[str, Any] = Field(min_length=1, description="{Constraint Schema field: value}")


class ApproveBody(_Body):
    status: Literal["approve", "reject"]
    comment: str = Field(default="", max_length=4000)


class GenerateBody(_Body):
    """Options of the codegen decision set; its constraints come from the planned one."""

    require_approval: bool = Field(
        default=False,
        description="Open a gate again. False: only if policy fails or the cost moved "
        "over the threshold (the plan was approved on the planned decision set)",
    )
    approvers: list[str] = Field(default_factory=list)
    webhook_url: str | None = None
    validators: list[str] | None = Field(
        default=None,
        description=DesignOptions.model_fields["validators"].description,
        examples=[["ruff", "hcl", "wiring"]],
    )

    @field_validator("validators")
    @classmethod
    def _validators(cls, v: list[str] | None) -> list[str] | None:
        return selected_validators(v)


class DownloadLink(BaseModel):
    url: str
    expires_at: datetime
    digest: str
    size_bytes: int | None = None
    validation: Literal["passed", "failed"] = Field(
        "passed",
        description="'failed': the archived tree failed the validators named in "
        "failed_validators; the download also says so (X-Keel-Validation, file name)",
    )
    failed_validators: list[str] = Field(default_factory=list)


class DesignPolicyView(BaseModel):
    """The organisation's design policy as the next run will read it."""

    source: str
    policy: PolicySettings
