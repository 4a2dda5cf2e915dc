"""Budget: compile-time estimates, kill limits, and the tracker's kill switch at 120%."""

from __future__ import annotations

from decimal import Decimal

import pytest

from keel.mrp import BudgetExceeded, BudgetTracker, compile_job
from keel.mrp.budget import BudgetLimits, BudgetState, estimate_cost, kill_limits
from tests.mrp.unit.mrp_jobs import job_text, load_caps, load_registry

REGISTRY = load_registry()
D = Decimal


def specs(**roles: str):
    return {role: REGISTRY.get(ref) for role, ref in roles.items()}


def test_estimate_is_shards_times_weight_plus_llm():
    est = estimate_cost(
        specs(map="llm-sentiment@2.1.0", reduce="sum-counts@1.0.0", produce="json-writer@1.0.0"),
        shard_count=10,
        item_count=40,
        usd_per_unit=D("0.01"),
    )
    by_role = {line.role: line for line in est.lines}
    assert [line.role for line in est.lines] == ["map", "reduce", "produce"]
    assert (by_role["map"].invocations, by_role["map"].items) == (10, 40)
    assert by_role["map"].units == D("20")  # 10 shards x weight 2
    assert by_role["map"].llm_tokens == D("20000")  # 40 items x 1 call x 500 tokens
    assert by_role["map"].llm_usd == D("0.04")  # 20k tokens at $0.002 per 1k
    assert (by_role["reduce"].invocations, by_role["reduce"].items) == (1, 10)
    assert est.units == D("22")
    assert est.llm_usd == D("0.04")
    assert str(est.usd) == "0.260000"  # 22 units x $0.01 + $0.04


def test_estimate_text_is_fixed():
    est = estimate_cost(specs(map="tokens-count@1.0.0"), shard_count=3, item_count=5)
    assert str(est.units) == "1.500000" and str(est.usd) == "0.000000"


def test_kill_limits_are_120_percent_capped_by_budget():
    est = estimate_cost(specs(map="llm-sentiment@2.1.0"), shard_count=10, item_count=10)
    # 20 units, $0.01 of LLM calls.
    roomy = kill_limits(est, budget_units=D(100), budget_usd=None)
    assert (roomy.units, roomy.usd) == (D("24"), D("0.012"))
    tight = kill_limits(est, budget_units=D(21), budget_usd=D("0.0105"))
    assert (tight.units, tight.usd) == (D("21"), D("0.0105"))
    custom = kill_limits(est, budget_units=None, budget_usd=None, kill_ratio=D("1.5"))
    assert custom.units == D("30")


def limits(units: str = "100", usd: str = "10") -> BudgetLimits:
    return BudgetLimits(units=D(units), usd=D(usd), kill_ratio=D("1.2"))


def test_tracker_kills_past_120_percent_of_the_estimate():
    est = estimate_cost(specs(map="tokens-count@1.0.0"), shard_count=200, item_count=200)
    assert est.units == D(100)
    tracker = BudgetTracker(kill_limits(est, budget_units=None, budget_usd=None))
    for _ in range(240):  # 240 x 0.5 = 120 units: exactly at the limit, still running
        tracker.charge(units=D("0.5"))
    assert tracker.spent_units == D("120.0") and not tracker.tripped
    assert tracker.would_exceed(units=D("0.5"))
    with pytest.raises(BudgetExceeded) as info:
        tracker.charge(units=D("0.5"))
    assert (info.value.dimension, info.value.spent, info.value.limit) == (
        "units",
        D("120.5"),
        D("120"),
    )
    assert tracker.tripped and tracker.state().tripped == "units"


def test_tracker_kills_on_usd_and_stays_tripped():
    tracker = BudgetTracker(limits(usd="1.20"))
    tracker.charge(usd="1.19")
    with pytest.raises(BudgetExceeded) as info:
        tracker.charge(usd="0.02")
    assert info.value.dimension == "usd"
    # The spend happened; the state records it. Any later charge raises too.
    assert tracker.spent_usd == D("1.21")
    with pytest.raises(BudgetExceeded):
        tracker.charge(units=0)
    assert tracker.would_exceed()
    assert tracker.state().charges == 3


def test_tracker_state_round_trips_through_json():
    tracker = BudgetTracker(limits())
    tracker.charge(units=3, usd="0.25")
    tracker.charge(units="1.5")
    saved = BudgetState.model_validate_json(tracker.state().model_dump_json())
    resumed = BudgetTracker.from_state(saved)
    assert resumed.state() == tracker.state()
    assert resumed.remaining() == (D("95.5"), D("9.75"))
    with pytest.raises(ValueError, match="different limits"):
        BudgetTracker(limits(units="1"), saved)


def test_negative_charges_are_refused():
    tracker = BudgetTracker(limits())
    with pytest.raises(ValueError):
        tracker.charge(units=-1)
    assert tracker.state().charges == 0


def test_zero_estimate_means_any_spend_kills():
    # A job whose operators declare no LLM use and whose units are free has a $0 estimate:
    # a real LLM bill is then unexpected, and the kill switch treats it so.
    tracker = BudgetTracker(limits(usd="0"))
    with pytest.raises(BudgetExceeded):
        tracker.charge(usd="0.000001")


def test_compiled_job_carries_its_kill_limits():
    result = compile_job(job_text("valid/sentiment.yaml"), REGISTRY, load_caps())
    plan = result.ir.budget
    tracker = BudgetTracker(plan.limits)
    assert plan.limits.usd == D("0.09")  # 120% of $0.075, under the $0.50 budget
    tracker.charge(usd="0.09")
    with pytest.raises(BudgetExceeded):
        tracker.charge(usd="0.000001")
