from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keel.design.constraints import Cloud, parse_constraints
from keel.design.critics import estimate_plan_cost
from keel.design.patterns import MANDATORY_CAPABILITIES, Capability
from keel.design.planner import interpret_comment, plan
from tests.design.unit.design_data import catalog, prices
from tests.design.unit.design_strategies import constraint_dicts

COMMENT_PARTS = [
    "too expensive",
    "too slow",
    "avoid lambda-serverless",
    "no containers",
    "instead of glue-etl",
    "use serverless",
    "prefer managed services",
    "drop ingest:msk-kafka",
    "not cheap enough",
]

ONLINE_HIGH = {
    "cloud": "aws",
    "regions": ["us-east-1"],
    "budget_band": "high",
    "data_classification": "internal",
    "workload_types": ["online"],
    "sla_latency_ms": 100,
}


def monthly(constraints: dict[str, Any], comment: str | None = None) -> float:
    c = parse_constraints(constraints)
    return estimate_plan_cost(plan(c, catalog(), comment), catalog(), c, prices()).monthly_usd


def test_too_expensive_prefers_cheaper_patterns() -> None:
    c = parse_constraints(ONLINE_HIGH)
    first = plan(c, catalog())
    again = plan(c, catalog(), "Too expensive for what it does.")
    assert again.feedback is not None and again.feedback.prefer_cheaper
    tier = {p.id: p.cost_tier for p in catalog().patterns}
    assert sum(tier[i] for i in again.pattern_ids()) < sum(tier[i] for i in first.pattern_ids())
    assert monthly(ONLINE_HIGH, "too expensive") < monthly(ONLINE_HIGH)
    for choice in again.choices:
        assert "reviewer asked for cheaper" in choice.justification


def test_avoid_excludes_the_named_pattern() -> None:
    c = parse_constraints({**ONLINE_HIGH, "sla_latency_ms": 300})
    first = plan(c, catalog())
    serve = first.choice_for(Capability.SERVE)
    assert serve is not None
    name = serve.pattern_id.split(":", 1)[1]
    again = plan(c, catalog(), f"please avoid {name}, we do not trust it")
    other = again.choice_for(Capability.SERVE)
    assert other is not None and other.pattern_id != serve.pattern_id
    excluded = {x.id: x.excluded for x in other.candidates}
    assert excluded[serve.pattern_id] == "the reviewer asked to avoid it"
    last = plan(c, catalog(), f"avoid {name} and avoid {other.pattern_id}")
    assert last.choice_for(Capability.SERVE) is None
    assert [g.capability for g in last.gaps] == [Capability.SERVE]


def test_comment_that_says_nothing_plannable_changes_nothing() -> None:
    c = parse_constraints(ONLINE_HIGH)
    again = plan(c, catalog(), "Looks odd to me.")
    assert again.pattern_ids() == plan(c, catalog()).pattern_ids()
    assert again.feedback is not None and again.feedback.understood == []


def test_interpret_comment_reads_deployment_and_latency() -> None:
    fb = interpret_comment("Too slow; move serving to containers on ECS", catalog())
    assert fb.prefer_low_latency
    assert fb.prefer_deployment is not None and fb.prefer_deployment.value == "containers"


def test_unstated_cloud_and_workloads_become_assumptions() -> None:
    p = plan(parse_constraints({}), catalog())
    assert p.cloud == Cloud.AWS
    assert len(p.assumptions) == 3
    assert p.capabilities() == list(MANDATORY_CAPABILITIES)


def test_cloud_without_patterns_gives_gaps_not_errors() -> None:
    p = plan(parse_constraints({"cloud": "gcp"}), catalog())
    assert p.choices == []
    assert [g.capability for g in p.gaps] == list(MANDATORY_CAPABILITIES)


@settings(max_examples=200, deadline=None)
@given(
    constraint_dicts(),
    st.lists(st.sampled_from(COMMENT_PARTS) | st.text(max_size=12), max_size=4),
)
def test_planner_is_total_deterministic_and_respects_hard_constraints(
    data: dict[str, Any], parts: list[str]
) -> None:
    c = parse_constraints(data)
    comment = " ".join(parts) or None
    p = plan(c, catalog(), comment)
    assert p == plan(c, catalog(), comment)
    covered = [ch.capability for ch in p.choices] + [g.capability for g in p.gaps]
    assert sorted(covered) == sorted(MANDATORY_CAPABILITIES)
    by_id = catalog().by_id()
    avoided = set(p.feedback.avoid) if p.feedback else set()
    assert not avoided & set(p.pattern_ids())
    for ch in p.choices:
        pattern = by_id[ch.pattern_id]
        assert pattern.capability == ch.capability
        assert pattern.cloud == p.cloud
        assert set(c.compliance) <= set(pattern.compliance)
        chosen = next(x for x in ch.candidates if x.id == ch.pattern_id)
        assert chosen.excluded is None
        assert all(x.excluded for x in ch.candidates if x.score is None)
        if pattern.requires:
            assert set(pattern.requires) & set(p.pattern_ids())
    serve = p.choice_for(Capability.SERVE)
    if serve is not None and "online" in p.workloads and c.sla_latency_ms is not None:
        latency = by_id[serve.pattern_id].p95_latency_ms
        assert latency is not None and latency <= c.sla_latency_ms


def test_a_negated_phrase_is_not_also_a_wish() -> None:
    fb = interpret_comment("avoid lambda-serverless", catalog())
    assert fb.avoid == ["serve:lambda-serverless"]
    assert fb.prefer_deployment is None
    assert fb.understood == ["avoid: serve:lambda-serverless"]


def test_negation_of_a_plain_word_keeps_its_meaning() -> None:
    assert interpret_comment("this is not cheap enough", catalog()).prefer_cheaper
    fb = interpret_comment("no containers please, too slow", catalog())
    assert fb.prefer_deployment is None and fb.prefer_low_latency
