"""Constraint Coverage Score, conflicts and adaptive questions (plan §20, §21.1 nodes 2-3).

The score is the weighted share of the required fields that are stated and unambiguous.
An ambiguous field (the extractor saw it but could not pin it down) counts half. The
questioner then asks as few questions as it can: one per independent conflict, plus the
heaviest missing fields until the score would clear the threshold once answered.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import (
    FIELD_NAMES,
    BudgetBand,
    Cloud,
    Compliance,
    Constraints,
    DataClassification,
    DeploymentPref,
    WorkloadType,
    check_field_name,
    is_stated,
    parse_constraints,
)
from keel.design.errors import ConstraintError, DesignIssue

DEFAULT_THRESHOLD = 0.8

# Weights of the §20 required fields. The SLO only matters once an online workload is
# stated (or workloads are still unknown), so it joins the set conditionally.
REQUIRED_WEIGHTS: dict[str, float] = {
    "cloud": 1.0,
    "regions": 1.0,
    "budget_band": 1.0,
    "workload_types": 1.0,
    "data_classification": 1.0,
    "sla_latency_ms": 1.0,
}

AMBIGUOUS_CREDIT = 0.5


class Conflict(BaseModel):
    """Two or more stated constraints that cannot all hold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    fields: list[str]
    detail: str


class Coverage(BaseModel):
    """Result of the coverage check, the ``coverage`` state key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    score: float = Field(ge=0.0, le=1.0)
    threshold: float
    required: list[str]
    missing: list[str]
    ambiguous: list[str]
    conflicts: list[Conflict]
    unfit: dict[str, str] = Field(
        default_factory=dict,
        description="Fields the intake model stated in a form that did not fit, with why; "
        "asked once, whether required or not",
    )

    @property
    def covered(self) -> bool:
        """Enough to plan: over the threshold, free of conflicts, nothing left unfit."""
        return self.score >= self.threshold and not self.conflicts and not self.unfit


class IntakeSnapshot(BaseModel):
    """Constraints plus the extractor's notes on fields it found but could not pin down.

    ``ambiguous`` maps a field to why it is unclear ("'low latency' without a number").
    ``unfit`` maps a field the model's reply stated in a form the schema refused (an
    availability of 9.5 %) to why (``keel.design.intake``): the field is left unstated and
    asked about once; any round of answers clears it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    constraints: Constraints = Field(default_factory=Constraints)
    ambiguous: dict[str, str] = Field(default_factory=dict)
    unfit: dict[str, str] = Field(default_factory=dict)


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    text: str
    choices: list[str] = Field(default_factory=list)
    reason: str
    resolves: list[str] = Field(default_factory=list, description="conflict ids")


def required_fields(constraints: Constraints) -> list[str]:
    """The fields the score is taken over, in a fixed order."""
    wants_slo = not constraints.workload_types or WorkloadType.ONLINE in constraints.workload_types
    return [f for f in REQUIRED_WEIGHTS if f != "sla_latency_ms" or wants_slo]


def _hipaa_public(c: Constraints) -> Conflict | None:
    if Compliance.HIPAA in c.compliance and c.data_classification == DataClassification.PUBLIC:
        return Conflict(
            id="hipaa_public_data",
            fields=["compliance", "data_classification"],
            detail="HIPAA applies to health data, which cannot be classified public",
        )
    return None


def _slo_without_online(c: Constraints) -> Conflict | None:
    if (
        c.sla_latency_ms is not None
        and c.workload_types
        and WorkloadType.ONLINE not in c.workload_types
    ):
        return Conflict(
            id="slo_without_online",
            fields=["sla_latency_ms", "workload_types"],
            detail="a request latency SLO is given but no online workload is stated",
        )
    return None


def _low_budget_high_availability(c: Constraints) -> Conflict | None:
    if (
        c.budget_band == BudgetBand.LOW
        and c.availability_target is not None
        and c.availability_target >= 99.99
    ):
        return Conflict(
            id="budget_vs_availability",
            fields=["budget_band", "availability_target"],
            detail="99.99% availability needs multi-region redundancy a low budget "
            "band does not pay for",
        )
    return None


def _serverless_tight_slo(c: Constraints) -> Conflict | None:
    if (
        c.deployment_pref == DeploymentPref.SERVERLESS
        and c.sla_latency_ms is not None
        and c.sla_latency_ms < 50
    ):
        return Conflict(
            id="serverless_tight_slo",
            fields=["deployment_pref", "sla_latency_ms"],
            detail="serverless cold starts exceed a p95 SLO under 50 ms",
        )
    return None


def _gdpr_outside_eu(c: Constraints) -> Conflict | None:
    if (
        Compliance.GDPR in c.compliance
        and c.regions
        and not any(r.startswith("eu-") for r in c.regions)
    ):
        return Conflict(
            id="gdpr_no_eu_region",
            fields=["compliance", "regions"],
            detail="GDPR data residency is asked for but no EU region is named",
        )
    return None


def _conflict_rules() -> list[Callable[[Constraints], Conflict | None]]:
    return [
        _hipaa_public,
        _slo_without_online,
        _low_budget_high_availability,
        _serverless_tight_slo,
        _gdpr_outside_eu,
    ]


def find_conflicts(constraints: Constraints) -> list[Conflict]:
    """Every conflict among the stated constraints, in rule order."""
    found = (rule(constraints) for rule in _conflict_rules())
    return [c for c in found if c is not None]


