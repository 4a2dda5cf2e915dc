"""Cost from the workload (issue 24 §2): every BOM quantity from the constraints through a
formula shown in ``reports/cost.json``, priced from a dated, sourced price table."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.design.codegen import render_request
from keel.design.constraints import Constraints, parse_constraints
from keel.design.critics import (
    BomLine,
    CostEstimate,
    bill_of_materials,
    estimate_cost,
    estimate_plan_cost,
    load_prices,
    review_plan,
    workload_of,
)
from keel.design.errors import PatternError
from keel.design.patterns import load_patterns
from keel.design.planner import plan
from keel.design.policy import evaluate_policy
from keel.design.reasons import critic_cost_card
from keel.design.workload import evaluate, formula_names
from tests.design.codegen_cases import request_for
from tests.design.unit.design_data import (
    catalog,
    golden_cases,
    prices,
    raw_patterns,
    raw_prices,
)
from tests.design.unit.design_strategies import constraint_dicts

# The form the issue measured: $451.00 a month at 50 and at 5,000 GB/day alike.
FORM: dict[str, Any] = golden_cases()["broken_gdpr_region"]["constraints"]
BOUNDS = {"data_gb_per_day": 1e6, "requests_per_s": 1e8, "events_per_s": 1e9}

# The lines of FORM's plan that follow from the data volume, and those that do not. A
# (pattern, service) pair can be in both: a pattern may have two lines of one price (the
# lake's data and its query results).
PLAN = [
    "ingest:s3-batch",
    "transform:glue-etl",
    "store:s3-lakehouse",
    "feature:glue-offline-features",
    "train:ecs-fargate-jobs",
    "serve:sagemaker-batch-transform",
    "observe:cloudwatch",
    "govern:lake-formation-cloudtrail",
]
VOLUME_LINES = {
    ("foundation", "nat_gateway_data"),
    ("foundation", "vended_logs"),
    ("ingest:s3-batch", "s3_storage"),
    ("ingest:s3-batch", "s3_requests"),
    ("transform:glue-etl", "glue_dpu"),
    ("store:s3-lakehouse", "s3_storage"),
    ("store:s3-lakehouse", "athena_scanned"),
    ("store:s3-lakehouse", "glue_catalog_objects"),
    ("feature:glue-offline-features", "glue_dpu"),
    ("feature:glue-offline-features", "s3_storage"),
    ("train:ecs-fargate-jobs", "fargate_vcpu"),
    ("train:ecs-fargate-jobs", "fargate_memory"),
    ("serve:sagemaker-batch-transform", "sagemaker_ml_m5_xlarge"),
    ("serve:sagemaker-batch-transform", "s3_storage"),
    ("observe:cloudwatch", "cloudwatch_logs"),
    ("govern:lake-formation-cloudtrail", "cloudtrail_events"),
    ("govern:lake-formation-cloudtrail", "s3_storage"),
}
FIXED_LINES = {
    ("foundation", "nat_gateway_hour"),
    ("foundation", "public_ipv4"),
    ("foundation", "s3_storage"),
    ("foundation", "kms_key"),
    *((pid, "kms_key") for pid in PLAN),
    ("ingest:s3-batch", "step_functions_transitions"),
    ("transform:glue-etl", "s3_storage"),
    ("store:s3-lakehouse", "s3_storage"),
    ("train:ecs-fargate-jobs", "s3_storage"),
    ("train:ecs-fargate-jobs", "ecr_storage"),
    ("train:ecs-fargate-jobs", "cloudwatch_metrics"),
    ("serve:sagemaker-batch-transform", "step_functions_transitions"),
    ("serve:sagemaker-batch-transform", "ecr_storage"),
    ("observe:cloudwatch", "cloudwatch_metrics"),
    ("observe:cloudwatch", "cloudwatch_alarm"),
    ("observe:cloudwatch", "cloudwatch_dashboard"),
}


def cost_of(data: dict[str, Any], previous: CostEstimate | None = None) -> CostEstimate:
    c = parse_constraints(data)
    return estimate_plan_cost(plan(c, catalog()), catalog(), c, prices(), previous)


def with_throughput(data: dict[str, Any], **values: float) -> dict[str, Any]:
    return {**data, "throughput": {**(data.get("throughput") or {}), **values}}


def _cents(value: float) -> Decimal:
    return Decimal(str(value))


def assert_sums_to_the_cent(est: CostEstimate) -> None:
    total = _cents(est.monthly_usd)
    assert sum((_cents(v) for v in est.by_capability.values()), Decimal(0)) == total
    assert sum((_cents(line.usd) for line in est.breakdown), Decimal(0)) == total
    for cap, usd in est.by_capability.items():
        lines = [_cents(line.usd) for line in est.breakdown if line.capability == cap]
        assert sum(lines, Decimal(0)) == _cents(usd)


def test_the_measured_form_now_costs_more_with_more_data() -> None:
    small = cost_of(with_throughput(FORM, data_gb_per_day=50))
    large = cost_of(with_throughput(FORM, data_gb_per_day=5000))
    assert small.complete and large.complete
    assert large.monthly_usd > 10 * small.monthly_usd
    assert [v.name for v in small.assumed] == [
        "retention_days",
        "requests_per_s",
        "events_per_s",
        "sla_latency_ms",
        "training_runs_per_month",
    ]


def test_ten_times_the_volume_costs_more_on_exactly_the_volume_lines() -> None:
    base = cost_of(with_throughput(FORM, data_gb_per_day=50))
    ten = cost_of(with_throughput(FORM, data_gb_per_day=500))
    keys = [(line.pattern_id, line.service) for line in base.breakdown]
    assert keys == [(line.pattern_id, line.service) for line in ten.breakdown]
    assert {pid for pid, _ in keys} == {"foundation", *PLAN}
    follows = {
        (line.pattern_id, line.service)
        for line in base.breakdown
        if "data_gb_per_day" in line.depends_on
    }
    fixed = {
        (line.pattern_id, line.service)
        for line in base.breakdown
        if "data_gb_per_day" not in line.depends_on
    }
    assert follows == VOLUME_LINES and fixed == FIXED_LINES
    for before, after in zip(base.breakdown, ten.breakdown, strict=True):
        if "data_gb_per_day" in before.depends_on:
            assert after.usd > before.usd, before.formula
        else:
            assert after.usd == before.usd and after.formula == before.formula


def test_each_line_shows_its_formula_numbers_price_and_source() -> None:
    est = cost_of({**with_throughput(FORM, data_gb_per_day=50), "retention_days": 30})
    lake = next(
        line
        for line in est.breakdown
        if (line.pattern_id, line.service) == ("store:s3-lakehouse", "s3_storage")
    )
    assert lake.formula == (
        "stored_gb = data_gb_per_day \u00d7 retention_days = 50 \u00d7 30 = 1,500 GB-month"
    )
    assert lake.inputs == {"stored_gb": 1500.0}
    assert lake.depends_on == ["data_gb_per_day", "retention_days"]
    assert lake.quantity == 1500 and lake.unit == "GB-month"
    assert lake.unit_usd == "0.023" and lake.region_factor == "1.0"
    assert lake.usd == 34.5
    assert lake.price_source.startswith("Amazon S3 pricing")
    for line in est.breakdown:
        assert " = " in line.formula and line.price_source and line.unit_usd
        assert line.quantity is not None
        assert _cents(line.usd) == (
            Decimal(str(line.quantity)) * Decimal(line.unit_usd) * Decimal(line.region_factor)
        ).quantize(Decimal("0.01"))
    assert est.prices["version"] == raw_prices()["version"]
    assert est.prices["as_of"] == str(raw_prices()["as_of"])
    assert "copied by hand" in est.prices["provenance"]


def test_every_shipped_price_has_a_source_and_every_bom_line_a_formula() -> None:
    table = prices()
    assert table.version != "unversioned" and table.as_of is not None
    assert all(p.source for p in table.prices.values())
    cat = catalog()
    assert cat.workload is not None
    used: set[str] = set()
    sections = [("foundation", cat.foundation), ("every_module", cat.every_module)]
    for where, bom in [*sections, *((p.id, p.bom) for p in cat.patterns)]:
        for item in bom:
            assert item.formula is not None and item.quantity is None, where
            assert table.prices[item.resource].unit == item.unit
            used.update(formula_names(item.formula))
    for d in cat.workload.derived.values():
        used.update(formula_names(d.formula))
    # No dead assumption: every input and parameter feeds some quantity.
    assert set(cat.workload.inputs) | set(cat.workload.parameters) <= used


ZERO = Constraints.model_validate(
    {
        "regions": ["us-east-1"],
        "sla_latency_ms": 1,
        "throughput": {"data_gb_per_day": 0, "requests_per_s": 0, "events_per_s": 0},
        "retention_days": 1,
        "training_runs_per_month": 0,
    }
)
HUGE = Constraints.model_validate(
    {
        "regions": ["us-east-1", "eu-west-1", "ap-southeast-2"],
        "sla_latency_ms": 600_000,
        "throughput": BOUNDS,
        "retention_days": 36_500,
        "training_runs_per_month": 10_000,
    }
)


@pytest.mark.parametrize("constraints", [ZERO, Constraints(), HUGE], ids=["zero", "none", "max"])
def test_every_formula_prices_at_the_edges_of_the_schema(constraints: Constraints) -> None:
    """Zero traffic, nothing stated, and every bound at once: every quantity of every
    pattern is finite and non-negative and every line is priced."""
    cat = catalog()
    env = workload_of(cat, constraints).env()
    lines = []
    sections = [("foundation", cat.foundation), ("every_module", cat.every_module)]
    for where, bom in [*sections, *((p.id, p.bom) for p in cat.patterns)]:
        for item in bom:
            assert item.formula is not None
            q = evaluate(item.formula, env)
            assert math.isfinite(q) and q >= 0, (where, item.resource)
            lines.append((where, item, q))
    for region in ("us-east-1", "ap-southeast-2"):
        est = estimate_cost(
            [
                BomLine(pattern_id=pid, resource=i.resource, quantity=q, unit=i.unit, region=region)
                for pid, i, q in lines
            ],
            prices(),
        )
        assert est.complete and math.isfinite(est.monthly_usd) and est.monthly_usd > 0
        assert_sums_to_the_cent(est)


_base = st.tuples(
    constraint_dicts(),
    st.one_of(st.none(), st.integers(1, 36_500)),
    st.one_of(st.none(), st.floats(0, 10_000, allow_nan=False)),
)


def _with(base: tuple[dict[str, Any], int | None, float | None]) -> dict[str, Any]:
    data, retention, runs = base
    out = dict(data)
    if retention is not None:
        out["retention_days"] = retention
    if runs is not None:
        out["training_runs_per_month"] = runs
    return out


@settings(max_examples=150, deadline=None)
@given(
    _base,
    st.sampled_from(sorted(BOUNDS)),
    st.floats(0, 1, allow_nan=False),
    st.floats(0, 1, allow_nan=False),
)
def test_more_volume_or_rate_never_costs_less_and_capabilities_sum_to_the_total(
    base: tuple[dict[str, Any], int | None, float | None], field: str, a: float, b: float
) -> None:
    """For one plan, raising the data volume, the request rate or the event rate never
    lowers the total or any line; the per-capability sums equal the total to the cent.

    The plan is the lower load's: a higher rate may lead the planner to another pattern
    or to a gap (a pattern's rated throughput), which is a planning decision, not a price.
    """
    data = _with(base)
    lo, hi = sorted((a, b))
    low = parse_constraints(with_throughput(data, **{field: lo * lo * BOUNDS[field]}))
    high = parse_constraints(with_throughput(data, **{field: hi * hi * BOUNDS[field]}))
    p = plan(low, catalog())
    cheap = estimate_plan_cost(p, catalog(), low, prices())
    dear = estimate_plan_cost(p, catalog(), high, prices())
    assert dear.monthly_usd >= cheap.monthly_usd
    assert len(cheap.breakdown) == len(dear.breakdown)
    for before, after in zip(cheap.breakdown, dear.breakdown, strict=True):
        assert (before.pattern_id, before.service, before.region) == (
            after.pattern_id,
            after.service,
            after.region,
        )
        assert after.usd >= before.usd, (before.formula, after.formula)
    for cap, usd in cheap.by_capability.items():
        assert dear.by_capability[cap] >= usd
    assert_sums_to_the_cent(cheap)
    assert_sums_to_the_cent(dear)
    if field == "data_gb_per_day":
        # The planner does not read the data volume: the end-to-end cost is monotone too.
        assert plan(high, catalog()) == p


def test_budget_check_reads_the_workload_sized_estimate() -> None:
    form = {**FORM, "regions": ["eu-west-1"]}  # GDPR in the EU: only the budget can fail
    for gb, status in ((50, "pass"), (5000, "fail")):
        c = parse_constraints(with_throughput(form, data_gb_per_day=gb))
        p = plan(c, catalog())
        est = estimate_plan_cost(p, catalog(), c, prices())
        report = evaluate_policy(c, p, catalog(), est, review_plan(c, p, catalog()))
        rule = next(r for r in report.rules if r.id == "budget_band")
        assert rule.status == status, rule.detail
        assert f"${est.monthly_usd:,.2f}" in rule.detail


def test_cost_card_names_the_assumed_inputs_and_a_method_change() -> None:
    est = cost_of(with_throughput(FORM, data_gb_per_day=50))
    card = critic_cost_card(est, idempotency_key="k", trigger="regen", ts="t")
    assumed = [r for r in card.risks if r.startswith("assumed: ")]
    assert len(assumed) == 5
    assert any(r.startswith("assumed: retention_days = 30 days") for r in assumed)
    assert card.confidence == 0.35
    stated = {
        **FORM,
        "sla_latency_ms": 500,
        "retention_days": 90,
        "training_runs_per_month": 30,
        "throughput": {"data_gb_per_day": 50, "requests_per_s": 0, "events_per_s": 0},
    }
    full = cost_of(stated)
    card = critic_cost_card(full, idempotency_key="k", trigger="regen", ts="t")
    assert card.risks == [] and card.confidence == 0.6
    old = full.model_copy(update={"method": "bom_v1"})
    again = cost_of(stated, previous=old)
    assert again.previous_method == "bom_v1" and again.delta_vs_prev_usd == 0
    card = critic_cost_card(again, idempotency_key="k", trigger="regen", ts="t")
    assert any(r.startswith("method changed: ") for r in card.risks)


def test_cost_json_carries_formulas_prices_and_workload() -> None:
    req = request_for("batch_training")
    files = render_request(req)
    doc = json.loads(files["reports/cost.json"])
    assert doc["monthly_usd"] == req.cost.monthly_usd
    assert doc["prices"]["version"] == raw_prices()["version"]
    line = doc["breakdown"][0]
    assert {"formula", "inputs", "depends_on", "unit_usd", "price_source"} <= set(line)
    workload = {v["name"]: v for v in doc["workload"]}
    assert workload["data_gb_per_day"]["source"] == "stated"
    assert workload["data_gb_per_day"]["value"] == 200
    assert workload["retention_days"]["source"] == "default"
    readme = files["README.md"]
    assert "Not stated, so assumed: retention_days = 30 days" in readme
    assert "list prices copied by hand, not fetched" in readme
    tf = files["infra/modules/store/main.tf"]
    assert "s3_storage: stored_gb GB-month" in tf


def test_older_estimates_tables_and_catalogues_still_decode_and_price() -> None:
    """Workflow histories and stored decision sets hold the shapes before formulas."""
    old_estimate = {
        "monthly_usd": 12.5,
        "breakdown": [
            {"service": "glue_dpu", "qty": "10 DPU-hour", "usd": 12.5, "pattern_id": "a:b"}
        ],
        "method": "bom_v1",
    }
    assert CostEstimate.model_validate(old_estimate).workload == []
    old_table = {
        "method": "bom_v1",
        "prices": {"glue_dpu": {"unit": "DPU-hour", "usd": 0.44}},
    }
    assert load_prices(old_table).version == "unversioned"
    raw = raw_patterns()
    for key in ("workload", "foundation", "every_module"):  # none before formulas
        raw.pop(key)
    for items in raw["patterns"].values():
        for item in items:
            item["bom"] = [
                {"resource": b["resource"], "quantity": 7, "unit": b["unit"]} for b in item["bom"]
            ]
    legacy = load_patterns(raw)
    c = parse_constraints(with_throughput(FORM, data_gb_per_day=5000))
    p = plan(c, legacy)
    lines = bill_of_materials(p, legacy, c)
    assert {line.quantity for line in lines} == {7}
    assert all(line.shown.endswith("(fixed)") and line.depends_on == [] for line in lines)
    est = estimate_plan_cost(p, legacy, c, prices())
    assert est.workload == [] and est.complete
    assert est == estimate_plan_cost(p, legacy, None, prices())


def test_a_bad_formula_in_the_catalogue_is_refused_by_name() -> None:
    raw = raw_patterns()
    raw["patterns"]["store"][0]["bom"][0]["formula"] = "stored_gb * nonsense"
    raw["patterns"]["store"][1]["bom"][0]["formula"] = "stored_gb - 1"
    with pytest.raises(PatternError) as info:
        load_patterns(raw)
    fields = {i.field: i.message for i in info.value.issues}
    assert fields["patterns.store:s3-lakehouse.bom.0"] == "unknown name(s): nonsense"
    assert "Sub is not allowed" in fields["patterns.store:dynamodb.bom.0"]
    raw = raw_patterns()
    raw["patterns"]["store"][0]["bom"][0].pop("formula")
    with pytest.raises(PatternError):
        load_patterns(raw)
