"""The five frozen constraint sets, and intake forms of other shapes, as codegen requests
built through the pure domain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from activities.design.codegen import CodeGenRequest
from keel.design.constraints import parse_constraints
from keel.design.critics import estimate_plan_cost, review_plan
from keel.design.planner import plan
from keel.design.policy import evaluate_policy
from keel.design.reasons import (
    critic_cost_card,
    critic_tech_card,
    design_rationale_md,
    node_idempotency_key,
    planner_cards,
)
from tests.design.unit.design_data import catalog, golden_cases, prices

#: The golden cases that should pass policy (the two "broken_*" ones are left out).
CASES = (
    "batch_training",
    "online_serving_slo",
    "streaming_features",
    "rag",
    "hipaa_one_region",
)
TS = "2026-01-01T00:00:00Z"

#: Guided-intake forms of different shapes (batch and streaming, online and RAG, one
#: region and three, low to high budget), beside the golden cases.
FORMS: dict[str, dict[str, Any]] = {
    "batch_one_region_low": {
        "cloud": "aws",
        "regions": ["eu-west-1"],
        "budget_band": "low",
        "data_classification": "internal",
        "workload_types": ["batch"],
        "throughput": {"data_gb_per_day": 50},
        "retention_days": 30,
        "training_runs_per_month": 4,
        "compliance": ["gdpr"],
    },
    "streaming_three_regions_high": {
        "cloud": "aws",
        "regions": ["us-east-1", "us-west-2", "eu-west-1"],
        "budget_band": "high",
        "data_classification": "confidential",
        "workload_types": ["streaming", "online"],
        "sla_latency_ms": 100,
        "throughput": {"events_per_s": 5000, "requests_per_s": 200, "data_gb_per_day": 500},
        "deployment_pref": "containers",
        "retention_days": 14,
        "training_runs_per_month": 30,
    },
    "online_rag_three_regions": {
        "cloud": "aws",
        "regions": ["eu-central-1", "eu-west-1", "eu-north-1"],
        "budget_band": "medium",
        "data_classification": "confidential",
        "workload_types": ["online"],
        "sla_latency_ms": 300,
        "deployment_pref": "serverless",
        "storage_prefs": ["vector"],
        "throughput": {"requests_per_s": 50, "data_gb_per_day": 5},
        "compliance": ["gdpr"],
    },
    "streaming_only_three_regions": {
        "cloud": "aws",
        "regions": ["us-east-1", "us-west-2", "eu-west-1"],
        "workload_types": ["streaming"],
        "throughput": {"events_per_s": 5000, "data_gb_per_day": 400},
        "budget_band": "high",
        "data_classification": "internal",
    },
    "empty_form": {},
    "kinesis_online_one_region": {
        "cloud": "aws",
        "regions": ["us-east-1"],
        "budget_band": "medium",
        "workload_types": ["streaming", "online"],
        "sla_latency_ms": 200,
        "deployment_pref": "serverless",
        "throughput": {"events_per_s": 500, "requests_per_s": 20},
    },
}


def request_for(case: str) -> CodeGenRequest:
    """Constraints → plan → review, cost, policy, cards → the codegen request."""
    return request_from(golden_cases()[case]["constraints"], case)


def request_for_form(name: str) -> CodeGenRequest:
    """The codegen request of :data:`FORMS`' ``name``."""
    return request_from(FORMS[name], name)


def request_from(form: Mapping[str, Any], case: str) -> CodeGenRequest:
    """The codegen request for an intake form (constraints as a mapping)."""
    constraints = parse_constraints(dict(form))
    cat = catalog()
    the_plan = plan(constraints, cat)
    review = review_plan(constraints, the_plan, cat)
    cost = estimate_plan_cost(the_plan, cat, constraints, prices())
    policy = evaluate_policy(constraints, the_plan, cat, cost, review)
    thread = f"design/{case}/ds-1"
    cards = [
        *planner_cards(
            the_plan,
            idempotency_key=node_idempotency_key(thread, "planner", case),
            constraints_keys=sorted(constraints.model_dump(exclude_defaults=True)),
            trigger="constraints_updated",
            ts=TS,
            policy=policy,
        ),
        critic_tech_card(
            review,
            idempotency_key=node_idempotency_key(thread, "critic_tech", case),
            trigger="constraints_updated",
            ts=TS,
        ),
        critic_cost_card(
            cost,
            idempotency_key=node_idempotency_key(thread, "critic_cost", case),
            trigger="constraints_updated",
            ts=TS,
        ),
    ]
    return CodeGenRequest(
        project=case.replace("_", "-"),
        decision_set="ds-1",
        plan=the_plan,
        constraints=constraints,
        rationale_md=design_rationale_md(the_plan, cards, policy, cost),
        cost=cost,
        policy=policy,
        reason_cards=cards,
        catalog=cat,
    )


def with_patterns(req: CodeGenRequest, *pattern_ids: str) -> CodeGenRequest:
    """``req`` with each of ``pattern_ids`` chosen for its capability (the id's prefix)
    in place of the planner's choice; the rest of the request as it was (the cost is not
    estimated again: see ``test_cost_coverage`` for a re-priced swap)."""
    swaps = {pid.split(":", 1)[0]: pid for pid in pattern_ids}
    choices = [
        c.model_copy(update={"pattern_id": swaps[c.capability.value]})
        if c.capability.value in swaps
        else c
        for c in req.plan.choices
    ]
    return req.model_copy(update={"plan": req.plan.model_copy(update={"choices": choices})})
