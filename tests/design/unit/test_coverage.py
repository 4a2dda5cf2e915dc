from __future__ import annotations

from itertools import combinations
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from keel.design.constraints import FIELD_NAMES, parse_constraints
from keel.design.coverage import (
    AMBIGUOUS_CREDIT,
    DEFAULT_THRESHOLD,
    REQUIRED_WEIGHTS,
    Coverage,
    IntakeSnapshot,
    adaptive_questions,
    apply_answers,
    coverage_check,
)
from keel.design.errors import ConstraintError
from tests.design.unit.design_strategies import ANSWER_OPTIONS, ANSWERS, constraint_dicts

FULL = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "low",
    "workload_types": ["online"],
    "data_classification": "internal",
    "sla_latency_ms": 200,
}


def snap(data: dict[str, Any], ambiguous: dict[str, str] | None = None) -> IntakeSnapshot:
    return IntakeSnapshot(constraints=parse_constraints(data), ambiguous=ambiguous or {})


def test_complete_constraints_score_one_and_ask_nothing() -> None:
    cov = coverage_check(snap(FULL))
    assert (cov.score, cov.missing, cov.conflicts, cov.covered) == (1.0, [], [], True)
    assert adaptive_questions(cov) == []


def test_slo_is_required_only_for_online_or_unknown_workloads() -> None:
    batch = coverage_check(snap({**FULL, "workload_types": ["batch"], "sla_latency_ms": None}))
    assert "sla_latency_ms" not in batch.required
    assert batch.score == 1.0
    unknown = coverage_check(snap({}))
    assert "sla_latency_ms" in unknown.required
    assert unknown.score == 0.0
    assert unknown.missing == unknown.required


def test_ambiguous_field_counts_half_and_is_listed() -> None:
    cov = coverage_check(snap(FULL, {"sla_latency_ms": "'fast' without a number"}))
    assert cov.ambiguous == ["sla_latency_ms"]
    assert cov.score == pytest.approx((5 + AMBIGUOUS_CREDIT) / 6, abs=1e-4)


@pytest.mark.parametrize(
    ("extra", "conflict"),
    [
        ({"compliance": ["hipaa"], "data_classification": "public"}, "hipaa_public_data"),
        ({"workload_types": ["batch"], "sla_latency_ms": 50}, "slo_without_online"),
        ({"budget_band": "low", "availability_target": 99.99}, "budget_vs_availability"),
        ({"deployment_pref": "serverless", "sla_latency_ms": 20}, "serverless_tight_slo"),
        ({"compliance": ["gdpr"], "regions": ["us-east-1"]}, "gdpr_no_eu_region"),
    ],
)
def test_conflicts_are_found_and_block_coverage(extra: dict[str, Any], conflict: str) -> None:
    cov = coverage_check(snap({**FULL, **extra}))
    assert [c.id for c in cov.conflicts] == [conflict]
    assert not cov.covered
    questions = adaptive_questions(cov)
    assert len(questions) == 1
    assert questions[0].field in cov.conflicts[0].fields


def test_one_question_can_resolve_two_conflicts() -> None:
    cov = coverage_check(
        snap(
            {
                **FULL,
                "deployment_pref": "serverless",
                "workload_types": ["batch"],
                "sla_latency_ms": 20,
            }
        )
    )
    assert {c.id for c in cov.conflicts} == {"slo_without_online", "serverless_tight_slo"}
    questions = adaptive_questions(cov)
    assert [q.field for q in questions] == ["sla_latency_ms"]


def test_apply_answers_refuses_unknown_fields_and_bad_values_by_name() -> None:
    s = snap({"cloud": "aws"})
    with pytest.raises(ConstraintError) as info:
        apply_answers(s, {"budget": "low", "cloud": "aws"})
    assert [i.field for i in info.value.issues] == ["budget"]
    with pytest.raises(ConstraintError) as info:
        apply_answers(s, {"sla_latency_ms": -3})
    assert [i.field for i in info.value.issues] == ["sla_latency_ms"]


def test_answer_clears_ambiguity() -> None:
    s = snap(FULL, {"sla_latency_ms": "vague", "regions": "EU somewhere"})
    after = apply_answers(s, {"sla_latency_ms": 120})
    assert after.constraints.sla_latency_ms == 120
    assert after.ambiguous == {"regions": "EU somewhere"}


def _projected_score(cov: Coverage, answered: set[str]) -> float:
    total = sum(REQUIRED_WEIGHTS[f] for f in cov.required)
    got = 0.0
    for f in cov.required:
        if f in answered:
            got += REQUIRED_WEIGHTS[f]
        elif f not in cov.missing:
            got += REQUIRED_WEIGHTS[f] * (AMBIGUOUS_CREDIT if f in cov.ambiguous else 1.0)
    return got / total


ambiguities = st.dictionaries(st.sampled_from(FIELD_NAMES), st.just("unclear"), max_size=3)


@settings(max_examples=300, deadline=None)
@given(constraint_dicts(), ambiguities)
def test_answering_the_questions_covers_the_intake(
    data: dict[str, Any], amb: dict[str, str]
) -> None:
    """Whatever the extractor produced, answering what is asked leads to a covered intake
    within a few rounds, and the score always stays in [0, 1]."""
    s = snap(data, amb)
    for _ in range(4):
        cov = coverage_check(s)
        assert 0.0 <= cov.score <= 1.0
        if cov.covered:
            break
        questions = adaptive_questions(cov)
        assert questions, "an uncovered intake must ask something"
        assert len({q.field for q in questions}) == len(questions)
        answers: dict[str, Any] = {}
        for q in questions:
            if q.resolves:
                answers[q.field] = _resolving_answer(s, q.field, q.resolves)
            else:
                answers[q.field] = ANSWERS[q.field]
        s = apply_answers(s, answers)
    assert coverage_check(s).covered


def _resolving_answer(s: IntakeSnapshot, field: str, conflicts: list[str]) -> Any:
    """An answer to a conflict question that removes the conflicts it claims to resolve;
    one must exist, or the question was useless."""
    for value in ANSWER_OPTIONS[field]:
        after = coverage_check(apply_answers(s, {field: value}))
        if not set(conflicts) & {c.id for c in after.conflicts}:
            return value
    raise AssertionError(f"no answer to {field} resolves {conflicts}")


@settings(max_examples=300, deadline=None)
@given(constraint_dicts(), ambiguities)
def test_questions_for_coverage_are_the_fewest(data: dict[str, Any], amb: dict[str, str]) -> None:
    """No smaller set of the open fields would lift the score over the threshold."""
    s = snap(data, amb)
    cov = coverage_check(s)
    # With a conflict the questions resolve it (test_answering_the_questions_covers_the_intake).
    assume(not cov.conflicts)
    asked = [q.field for q in adaptive_questions(cov)]
    if cov.score >= DEFAULT_THRESHOLD:
        assert asked == []
        return
    assert _projected_score(cov, set(asked)) >= DEFAULT_THRESHOLD - 1e-9
    open_fields = sorted(set(cov.missing) | set(cov.ambiguous) & set(cov.required))
    for smaller in combinations(open_fields, len(asked) - 1):
        assert _projected_score(cov, set(smaller)) < DEFAULT_THRESHOLD - 1e-9
