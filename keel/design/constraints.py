"""The Constraint Schema (plan §20): what the intake extractor fills and the planner reads.

Every field is optional because the extractor fills only what the requirement text says;
``None`` (or an empty list) means "not stated", which the coverage check counts as
missing. The field names and enums are the plan's starter fields, so a model prompted with
the plan's schema and this JSON schema agree.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

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


class Task(StrEnum):
    """What the generated pipeline learns from the data (issue 38 §2)."""

    CLASSIFICATION = "classification"
    REGRESSION = "regression"
    FORECASTING = "forecasting"
    RETRIEVAL = "retrieval"


class ColumnType(StrEnum):
    """A column's type: numbers and integers are scaled, categories and booleans one-hot
    encoded, text is what retrieval indexes."""

    NUMBER = "number"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    CATEGORY = "category"
    TEXT = "text"


#: Column names the generated records carry themselves (each record's id and time).
RESERVED_COLUMNS: frozenset[str] = frozenset({"event_id", "ts"})
IDENTIFIER_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
#: The most columns, categories and sample bytes a data spec may hold.
MAX_COLUMNS = 200
MAX_CATEGORIES = 50
MAX_SAMPLE_CSV_CHARS = 200_000
# The target type each task can learn.
_TARGET_TYPES: dict[Task, frozenset[ColumnType]] = {
    Task.CLASSIFICATION: frozenset({ColumnType.BOOLEAN, ColumnType.CATEGORY, ColumnType.INTEGER}),
    Task.REGRESSION: frozenset({ColumnType.NUMBER, ColumnType.INTEGER}),
    Task.FORECASTING: frozenset({ColumnType.NUMBER, ColumnType.INTEGER}),
    Task.RETRIEVAL: frozenset({ColumnType.TEXT}),
}


class Column(BaseModel):
    """One column of the user's data: a snake_case name, a type and, for a category,
    the values it takes (optional: the generated sample then uses ``a``, ``b``, ``c``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="snake_case identifier, e.g. monthly_spend")
    type: ColumnType
    categories: list[str] = Field(
        default_factory=list, max_length=MAX_CATEGORIES, description="a category's values"
    )

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not IDENTIFIER_RE.match(value):
            raise ValueError(
                f"column name {value!r} is not a snake_case identifier "
                "(lower-case letters, digits and _, not starting with a digit)"
            )
        if value in RESERVED_COLUMNS:
            raise ValueError(f"column name {value!r} is reserved (every record has it)")
        return value

    @field_validator("categories")
    @classmethod
    def _categories(cls, value: list[str]) -> list[str]:
        cleaned = [v.strip() for v in value]
        if any(not v or len(v) > 64 for v in cleaned):
            raise ValueError("a category value must be 1 to 64 characters")
        if len(set(cleaned)) != len(cleaned):
            raise ValueError("category values repeat")
        return cleaned

    @model_validator(mode="after")
    def _categories_only_for_categories(self) -> Column:
        if self.categories and self.type != ColumnType.CATEGORY:
            raise ValueError(f"column {self.name!r}: only a category column lists categories")
        if self.type == ColumnType.CATEGORY and len(self.categories) == 1:
            raise ValueError(f"column {self.name!r}: a category needs at least two values")
        return self


