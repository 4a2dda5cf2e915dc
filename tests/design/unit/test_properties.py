"""Property tests of the design pipeline's intake handling, coverage and planner chain.

What tests/design/unit already covers is left out: parse_constraints of arbitrary JSON
(test_constraints), questions leading to a covered intake and being the fewest
(test_coverage), the planner alone being total and respecting hard constraints
(test_planner). Here: the intake activity's own validation of a model's raw reply, the
coverage score's bounds and monotonicity and what questions may be about, and the whole
pure chain after the planner (critics, cost, policy, gate) for any valid constraints.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keel.design.constraints import FIELD_NAMES, is_stated, parse_constraints
from keel.design.coverage import (
    IntakeSnapshot,
    adaptive_questions,
    apply_answers,
    coverage_check,
)
from keel.design.critics import estimate_plan_cost, review_plan
from keel.design.intake import IntakeReply, read_reply
from keel.design.patterns import MANDATORY_CAPABILITIES
from keel.design.planner import plan
from keel.design.policy import evaluate_policy, gate_required
from tests.design.unit.design_data import catalog, prices
from tests.design.unit.design_strategies import ANSWER_OPTIONS, ANSWERS, constraint_dicts

_json: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)

#: Partial or invalid Constraint dicts: real field names (and near misses) with any JSON.
_partial_constraints = st.dictionaries(
    st.sampled_from([*FIELD_NAMES, "budget", "region", "Cloud"]), _json, max_size=6
)


@st.composite
def replies(draw: st.DrawFn) -> str:
    """What a small model might answer: free text, JSON of any shape, a snapshot-like
    object with partial or invalid constraints, or a valid one."""
    kind = draw(st.sampled_from(["text", "json", "partial", "valid"]))
    if kind == "text":
        return draw(st.text(max_size=200))
    if kind == "json":
        return json.dumps(draw(_json))
    ambiguous = draw(st.dictionaries(st.sampled_from(FIELD_NAMES), _json, max_size=2))
    if kind == "partial":
        body: dict[str, Any] = {"constraints": draw(_partial_constraints)}
        if draw(st.booleans()):
            body["ambiguous"] = ambiguous
        if draw(st.booleans()):
            body[draw(st.sampled_from(["notes", "answer"]))] = draw(_json)
        return json.dumps(body)
    amb = {k: "unclear" for k in ambiguous}
    return json.dumps({"constraints": draw(constraint_dicts()), "ambiguous": amb})


@settings(max_examples=400, deadline=None)
@given(replies())
def test_intake_reply_is_always_a_snapshot_of_what_fits(reply: str) -> None:
    """No reply fails the intake: what validates is kept, what does not is ``unfit``
    (a known field, with why), and the re-ask's problems are there when it did not fit."""
    reading = read_reply(reply)
    snapshot = read_reply(reply).snapshot
    assert snapshot == reading.snapshot
    assert isinstance(snapshot, IntakeSnapshot)
    assert set(snapshot.unfit) <= set(FIELD_NAMES) and all(snapshot.unfit.values())
    assert set(snapshot.ambiguous) <= set(FIELD_NAMES)
    assert reading.fits or reading.problems
    # What was kept is the schema: it round-trips as a reply that fits.
    again = IntakeReply(constraints=snapshot.constraints, ambiguous=snapshot.ambiguous)
    assert read_reply(again.model_dump_json()).fits
    assert 0.0 <= coverage_check(snapshot).score <= 1.0
    # Each field that did not fit is asked about.
    asked = {q.field for q in adaptive_questions(coverage_check(snapshot))}
    assert set(snapshot.unfit) <= asked


def test_intake_reply_nested_past_the_parser_is_nothing_kept() -> None:
    for deep in ("[" * 100_000 + "]" * 100_000, '{"a":' * 50_000 + "1" + "}" * 50_000):
        reading = read_reply(deep)
        assert not reading.fits and reading.problems
        assert reading.snapshot == IntakeSnapshot()


def test_valid_snapshot_reply_is_taken_as_is() -> None:
    reply = {"constraints": {"cloud": "aws", "regions": ["eu-west-1"]}, "ambiguous": {}}
    snapshot = read_reply("  " + json.dumps(reply) + "\n").snapshot
    assert snapshot.constraints.regions == ["eu-west-1"]


