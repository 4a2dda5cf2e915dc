from __future__ import annotations

from typing import Any

import pytest

from keel.design.constraints import parse_constraints
from keel.design.critics import CostEstimate, estimate_plan_cost, review_plan
from keel.design.planner import plan
from keel.design.policy import PolicyReport, PolicySettings, evaluate_policy, gate_required
from tests.design.unit.design_data import catalog, prices

BASE: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "medium",
    "data_classification": "internal",
    "workload_types": ["batch"],
}


def report(
    data: dict[str, Any], settings: PolicySettings | None = None, **cost: Any
) -> PolicyReport:
    c = parse_constraints(data)
    p = plan(c, catalog())
    est = estimate_plan_cost(p, catalog(), c, prices())
    if cost:
        est = est.model_copy(update=cost)
    return evaluate_policy(c, p, catalog(), est, review_plan(c, p, catalog()), settings)


def test_clean_batch_plan_passes_every_rule() -> None:
    r = report(BASE)
    assert r.overall == "pass", r.rules
    assert set(r.summary()) == {
        "mandatory_capabilities", "budget_band", "region_policy", "data_class",
        "data_residency", "latency_slo", "availability", "tech_risks",
        "cloud_policy", "required_compliance",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("change", "rule", "status"),
    [
        ({"regions": []}, "region_policy", "fail"),
        ({"data_classification": None}, "data_class", "fail"),
        ({"budget_band": None}, "budget_band", "warn"),
        (
            {
                "budget_band": "low",
                "workload_types": ["online", "streaming"],
                "throughput": {"data_gb_per_day": 1000, "requests_per_s": 500},
            },
            "budget_band",
            "fail",
        ),
        ({"compliance": ["gdpr"], "regions": ["us-east-1"]}, "region_policy", "fail"),
        (
            {"compliance": ["hipaa"], "regions": ["us-east-1", "us-west-2"]},
            "data_residency",
            "warn",
        ),
        ({"data_classification": "restricted"}, "data_class", "warn"),
        ({"workload_types": ["online"]}, "latency_slo", "warn"),
        ({"workload_types": ["online"], "sla_latency_ms": 5}, "latency_slo", "fail"),
        ({"workload_types": ["online"], "sla_latency_ms": 5}, "mandatory_capabilities", "fail"),
        ({"workload_types": ["online"], "sla_latency_ms": 300}, "latency_slo", "pass"),
    ],
)
def test_rule_outcomes(change: dict[str, Any], rule: str, status: str) -> None:
    r = report({**BASE, **change})
    assert r.status_of(rule) == status, r.rules
    worst = max(["pass", "warn", "fail"].index(x.status) for x in r.rules)
    assert r.overall == ["pass", "warn", "fail"][worst]


def test_allowed_regions_setting() -> None:
    settings = PolicySettings(allowed_regions=["eu-central-1"])
    r = report(BASE, settings)
    assert r.status_of("region_policy") == "fail"
    assert "eu-west-1" in next(x.detail for x in r.rules if x.id == "region_policy")


def test_budget_warns_near_the_ceiling_and_when_lines_are_unpriced() -> None:
    assert report(BASE, monthly_usd=4500.0).status_of("budget_band") == "warn"
    assert report(BASE, monthly_usd=5000.01).status_of("budget_band") == "fail"
    unpriced = [{"service": "x", "qty": "1 h", "pattern_id": "a:b", "reason": "no price"}]
    r = report(BASE, unpriced=unpriced)
    assert r.status_of("budget_band") == "warn"
    assert "lower bound" in next(x.detail for x in r.rules if x.id == "budget_band")


def _cost(delta_usd: float | None, delta_pct: float | None) -> CostEstimate:
    return CostEstimate(
        monthly_usd=1000.0,
        breakdown=[],
        method="bom_v1",
        delta_vs_prev_usd=delta_usd,
        delta_vs_prev_pct=delta_pct,
    )


@pytest.mark.parametrize(
    ("delta_usd", "delta_pct", "required"),
    [
        (None, None, False),
        (100.0, 10.0, False),
        (500.0, 20.0, False),
        (500.01, 5.0, True),
        (50.0, 20.1, True),
        (-900.0, -47.0, False),
    ],
)
def test_gate_required_on_cost_delta(
    delta_usd: float | None, delta_pct: float | None, required: bool
) -> None:
    passing = report(BASE)
    decision = gate_required(_cost(delta_usd, delta_pct), passing, PolicySettings())
    assert decision.required is required
    assert len(decision.reasons) == (1 if required else 0)


def test_gate_required_when_policy_fails() -> None:
    failing = report({**BASE, "regions": []})
    decision = gate_required(_cost(None, None), failing)
    assert decision.required
    assert decision.reasons == ["policy fails: region_policy"]
