"""Policy rules over constraints, plan, cost and risks (§21.1 node 7, §22.2, §23.5).

Each rule returns pass, warn or fail with a one-line detail; the report's ``overall`` is
the worst of them, in the §22.2 Policy Results shape. :func:`gate_required` decides when a
human must approve before codegen: a cost rise over the configured USD or percent
threshold against the previous decision set, or a failing policy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import (
    BUDGET_BAND_CEILING_USD,
    Cloud,
    Compliance,
    Constraints,
    DataClassification,
    WorkloadType,
)
from keel.design.critics import CostEstimate, TechReview
from keel.design.patterns import MANDATORY_CAPABILITIES, Capability, PatternCatalog
from keel.design.planner import Plan

Status = Literal["pass", "warn", "fail"]
_RANK: dict[Status, int] = {"pass": 0, "warn": 1, "fail": 2}


class PolicySettings(BaseModel):
    """Organisation-wide knobs, not per-request constraints: ``configs/design/policy.yaml``
    (``KEEL_DESIGN_POLICY``), read by ``design.load`` (docs/design.md, "Organisation
    policy"). ``None`` for a list means no limit; the defaults are what runs got before
    the file existed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed_regions: list[str] | None = None
    allowed_clouds: list[Cloud] | None = Field(
        default=None, description="clouds a plan may use; None: any"
    )
    required_compliance: list[Compliance] = Field(
        default_factory=list,
        description="regimes every service of every plan must be eligible for, whatever "
        "the request states (e.g. soc2 for a SOC 2 organisation)",
    )
    account_baseline: bool = Field(
        default=False,
        description="every generated repository sets up the account's baseline (Lake "
        "Formation admins, AWS Config recorder, Macie, Glue catalog encryption): for an "
        "organisation that gives each design an account of its own. Off: only a request "
        "whose constraints ask for it gets it",
    )
    budget_warn_ratio: float = Field(default=0.8, gt=0, le=1)
    gate_delta_usd: float = Field(default=500.0, ge=0)
    gate_delta_pct: float = Field(default=20.0, ge=0)


class RuleResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    status: Status
    detail: str


class PolicyReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[RuleResult]
    overall: Status

    def status_of(self, rule_id: str) -> Status | None:
        return next((r.status for r in self.rules if r.id == rule_id), None)

    def summary(self) -> dict[str, Status]:
        """``{rule id: status}``, the Reason Card's ``policy_results``."""
        return {r.id: r.status for r in self.rules}


@dataclass(frozen=True)
class PolicyInput:
    constraints: Constraints
    plan: Plan
    catalog: PatternCatalog
    cost: CostEstimate
    review: TechReview
    settings: PolicySettings


def _r(rule_id: str, status: Status, detail: str) -> RuleResult:
    return RuleResult(id=rule_id, status=status, detail=detail)


def rule_mandatory_capabilities(i: PolicyInput) -> RuleResult:
    missing = [c.value for c in MANDATORY_CAPABILITIES if c not in i.plan.capabilities()]
    if missing:
        return _r("mandatory_capabilities", "fail", "no pattern for " + ", ".join(missing))
    return _r("mandatory_capabilities", "pass", f"all {len(MANDATORY_CAPABILITIES)} present")


def rule_budget_band(i: PolicyInput) -> RuleResult:
    band = i.constraints.budget_band
    est = i.cost.monthly_usd
    unpriced = f"; {len(i.cost.unpriced)} line(s) unpriced" if i.cost.unpriced else ""
    if band is None:
        return _r("budget_band", "warn", f"no budget band stated; est ${est:,.2f}{unpriced}")
    ceiling = BUDGET_BAND_CEILING_USD[band]
    if est > ceiling:
        return _r("budget_band", "fail", f"est ${est:,.2f} > {band.value} band ${ceiling:,.0f}")
    if est > ceiling * i.settings.budget_warn_ratio:
        return _r(
            "budget_band",
            "warn",
            f"est ${est:,.2f} within {100 * (1 - i.settings.budget_warn_ratio):.0f}% of "
            f"{band.value} band ${ceiling:,.0f}{unpriced}",
        )
    if unpriced:
        return _r("budget_band", "warn", f"est ${est:,.2f} is a lower bound{unpriced}")
    return _r("budget_band", "pass", f"est ${est:,.2f} <= {band.value} band ${ceiling:,.0f}")


def rule_region_policy(i: PolicyInput) -> RuleResult:
    regions = i.plan.regions
    if not regions:
        return _r("region_policy", "fail", "no region stated; data location is unknown")
    allowed = i.settings.allowed_regions
    if allowed is not None:
        outside = [r for r in regions if r not in allowed]
        if outside:
            return _r("region_policy", "fail", "not allowed: " + ", ".join(outside))
    if Compliance.GDPR in i.constraints.compliance:
        outside_eu = [r for r in regions if not r.startswith("eu-")]
        if outside_eu:
            return _r("region_policy", "fail", "GDPR data outside the EU: " + ", ".join(outside_eu))
    return _r("region_policy", "pass", "all resources in " + ", ".join(regions))


def rule_cloud_policy(i: PolicyInput) -> RuleResult:
    allowed = i.settings.allowed_clouds
    if allowed is not None and i.plan.cloud not in allowed:
        listed = ", ".join(c.value for c in allowed) or "none"
        return _r(
            "cloud_policy", "fail", f"{i.plan.cloud.value} is not allowed (allowed: {listed})"
        )
    return _r("cloud_policy", "pass", f"{i.plan.cloud.value}")


def _not_eligible(i: PolicyInput, regime: Compliance) -> list[str]:
    """The plan's catalogue patterns not eligible for ``regime``."""
    by_id = i.catalog.by_id()
    return [
        pid for pid in i.plan.pattern_ids() if pid in by_id and regime not in by_id[pid].compliance
    ]


def rule_required_compliance(i: PolicyInput) -> RuleResult:
    required = i.settings.required_compliance
    if not required:
        return _r("required_compliance", "pass", "the organisation requires no regime")
    for regime in required:
        not_eligible = _not_eligible(i, regime)
        if not_eligible:
            return _r(
                "required_compliance",
                "fail",
                f"the organisation requires {regime.value}; not eligible: "
                + ", ".join(not_eligible),
            )
    return _r("required_compliance", "pass", "eligible for " + ", ".join(r.value for r in required))


def rule_data_class(i: PolicyInput) -> RuleResult:
    c = i.constraints
    if c.data_classification is None:
        return _r("data_class", "fail", "no data classification stated")
    for regime in c.compliance:
        not_eligible = _not_eligible(i, regime)
        if not_eligible:
            return _r(
                "data_class",
                "fail",
                f"{regime.value} data in non-eligible services: " + ", ".join(not_eligible),
            )
    if c.data_classification == DataClassification.RESTRICTED and not c.compliance:
        return _r("data_class", "warn", "restricted data but no compliance regime named")
    regimes = ", ".join(x.value for x in c.compliance) or "no regime"
    return _r("data_class", "pass", f"{c.data_classification.value} data, {regimes}")


def rule_data_residency(i: PolicyInput) -> RuleResult:
    c = i.constraints
    regulated = [x.value for x in c.compliance if x in (Compliance.HIPAA, Compliance.GDPR)]
    if regulated and len(i.plan.regions) > 1:
        return _r(
            "data_residency",
            "warn",
            f"{', '.join(regulated)} data replicated across {len(i.plan.regions)} regions",
        )
    return _r("data_residency", "pass", f"{len(i.plan.regions) or 'no'} region(s)")


def rule_latency_slo(i: PolicyInput) -> RuleResult:
    c = i.constraints
    if WorkloadType.ONLINE not in i.plan.workloads:
        return _r("latency_slo", "pass", "no online workload")
    if c.sla_latency_ms is None:
        return _r("latency_slo", "warn", "online workload without a latency SLO")
    serve = i.plan.choice_for(Capability.SERVE)
    pattern = i.catalog.by_id().get(serve.pattern_id) if serve else None
    if pattern is None or pattern.p95_latency_ms is None:
        return _r("latency_slo", "fail", f"no serving pattern meets p95<={c.sla_latency_ms}ms")
    if pattern.p95_latency_ms > c.sla_latency_ms:
        return _r(
            "latency_slo",
            "fail",
            f"{pattern.id} p95 {pattern.p95_latency_ms}ms > {c.sla_latency_ms}ms",
        )
    return _r("latency_slo", "pass", f"p95 {pattern.p95_latency_ms}ms<={c.sla_latency_ms}ms")


def rule_availability(i: PolicyInput) -> RuleResult:
    target = i.constraints.availability_target
    if target is None:
        return _r("availability", "pass", "no availability target stated")
    by_id = i.catalog.by_id()
    serve = i.plan.choice_for(Capability.SERVE)
    pattern = by_id.get(serve.pattern_id) if serve else None
    if pattern is None:
        return _r("availability", "fail", f"nothing serves to reach {target}%")
    if pattern.availability < target:
        return _r(
            "availability", "fail", f"{pattern.id} {pattern.availability}% < {target}% target"
        )
    return _r("availability", "pass", f"{pattern.id} {pattern.availability}% >= {target}%")


def rule_tech_risks(i: PolicyInput) -> RuleResult:
    high = [r.id for r in i.review.risks if r.severity == "high"]
    if high:
        return _r("tech_risks", "warn", f"{len(high)} high risk(s): " + ", ".join(high))
    return _r("tech_risks", "pass", f"{len(i.review.risks)} risk(s), none high")


RULES: tuple[Callable[[PolicyInput], RuleResult], ...] = (
    rule_mandatory_capabilities,
    rule_budget_band,
    rule_region_policy,
    rule_data_class,
    rule_data_residency,
    rule_latency_slo,
    rule_availability,
    rule_tech_risks,
    rule_cloud_policy,
    rule_required_compliance,
)
#: The rules that read only the plan, constraints and settings (no cost, no risks): the
#: guardrail that checks a model's proposed plan (keel.design.agents).
STRUCTURAL_RULES: tuple[Callable[[PolicyInput], RuleResult], ...] = (
    rule_mandatory_capabilities,
    rule_region_policy,
    rule_data_class,
    rule_latency_slo,
    rule_availability,
    rule_cloud_policy,
    rule_required_compliance,
)


def evaluate_policy(
    constraints: Constraints,
    plan: Plan,
    catalog: PatternCatalog,
    cost: CostEstimate,
    review: TechReview,
    settings: PolicySettings | None = None,
) -> PolicyReport:
    """Run every rule in :data:`RULES`; ``overall`` is the worst status."""
    i = PolicyInput(constraints, plan, catalog, cost, review, settings or PolicySettings())
    results = [rule(i) for rule in RULES]
    overall = max((r.status for r in results), key=lambda s: _RANK[s])
    return PolicyReport(rules=results, overall=overall)


def structural_failures(
    constraints: Constraints,
    plan: Plan,
    catalog: PatternCatalog,
    settings: PolicySettings | None = None,
) -> dict[str, str]:
    """``{rule id: detail}`` of the :data:`STRUCTURAL_RULES` that fail for ``plan``."""
    empty_cost = CostEstimate(monthly_usd=0.0, breakdown=[], method="-")
    i = PolicyInput(
        constraints, plan, catalog, empty_cost, TechReview(risks=[]), settings or PolicySettings()
    )
    results = (rule(i) for rule in STRUCTURAL_RULES)
    return {r.id: r.detail for r in results if r.status == "fail"}


def structural_results(
    constraints: Constraints,
    plan: Plan,
    catalog: PatternCatalog,
    settings: PolicySettings | None = None,
) -> dict[str, Status]:
    """``{rule id: status}`` of the :data:`STRUCTURAL_RULES` (a planner's card's
    ``policy_results``, before cost and risks are known)."""
    empty_cost = CostEstimate(monthly_usd=0.0, breakdown=[], method="-")
    i = PolicyInput(
        constraints, plan, catalog, empty_cost, TechReview(risks=[]), settings or PolicySettings()
    )
    return {r.id: r.status for r in (rule(i) for rule in STRUCTURAL_RULES)}


def wants_account_baseline(constraints: Constraints, settings: PolicySettings | None) -> bool:
    """Whether the generated repository sets up the account's baseline (issue 38 §3): the
    constraints ask for it, or the organisation's policy does for every design."""
    return bool(constraints.account_baseline) or bool(settings and settings.account_baseline)


def with_account_baseline(constraints: Constraints, settings: PolicySettings | None) -> Constraints:
    """``constraints`` with ``account_baseline`` on when :func:`wants_account_baseline`
    says so (the codegen request carries the constraints, not the policy settings)."""
    if wants_account_baseline(constraints, settings) and not constraints.account_baseline:
        return constraints.model_copy(update={"account_baseline": True})
    return constraints


def policy_from_yaml(data: object) -> PolicySettings:
    """The organisation policy file's parsed YAML (``policy:`` mapping or the fields at the
    top level) as :class:`PolicySettings`; raises ``ValueError`` naming the field."""
    if data is None:
        return PolicySettings()
    if not isinstance(data, dict):
        raise ValueError("the policy file must be a mapping")
    body = data.get("policy", data) if "policy" in data else data
    body = {k: v for k, v in body.items() if k != "version"}
    return PolicySettings.model_validate(body)


class GateDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    required: bool
    reasons: list[str]


def gate_required(
    cost: CostEstimate, policy: PolicyReport, settings: PolicySettings | None = None
) -> GateDecision:
    """Whether codegen must wait for a human (§23.5): Δcost over either threshold, or a
    failing policy. Cost falls never force the gate."""
    s = settings or PolicySettings()
    reasons: list[str] = []
    if cost.delta_vs_prev_usd is not None and cost.delta_vs_prev_usd > s.gate_delta_usd:
        reasons.append(f"cost up ${cost.delta_vs_prev_usd:,.2f} > ${s.gate_delta_usd:,.2f}")
    if cost.delta_vs_prev_pct is not None and cost.delta_vs_prev_pct > s.gate_delta_pct:
        reasons.append(f"cost up {cost.delta_vs_prev_pct:g}% > {s.gate_delta_pct:g}%")
    if policy.overall == "fail":
        failing = [r.id for r in policy.rules if r.status == "fail"]
        reasons.append("policy fails: " + ", ".join(failing))
    return GateDecision(required=bool(reasons), reasons=reasons)
