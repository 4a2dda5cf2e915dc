from __future__ import annotations

from decimal import Decimal

import pytest

from keel.design.constraints import parse_constraints
from keel.design.critics import (
    BomLine,
    bill_of_materials,
    estimate_cost,
    load_prices,
    review_plan,
)
from keel.design.errors import PriceTableError
from keel.design.planner import plan
from tests.design.unit.design_data import catalog, prices, raw_prices


def line(resource: str, quantity: float, unit: str, region: str | None = None) -> BomLine:
    return BomLine(pattern_id="x:y", resource=resource, quantity=quantity, unit=unit, region=region)


def test_lines_are_priced_from_the_table() -> None:
    table = raw_prices()["prices"]
    bom = [line("s3_storage", 500, "GB-month"), line("glue_dpu", 300, "DPU-hour")]
    est = estimate_cost(bom, prices())
    expected = [
        round(500 * table["s3_storage"]["usd"], 2),
        round(300 * table["glue_dpu"]["usd"], 2),
    ]
    assert [c.usd for c in est.breakdown] == expected
    assert est.monthly_usd == pytest.approx(sum(expected))
    assert [c.qty for c in est.breakdown] == ["500 GB-month", "300 DPU-hour"]
    assert est.method == raw_prices()["method"] and est.complete


def test_unpriced_resource_is_listed_never_counted_as_zero() -> None:
    bom = [
        line("s3_storage", 100, "GB-month"),
        line("quantum_annealer", 3, "hour"),
        line("glue_dpu", 10, "vCPU-hour"),
    ]
    est = estimate_cost(bom, prices())
    assert [c.service for c in est.breakdown] == ["s3_storage"]
    assert [(u.service, u.reason) for u in est.unpriced] == [
        ("quantum_annealer", "no price in the table"),
        ("glue_dpu", "priced per DPU-hour, asked in vCPU-hour"),
    ]
    assert not est.complete
    assert all(c.usd > 0 for c in est.breakdown)


def test_region_factor_scales_and_unknown_region_is_factor_one() -> None:
    factor = raw_prices()["region_factor"]["eu-central-1"]
    base = estimate_cost([line("glue_dpu", 100, "DPU-hour", "us-east-1")], prices()).monthly_usd
    eu = estimate_cost([line("glue_dpu", 100, "DPU-hour", "eu-central-1")], prices()).monthly_usd
    mars = estimate_cost([line("glue_dpu", 100, "DPU-hour", "mars-north-1")], prices()).monthly_usd
    assert eu == pytest.approx(round(base * factor, 2))
    assert mars == base


def test_delta_against_previous_in_usd_and_percent() -> None:
    before = estimate_cost([line("glue_dpu", 100, "DPU-hour")], prices())
    after = estimate_cost([line("glue_dpu", 125, "DPU-hour")], prices(), previous=before)
    assert after.delta_vs_prev_usd == pytest.approx(after.monthly_usd - before.monthly_usd)
    assert after.delta_vs_prev_pct == 25.0
    zero = estimate_cost([], prices())
    assert zero.monthly_usd == 0
    assert estimate_cost([], prices(), previous=zero).delta_vs_prev_pct is None


def test_bom_repeats_per_region() -> None:
    one = plan(parse_constraints({"regions": ["us-east-1"]}), catalog())
    two = plan(parse_constraints({"regions": ["us-east-1", "us-west-2"]}), catalog())
    assert len(bill_of_materials(two, catalog())) == 2 * len(bill_of_materials(one, catalog()))


def test_price_table_errors_name_the_key() -> None:
    data = raw_prices()
    data["prices"]["glue_dpu"] = {"unit": "DPU-hour", "usd": 0}
    with pytest.raises(PriceTableError) as info:
        load_prices(data)
    assert info.value.issues[0].field == "prices.glue_dpu.usd"


def test_prices_are_decimal_so_totals_are_exact_to_the_cent() -> None:
    assert isinstance(prices().prices["lambda_compute"].usd, Decimal)
    est = estimate_cost([line("lambda_compute", 5_000_000, "GB-second")] * 3, prices())
    assert est.monthly_usd == pytest.approx(3 * est.breakdown[0].usd, abs=1e-9)


def test_review_lists_gaps_coupling_and_single_region_risk() -> None:
    c = parse_constraints(
        {
            "regions": ["us-east-1"],
            "workload_types": ["online", "streaming"],
            "sla_latency_ms": 5,
            "availability_target": 99.95,
            "budget_band": "high",
        }
    )
    p = plan(c, catalog())
    ids = [r.id for r in review_plan(c, p, catalog()).risks]
    assert "feasibility:gap:serve" in ids
    assert "failure_domain:single_region" in ids
    streaming = parse_constraints(
        {
            "regions": ["us-east-1"],
            "workload_types": ["streaming"],
            "throughput": {"events_per_s": 3500},
        }
    )
    sp = plan(streaming, catalog())
    risks = {r.id: r for r in review_plan(streaming, sp, catalog()).risks}
    assert "coupling:transform:kinesis-lambda" in risks
    assert risks["bottleneck:ingest:kinesis-streams"].severity == "medium"


def test_review_of_a_clean_batch_plan_has_no_high_risk() -> None:
    c = parse_constraints(
        {"regions": ["eu-west-1"], "workload_types": ["batch"], "budget_band": "low"}
    )
    review = review_plan(c, plan(c, catalog()), catalog())
    assert review.worst in (None, "low", "medium")