def coverage_check(snapshot: IntakeSnapshot, threshold: float = DEFAULT_THRESHOLD) -> Coverage:
    """Score ``snapshot`` and list what is missing, ambiguous and in conflict."""
    c = snapshot.constraints
    required = required_fields(c)
    missing = [f for f in required if not is_stated(c, f)]
    ambiguous = sorted(f for f in snapshot.ambiguous if f in FIELD_NAMES)
    total = sum(REQUIRED_WEIGHTS[f] for f in required)
    got = 0.0
    for f in required:
        if f in missing:
            continue
        got += REQUIRED_WEIGHTS[f] * (AMBIGUOUS_CREDIT if f in ambiguous else 1.0)
    score = round(got / total, 4) if total else 1.0
    return Coverage(
        score=score,
        threshold=threshold,
        required=required,
        missing=missing,
        ambiguous=ambiguous,
        conflicts=find_conflicts(c),
        unfit={f: why for f, why in sorted(snapshot.unfit.items()) if f in FIELD_NAMES},
    )


_CHOICES: dict[str, list[str]] = {
    "cloud": [v.value for v in Cloud],
    "budget_band": [v.value for v in BudgetBand],
    "data_classification": [v.value for v in DataClassification],
    "workload_types": [v.value for v in WorkloadType],
    "deployment_pref": [v.value for v in DeploymentPref],
    "compliance": [v.value for v in Compliance],
}

_TEXT: dict[str, str] = {
    "cloud": "Which cloud should this run on?",
    "regions": "Which region or regions must the data and services stay in?",
    "budget_band": "What monthly run-cost band fits: low (<= $1k), medium (<= $5k), "
    "high (<= $25k) or enterprise?",
    "workload_types": "Which workloads: batch training/scoring, streaming, online serving?",
    "data_classification": "How is the data classified: public, internal, confidential "
    "or restricted (PII/PHI)?",
    "sla_latency_ms": "What p95 latency (ms) must online predictions meet?",
    "availability_target": "What availability target (percent, e.g. 99.9)?",
    "deployment_pref": "Serverless or containers?",
    "compliance": "Which compliance regimes apply (GDPR, HIPAA, PCI-DSS, SOC 2)?",
}


def _question(field: str, reason: str, resolves: list[str] | None = None) -> Question:
    return Question(
        field=field,
        text=_TEXT.get(field, f"Please state {field.replace('_', ' ')}."),
        choices=_CHOICES.get(field, []),
        reason=reason,
        resolves=resolves or [],
    )


def adaptive_questions(coverage: Coverage) -> list[Question]:
    """The fewest questions whose answers would leave ``coverage`` covered.

    Conflicts first: a greedy set cover picks the field shared by most unresolved
    conflicts, one question each. Then every field the model's reply did not fit (the
    reason says what it was read as). Then the missing or ambiguous fields with the largest
    weight gain, until the score projected from full answers reaches the threshold. Both
    orders are fixed, so the same coverage always asks the same questions.
    """
    questions: list[Question] = []
    asked: set[str] = set()
    open_conflicts = list(coverage.conflicts)
    while open_conflicts:
        counts: dict[str, int] = {}
        for conflict in open_conflicts:
            for f in conflict.fields:
                counts[f] = counts.get(f, 0) + 1
        field = max(sorted(counts), key=lambda f: counts[f])
        ids = [c.id for c in open_conflicts if field in c.fields]
        questions.append(_question(field, "resolves conflict " + ", ".join(ids), ids))
        asked.add(field)
        open_conflicts = [c for c in open_conflicts if field not in c.fields]
    for field, why in coverage.unfit.items():
        if field not in asked:
            questions.append(_question(field, f"unclear in the text: {why}"))
            asked.add(field)

    total = sum(REQUIRED_WEIGHTS[f] for f in coverage.required)
    projected = coverage.score * total
    gains: list[tuple[float, int, str]] = []
    order = {f: i for i, f in enumerate(coverage.required)}
    for f in coverage.required:
        if f in coverage.missing:
            gains.append((REQUIRED_WEIGHTS[f], order[f], f))
        elif f in coverage.ambiguous:
            gains.append((REQUIRED_WEIGHTS[f] * (1 - AMBIGUOUS_CREDIT), order[f], f))
    for f in asked:
        for gain, _, g in gains:
            if g == f:
                projected += gain
    gains.sort(key=lambda t: (-t[0], t[1]))
    # A small tolerance so 0.7999999 after float sums does not ask one question too many.
    target = coverage.threshold * total - 1e-9
    for gain, _, f in gains:
        if projected >= target:
            break
        if f in asked:
            continue
        kind = "missing" if f in coverage.missing else "ambiguous"
        questions.append(_question(f, f"{kind}; lifts coverage"))
        asked.add(f)
        projected += gain
    return questions


def apply_answers(snapshot: IntakeSnapshot, answers: Mapping[str, Any]) -> IntakeSnapshot:
    """Merge answers (field -> value) into the constraints; answered fields stop being
    ambiguous.

    An answer replaces the field's value; ``None`` withdraws it (a way out of a
    conflict). Raises :class:`ConstraintError` naming each
    unknown field or invalid value; the snapshot is unchanged then. The result has no
    ``unfit`` fields: those were asked once, and one left blank stays unstated.
    """
    issues: list[DesignIssue] = []
    for field in answers:
        try:
            check_field_name(field)
        except ConstraintError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConstraintError(issues)
    merged = snapshot.constraints.model_dump(mode="json")
    for field, value in answers.items():
        # None withdraws a statement; list fields withdraw to the empty list.
        if value is None and isinstance(merged.get(field), list):
            value = []
        merged[field] = value
    constraints = parse_constraints(merged)
    ambiguous = {f: why for f, why in snapshot.ambiguous.items() if f not in answers}
    return IntakeSnapshot(constraints=constraints, ambiguous=ambiguous)
