"""Golden runs of the pure pipeline on frozen requirement texts (plan §21.9, §23.7).

Each case in ``design_golden/`` holds a requirement text and the constraints an
extractor must produce from it; these tests run coverage, planner, critics and policy
on those constraints and check the frozen expectations.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from keel.design.constraints import parse_constraints
from keel.design.coverage import Coverage, IntakeSnapshot, coverage_check
from keel.design.critics import (
    CostEstimate,
    TechReview,
    estimate_plan_cost,
    review_plan,
)
from keel.design.patterns import MANDATORY_CAPABILITIES
from keel.design.planner import Plan, plan
from keel.design.policy import PolicyReport, evaluate_policy
from tests.design.unit.design_data import catalog, golden_cases, prices

CASES = golden_cases()
REQUIRED = {
    "batch_training",
    "online_serving_slo",
    "streaming_features",
    "rag",
    "hipaa_one_region",
}


def test_the_five_required_cases_and_a_broken_one_are_frozen() -> None:
    assert set(CASES) >= REQUIRED
    assert any(case["expect"].get("overall") == "fail" for case in CASES.values())


def _run(case: dict[str, Any]) -> tuple[Coverage, Plan, TechReview, CostEstimate, PolicyReport]:
    c = parse_constraints(case["constraints"])
    cov = coverage_check(IntakeSnapshot(constraints=c))
    p = plan(c, catalog())
    review = review_plan(c, p, catalog())
    cost = estimate_plan_cost(p, catalog(), c, prices())
    return cov, p, review, cost, evaluate_policy(c, p, catalog(), cost, review)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_case(name: str) -> None:
    case = CASES[name]
    expect = case["expect"]
    assert case["text"].strip()
    cov, p, review, cost, policy = _run(case)
    # Every output survives a JSON round trip through its own schema.
    for model in (cov, p, review, cost, policy):
        assert type(model).model_validate_json(model.model_dump_json()) == model
    assert cov.score == 1.0
    assert [c.id for c in cov.conflicts] == expect.get("conflicts", [])
    assert cost.unpriced == [] and cost.monthly_usd > 0
    gaps = expect.get("gaps", [])
    assert [g.capability.value for g in p.gaps] == gaps
    present = {c.value for c in p.capabilities()}
    assert present == {c.value for c in MANDATORY_CAPABILITIES} - set(gaps)
    assert set(expect.get("patterns", [])) <= set(p.pattern_ids())
    if "overall_not" in expect:
        assert policy.overall != expect["overall_not"], policy.rules
    if "overall" in expect:
        assert policy.overall == expect["overall"]
        failing = sorted(r.id for r in policy.rules if r.status == "fail")
        assert failing == sorted(expect["failing_rules"])


def test_hipaa_case_uses_only_hipaa_eligible_services_in_its_region() -> None:
    _, p, _, cost, policy = _run(CASES["hipaa_one_region"])
    by_id = catalog().by_id()
    assert all("hipaa" in {x.value for x in by_id[i].compliance} for i in p.pattern_ids())
    assert {line.region for line in cost.breakdown} == {"us-east-1"}
    assert policy.status_of("data_residency") == "pass"
    assert policy.status_of("data_class") == "pass"


def test_golden_runs_are_deterministic() -> None:
    for case in CASES.values():
        assert _run(case) == _run(case)


def _round_trip(value: Any) -> Any:
    conv = pydantic_data_converter.payload_converter
    return conv.from_payloads(conv.to_payloads([value]), [type(value)])[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_survive_temporals_pydantic_converter(name: str) -> None:
    """The workflow will carry these models in history; they must come back equal."""
    for model in _run(CASES[name]):
        assert _round_trip(model) == model
    assert _round_trip(prices()) == prices()
