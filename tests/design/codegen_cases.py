"""The five frozen constraint sets as codegen requests, built through the pure domain."""

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


def request_for(case: str) -> CodeGenRequest:
    """Constraints → plan → review, cost, policy, cards → the codegen request."""
    return request_from(golden_cases()[case]["constraints"], case)


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