class DataSpec(BaseModel):
    """The user's data (issue 38 §2): its columns, the target column and the task. The
    generated repository's features, training, evaluation and serving follow it, and its
    synthetic sample is made from it. ``sample_csv``, when given, is a small sample of
    the real data (CSV text with a header row naming the columns); the repository ships
    it and lands it instead of the synthetic sample. ``time_column`` names the sample's
    column of dates or times (ISO 8601), not a feature: each row's record is dated by it,
    so a forecasting design's lag and rolling features follow the real series."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: Task
    columns: list[Column] = Field(min_length=1, max_length=MAX_COLUMNS)
    target: str | None = Field(
        default=None, description="the column to predict (retrieval: the text to index)"
    )
    sample_csv: str | None = Field(default=None, max_length=MAX_SAMPLE_CSV_CHARS)
    time_column: str | None = Field(
        default=None, description="the sample's date or time column (ISO 8601), not a feature"
    )

    @model_validator(mode="after")
    def _consistent(self) -> DataSpec:
        names = [c.name for c in self.columns]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"column names repeat: {', '.join(repeated)}")
        by_name = {c.name: c for c in self.columns}
        if self.target is None:
            if self.task != Task.RETRIEVAL:
                raise ValueError(f"a {self.task.value} task needs a target column")
        elif self.target not in by_name:
            raise ValueError(
                f"target {self.target!r} is not a column (columns: {', '.join(names)})"
            )
        else:
            kind = by_name[self.target].type
            if kind not in _TARGET_TYPES[self.task]:
                allowed = ", ".join(sorted(t.value for t in _TARGET_TYPES[self.task]))
                raise ValueError(
                    f"target {self.target!r} is {kind.value}; a {self.task.value} target "
                    f"must be {allowed}"
                )
        if self.task == Task.RETRIEVAL:
            if not any(c.type == ColumnType.TEXT for c in self.columns):
                raise ValueError("a retrieval task needs a text column to index")
        elif self.task != Task.FORECASTING and not self.feature_columns():
            raise ValueError(f"a {self.task.value} task needs a column besides the target")
        if self.time_column is not None:
            if self.sample_csv is None:
                raise ValueError("time_column names a column of sample_csv; there is none")
            if self.time_column in names:
                raise ValueError(
                    f"time_column {self.time_column!r} is also a column: it dates the "
                    "records and is not a feature"
                )
            if not IDENTIFIER_RE.match(self.time_column):
                raise ValueError(f"time_column {self.time_column!r} is not a snake_case name")
        if self.sample_csv is not None:
            _check_sample_header(
                self.sample_csv, names + ([self.time_column] if self.time_column else [])
            )
            if self.time_column is not None:
                _check_sample_times(self.sample_csv, self.time_column)
        return self

    def feature_columns(self) -> list[Column]:
        """The columns a model reads: all but the target and free text."""
        return [c for c in self.columns if c.name != self.target and c.type != ColumnType.TEXT]


def _check_sample_times(text: str, column: str) -> None:
    """Every row of the sample has an ISO 8601 date or time in ``column``."""
    for n, row in enumerate(csv.DictReader(io.StringIO(text)), 2):
        value = (row.get(column) or "").strip()
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"sample_csv line {n}: {column} is {value!r}, not an ISO 8601 date or time"
            ) from None


def _check_sample_header(text: str, names: list[str]) -> None:
    """The sample's header must name exactly the spec's columns (in any order)."""
    first = next((line for line in text.splitlines() if line.strip()), None)
    if first is None:
        raise ValueError("sample_csv is empty")
    header = next(csv.reader([first]))
    got = [h.strip() for h in header]
    missing = sorted(set(names) - set(got))
    extra = sorted(set(got) - set(names))
    if missing or extra:
        parts = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"not in the columns: {', '.join(extra)}"] if extra else []
        )
        raise ValueError(f"sample_csv header does not match the columns: {'; '.join(parts)}")


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
    # Issue 38 §2: the user's data shape (columns, target, task, optionally a small CSV
    # sample). Unstated: the generated repository trains on a synthetic sample of its
    # stated default schema and says so. Not a coverage field.
    data: DataSpec | None = Field(
        default=None,
        description="The data: columns (name, type), the target column and the task "
        "(classification, regression, forecasting, retrieval).",
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

#: The schema a design without a data spec is generated for, stated in its README (a
#: customer table with a churn label): the repository's synthetic sample is made from it.
DEFAULT_DATA_SPEC = DataSpec(
    task=Task.CLASSIFICATION,
    target="churned",
    columns=[
        Column(name="tenure_months", type=ColumnType.INTEGER),
        Column(name="monthly_spend", type=ColumnType.NUMBER),
        Column(name="support_tickets", type=ColumnType.INTEGER),
        Column(name="plan", type=ColumnType.CATEGORY, categories=["basic", "standard", "premium"]),
        Column(name="auto_renew", type=ColumnType.BOOLEAN),
        Column(name="churned", type=ColumnType.BOOLEAN),
    ],
)


def data_spec(constraints: Constraints) -> tuple[DataSpec, bool]:
    """The data spec a design is generated for, and whether the constraints stated it
    (False: :data:`DEFAULT_DATA_SPEC`)."""
    if constraints.data is not None:
        return constraints.data, True
    return DEFAULT_DATA_SPEC, False


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
