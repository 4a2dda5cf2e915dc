"""keel.srl.rewards: verified, tests, diff size, the SRL step-wise similarity, combine."""

from __future__ import annotations

import difflib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.srl.rewards import (
    DiffSize,
    RewardWeights,
    combine,
    diff_size,
    passed_fraction,
    step_similarity,
    unified_diff,
    verified,
)

PRE = "def f(a, b):\n    return g(a, b)\n"
GOLD = "def f(a, b):\n    return g(b, a)\n"


def test_verified_needs_equal_text_and_reparse() -> None:
    assert verified(GOLD, GOLD, reparses=True)
    assert not verified(GOLD, GOLD, reparses=False)
    assert not verified(GOLD + "\n", GOLD, reparses=True)
    assert not verified(None, GOLD, reparses=True)


def test_passed_fraction() -> None:
    assert passed_fraction(3, 4) == 0.75
    assert passed_fraction(0, 0) is None
    with pytest.raises(ValueError):
        passed_fraction(5, 4)


def test_diff_size_counts_changed_lines_only() -> None:
    assert diff_size(PRE, GOLD) == DiffSize(added=1, removed=1)
    assert diff_size(PRE, PRE).total == 0
    assert diff_size("", "a\nb\n") == DiffSize(added=2, removed=0)
    assert "+    return g(b, a)" in unified_diff(PRE, GOLD, "m.py")


def test_step_similarity_is_the_sequence_matcher_ratio() -> None:
    a, b = '{"pattern": "g($A, $B)"}', '{"pattern": "g($B, $A)"}'
    expected = difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()
    assert step_similarity(a, b) == expected
    assert 0 < expected < 1
    assert step_similarity(b, b) == 1.0
    assert step_similarity(None, b) == -1.0


@given(st.text(max_size=300), st.text(max_size=300))
def test_similarity_bounds(a: str, b: str) -> None:
    score = step_similarity(a, b)
    assert 0.0 <= score <= 1.0
    assert (score == 1.0) == (a == b)


def test_combine_weights() -> None:
    expert = '{"pattern": "g($A, $B)", "rewrite": "g($B, $A)", "language": "python"}'
    perfect = combine(
        action_text=expert,
        expert_text=expert,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        tests_passed=1.0,
    )
    assert perfect.verified and perfect.format_ok
    assert perfect.total == 1.0 + 1.0 + 0.5
    noisy = combine(
        action_text=expert,
        expert_text=expert,
        pre=PRE,
        result_text=GOLD + "x\ny\nz\n",
        gold_post=GOLD,
        reparses=True,
    )
    assert not noisy.verified
    assert noisy.gold_diff_lines == 2
    assert noisy.diff_added == 4
    assert noisy.total == pytest.approx(1.0 - 3 * 0.01)
    failed = combine(
        action_text=expert,
        expert_text=expert,
        pre=PRE,
        result_text=None,
        gold_post=GOLD,
        reparses=False,
        weights=RewardWeights(similarity=0.5),
    )
    assert failed.diff_added == failed.diff_removed == 0
    assert failed.total == 0.5


def test_format_error_is_minus_one() -> None:
    reward = combine(
        action_text=None,
        expert_text="x",
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        tests_passed=1.0,
    )
    assert reward.total == -1.0
    assert reward.step_similarity == -1.0
    assert not reward.format_ok and not reward.verified
