"""The Constraint Schema (plan §20): what the intake extractor fills and the planner reads.

Every field is optional because the extractor fills only what the requirement text says;
``None`` (or an empty list) means "not stated", which the coverage check counts as
missing. The field names and enums are the plan's starter fields, so a model prompted with
the plan's schema and this JSON schema agree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from keel.design.errors import ConstraintError, DesignIssue, issues_from_validation

# AWS-style region names (eu-west-1, us-gov-east-1); GCP and Azure names fit the same
# lower-case, dash-separated shape closely enough for the clouds we plan for.
REGION_RE = re.compile(r"^[a-z]{2,}(-[a-z0-9]+)+$")


class Cloud(StrEnum):
    AWS = "aws"
    GCP = "gcp"
    AZURE = "azure"


class BudgetBand(StrEnum):
    """Monthly run-cost bands; :data:`BUDGET_BAND_CEILING_USD` gives each one's ceiling."""

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"
    ENTERPRISE = "enterprise"


# The ceilings the policy engine compares the cost estimate against.
BUDGET_BAND_CEILING_USD: dict[BudgetBand, float] = {
    BudgetBand.LOW: 1_000.0,
    BudgetBand.MEDIUM: 5_000.0,
    BudgetBand.HIGH: 25_000.0,
    BudgetBand.ENTERPRISE: 100_000.0,
}


class DataClassification(StrEnum):
    PUBLIC = "public"
    INTERNAL = "internal"
    CONFIDENTIAL = "confidential"
    RESTRICTED = "restricted"


class WorkloadType(StrEnum):
    BATCH = "batch"
    STREAMING = "streaming"
    ONLINE = "online"


class DeploymentPref(StrEnum):
    SERVERLESS = "serverless"
    CONTAINERS = "containers"


class Compliance(StrEnum):
    GDPR = "gdpr"
    HIPAA = "hipaa"
    PCI_DSS = "pci_dss"
    SOC2 = "soc2"


class Throughput(BaseModel):
    """Load the system must carry; any part may be unknown."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Upper bounds keep every cost formula finite and exact to the cent (Decimal's 28
    # digits): far beyond any workload this service plans for.
    requests_per_s: float | None = Field(default=None, ge=0, le=1e8)
    events_per_s: float | None = Field(default=None, ge=0, le=1e9)
    data_gb_per_day: float | None = Field(default=None, ge=0, le=1e6)

    def is_empty(self) -> bool:
        return (
            self.requests_per_s is None
            and self.events_per_s is None
            and (self.data_gb_per_day is None)
        )


class TeamConstraints(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    languages: list[str] = Field(default_factory=list)
    skills: list[str] = Field(default_factory=list)


class Constraints(BaseModel):
    """The plan's §20 Constraint Schema, field for field."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: Cloud | None = None
    regions: list[str] = Field(default_factory=list)
    budget_band: BudgetBand | None = None
    data_classification: DataClassification | None = None
    sla_latency_ms: int | None = Field(default=None, gt=0, le=600_000)
    availability_target: float | None = Field(
        default=None, ge=90.0, lt=100.0, description="Percent, e.g. 99.9."
    )
    throughput: Throughput | None = None
    workload_types: list[WorkloadType] = Field(default_factory=list)
    deployment_pref: DeploymentPref | None = None
    storage_prefs: list[str] = Field(default_factory=list)
    observability_prefs: list[str] = Field(default_factory=list)
    team_constraints: TeamConstraints | None = None
    existing_stack: list[str] = Field(default_factory=list)
    compliance: list[Compliance] = Field(default_factory=list)
    # Workload inputs of the cost estimate (issue 24 §2); not among the coverage fields.
    retention_days: int | None = Field(
        default=None, ge=1, le=36_500, description="How long data is kept, in days."
    )
    training_runs_per_month: float | None = Field(
        default=None, ge=0, le=10_000, description="Training cadence: runs per month."
    )
    # Issue 38 §3: whether the generated repository sets up the account's baseline (its
    # one-per-account, per-region settings: Lake Formation admins, the AWS Config recorder
    # and delivery channel, Macie, the Glue Data Catalog's encryption). Off (None or
    # False): the repository creates none of them, so two designs deploy side by side in
    # one account; the organisation's policy (``account_baseline`` in policy.yaml) can turn
    # it on for every design. Not a coverage field.
    account_baseline: bool | None = Field(
        default=None,
        description="Set up the account-wide baseline (Lake Formation admins, AWS Config "
        "recorder, Macie, Glue catalog encryption); only one deployment per account may.",
    )

    @field_validator("regions")
    @classmethod
    def _regions_shape(cls, value: list[str]) -> list[str]:
        bad = [r for r in value if not REGION_RE.match(r)]
        if bad:
            raise ValueError(f"not a region name: {', '.join(bad)} (expected e.g. eu-west-1)")
        # Order and repeats carry no meaning; dropping them keeps digests stable.
        return sorted(set(value))

    @field_validator("workload_types", "compliance")
    @classmethod
    def _dedupe_enums(cls, value: list[Any]) -> list[Any]:
        return sorted(set(value))

    @field_validator("storage_prefs", "observability_prefs", "existing_stack")
    @classmethod
    def _normalise_words(cls, value: list[str]) -> list[str]:
        return sorted({v.strip().lower() for v in value if v.strip()})


FIELD_NAMES: tuple[str, ...] = tuple(Constraints.model_fields)


def parse_constraints(data: Mapping[str, Any]) -> Constraints:
    """Validate a dict (from an extractor or a form) into :class:`Constraints`.

    Raises :class:`ConstraintError` whose issues name each offending field, including
    fields the schema does not have.
    """
    try:
        return Constraints.model_validate(dict(data))
    except ValidationError as exc:
        raise ConstraintError(issues_from_validation(exc)) from None


def is_stated(constraints: Constraints, field: str) -> bool:
    """Whether ``field`` carries a value (an empty list or empty sub-model is unstated)."""
    value = getattr(constraints, field)
    if value is None:
        return False
    if isinstance(value, list):
        return bool(value)
    if isinstance(value, Throughput):
        return not value.is_empty()
    if isinstance(value, TeamConstraints):
        return bool(value.languages or value.skills)
    return True


def check_field_name(field: str) -> None:
    """Refuse a name that is not a Constraint Schema field."""
    if field not in Constraints.model_fields:
        raise ConstraintError([DesignIssue(field=field, message="no such constraint field")])