_ambiguities = st.dictionaries(st.sampled_from(FIELD_NAMES), st.just("unclear"), max_size=3)


def _stated_value(field: str) -> st.SearchStrategy[Any]:
    options = [v for v in ANSWER_OPTIONS.get(field, []) if v not in (None, [])]
    return st.sampled_from([ANSWERS[field], *options])


@settings(max_examples=300, deadline=None)
@given(constraint_dicts(), _ambiguities, st.data())
def test_stating_a_missing_field_never_lowers_the_score(
    data: dict[str, Any], amb: dict[str, str], draw: st.DataObject
) -> None:
    s = IntakeSnapshot(constraints=parse_constraints(data), ambiguous=amb)
    cov = coverage_check(s)
    assert 0.0 <= cov.score <= 1.0
    fillable = [f for f in cov.missing if f in ANSWERS]
    if not fillable:
        # Nothing missing: only an ambiguous required field keeps the score under 1.
        ambiguous_required = set(cov.ambiguous) & set(cov.required)
        assert cov.missing or cov.score == 1.0 or ambiguous_required
        return
    field = draw.draw(st.sampled_from(fillable))
    after = coverage_check(apply_answers(s, {field: draw.draw(_stated_value(field))}))
    assert field not in after.missing
    assert 0.0 <= after.score <= 1.0
    assert after.score >= cov.score - 1e-9, (field, cov, after)


@settings(max_examples=300, deadline=None)
@given(constraint_dicts(), _ambiguities)
def test_questions_are_only_about_missing_ambiguous_or_conflicting_fields(
    data: dict[str, Any], amb: dict[str, str]
) -> None:
    s = IntakeSnapshot(constraints=parse_constraints(data), ambiguous=amb)
    cov = coverage_check(s)
    questions = adaptive_questions(cov)
    open_fields = set(cov.missing) | set(cov.ambiguous)
    conflict_fields = {f for c in cov.conflicts for f in c.fields}
    conflict_ids = {c.id for c in cov.conflicts}
    for q in questions:
        assert q.field in open_fields | conflict_fields, (q, cov)
        assert set(q.resolves) <= conflict_ids
        if q.resolves:
            assert all(q.field in c.fields for c in cov.conflicts if c.id in q.resolves)
        elif q.field not in open_fields:
            raise AssertionError(f"{q.field} asked with nothing open about it")
    if cov.covered:
        assert questions == []
    # A stated, unambiguous field with no conflict is never asked about.
    settled = {
        f for f in FIELD_NAMES if is_stated(s.constraints, f) and f not in amb
    } - conflict_fields
    assert not settled & {q.field for q in questions}


@settings(max_examples=200, deadline=None)
@given(constraint_dicts(), st.one_of(st.none(), st.text(max_size=40)))
def test_any_valid_constraints_run_the_pure_chain_without_an_exception(
    data: dict[str, Any], comment: str | None
) -> None:
    """Planner, critics, cost, policy and gate: a plan or listed gaps, never an exception."""
    c = parse_constraints(data)
    cat = catalog()
    p = plan(c, cat, rejection_comment=comment)
    listed = sorted([ch.capability for ch in p.choices] + [g.capability for g in p.gaps])
    assert listed == sorted(MANDATORY_CAPABILITIES)
    review = review_plan(c, p, cat)
    first = estimate_plan_cost(p, cat, c, prices())
    cost = estimate_plan_cost(p, cat, c, prices(), first)
    assert cost.monthly_usd >= 0 and cost.delta_vs_prev_usd == 0
    report = evaluate_policy(c, p, cat, cost, review)
    statuses = {r.id: r.status for r in report.rules}
    assert report.overall in ("pass", "warn", "fail")
    assert report.overall == max(statuses.values(), key=["pass", "warn", "fail"].index)
    if p.gaps:
        assert statuses["mandatory_capabilities"] == "fail"
    # No cost change against the previous set: only a failing policy forces the gate.
    assert gate_required(cost, report).required == (report.overall == "fail")
