"""Every billed resource priced (issue 38 §4).

Each pattern is rendered to Terraform, parsed with python-hcl2, and every ``resource``
type it creates must be billed by a line of ``reports/cost.json`` (a price key that
``prices.yaml``'s ``terraform.priced`` names for it, on its module's pattern, in every
region) or be listed under ``terraform.free`` with a reason. The designs are the golden
cases and intake forms of ``tests/design/codegen_cases.py`` and, for each catalogue
pattern none of them chooses, a plan with that pattern put in its capability's place.
"""

from __future__ import annotations

import json
from decimal import Decimal
from functools import cache
from typing import Any

import hcl2
import pytest

from activities.design.codegen import render_request
from keel.design.codegen import CodeGenRequest
from keel.design.constraints import parse_constraints
from keel.design.cost_coverage import (
    CreatedResource,
    coverage_gaps,
    module_owner,
    resources_in,
)
from keel.design.critics import FOUNDATION, CostEstimate, estimate_plan_cost
from keel.design.planner import Plan
from tests.design.codegen_cases import CASES, FORMS, request_for, request_for_form, with_patterns
from tests.design.unit.design_data import catalog, prices

#: The base design a missing pattern is swapped into, in order of preference.
BASES = ("empty_form", "kinesis_online_one_region", "streaming_three_regions_high")


def _swapped(base: CodeGenRequest, pattern_id: str) -> CodeGenRequest:
    """``base`` with ``pattern_id`` in place of its capability's choice, re-priced."""
    cap = pattern_id.split(":", 1)[0]
    plan = with_patterns(base, pattern_id).plan
    cost = estimate_plan_cost(plan, catalog(), base.constraints, prices())
    return base.model_copy(update={"plan": plan, "cost": cost, "project": f"swap-{cap}"})


def _fits(plan: Plan, pattern_id: str) -> bool:
    pattern = catalog().by_id()[pattern_id]
    cap = pattern_id.split(":", 1)[0]
    others = {pid for pid in plan.pattern_ids() if not pid.startswith(cap + ":")}
    return cap in {c.capability.value for c in plan.choices} and (
        not pattern.requires or bool(others & set(pattern.requires))
    )


@cache
def designs() -> dict[str, CodeGenRequest]:
    """Every design the test renders: the cases, the forms, then one per pattern left."""
    out: dict[str, CodeGenRequest] = {f"case:{c}": request_for(c) for c in CASES}
    out.update({f"form:{f}": request_for_form(f) for f in FORMS})
    chosen = {pid for req in out.values() for pid in req.plan.pattern_ids()}
    for pattern in catalog().patterns:
        if pattern.id in chosen:
            continue
        base = next(out[f"form:{b}"] for b in BASES if _fits(out[f"form:{b}"].plan, pattern.id))
        out[f"pattern:{pattern.id}"] = _swapped(base, pattern.id)
    return out


@cache
def rendered(name: str) -> tuple[list[CreatedResource], CostEstimate]:
    """The resources the design's Terraform creates, and its ``reports/cost.json``."""
    req = designs()[name]
    files = render_request(req)
    by_cap = {c.capability.value: c.pattern_id for c in req.plan.choices}
    created: list[CreatedResource] = []
    for path, text in sorted(files.items()):
        owner = module_owner(path, by_cap)
        if owner is not None:
            created.extend(resources_in(hcl2.loads(text), owner))
    cost = CostEstimate.model_validate(json.loads(files["reports/cost.json"]))
    return created, cost


def _regions(req: CodeGenRequest) -> list[str | None]:
    return list(req.plan.regions) or [None]


def test_every_catalogue_pattern_is_rendered() -> None:
    chosen = {pid for req in designs().values() for pid in req.plan.pattern_ids()}
    assert chosen == {p.id for p in catalog().patterns}


@pytest.mark.parametrize("name", sorted(designs()))
def test_every_created_resource_type_is_priced_or_free(name: str) -> None:
    created, cost = rendered(name)
    owners = {r.owner for r in created}
    assert FOUNDATION in owners and len(owners) > len(designs()[name].plan.choices)
    gaps = coverage_gaps(created, cost, prices(), _regions(designs()[name]))
    assert [g.line() for g in gaps] == []
    assert cost.unpriced == []


def test_a_type_with_no_entry_or_no_line_is_a_gap() -> None:
    """The check fails as it should: an unlisted type, a priced type without its line,
    an entry whose ``when`` does not hold."""
    created, cost = rendered("form:kinesis_online_one_region")
    regions = _regions(designs()["form:kinesis_online_one_region"])
    extra = CreatedResource(type="aws_instance", name="x", owner=FOUNDATION)
    gaps = coverage_gaps([*created, extra], cost, prices(), regions)
    assert [(g.owner, g.type) for g in gaps] == [(FOUNDATION, "aws_instance")]
    no_firehose = cost.model_copy(
        update={"breakdown": [x for x in cost.breakdown if x.service != "firehose_ingest"]}
    )
    gaps = coverage_gaps(created, no_firehose, prices(), regions)
    assert [(g.owner, g.type) for g in gaps] == [
        ("ingest:kinesis-streams", "aws_kinesis_firehose_delivery_stream")
    ]
    rest = CreatedResource(
        type="aws_apigatewayv2_api",
        name="x",
        owner="serve:lambda-serverless",
        attributes={"protocol_type": "WEBSOCKET"},
    )
    interface = CreatedResource(
        type="aws_vpc_endpoint",
        name="x",
        owner=FOUNDATION,
        attributes={"vpc_endpoint_type": "Interface"},
    )
    gaps = coverage_gaps([rest, interface], cost, prices(), regions)
    assert {g.type for g in gaps} == {"aws_apigatewayv2_api", "aws_vpc_endpoint"}


def test_the_coverage_map_names_real_prices_and_gives_reasons() -> None:
    table = prices()
    cover = table.terraform
    assert not set(cover.priced) & set(cover.free)
    for rtype, entry in cover.priced.items():
        assert rtype.startswith("aws_") and set(entry.prices) <= set(table.prices), rtype
    for rtype, free in cover.free.items():
        assert rtype.startswith("aws_") and free.reason.strip(), rtype
        assert set(free.usage) <= set(table.prices), rtype


def _lines(cost: CostEstimate, pattern_id: str, service: str) -> list[Any]:
    return [x for x in cost.breakdown if x.pattern_id == pattern_id and x.service == service]


def test_the_http_api_is_priced_as_an_http_api() -> None:
    name = next(
        n for n, r in designs().items() if "serve:lambda-serverless" in r.plan.pattern_ids()
    )
    created, cost = rendered(name)
    apis = [
        r
        for r in created
        if r.type.startswith("aws_api_gateway") or r.type == "aws_apigatewayv2_api"
    ]
    assert [(r.type, r.attributes.get("protocol_type")) for r in apis] == [
        ("aws_apigatewayv2_api", "HTTP")
    ]
    http = _lines(cost, "serve:lambda-serverless", "api_gateway_http_requests")
    assert http and {Decimal(x.unit_usd) for x in http} == {Decimal("1.00")}
    assert "HTTP API" in http[0].price_source
    assert not [x for x in cost.breakdown if x.service == "api_gateway_requests"]


def test_dynamodb_is_priced_on_demand_at_the_current_price() -> None:
    _, cost = rendered("form:kinesis_online_one_region")
    pid = "feature:dynamodb-online-features"
    expected = {"dynamodb_write": "0.625", "dynamodb_read": "0.125", "dynamodb_storage": "0.25"}
    for service, usd in expected.items():
        (line,) = _lines(cost, pid, service)
        assert Decimal(line.unit_usd) == Decimal(usd), service
        assert line.price_as_of == "2026-12-06", service
        assert "us-east-1" in line.price_source
    assert "November 2024" in prices().prices["dynamodb_write"].source


def test_the_streaming_design_prices_its_nat_gateway_and_firehose() -> None:
    _, cost = rendered("form:streaming_three_regions_high")
    req = designs()["form:streaming_three_regions_high"]
    for region in req.plan.regions:
        services = {
            x.service for x in cost.breakdown if x.pattern_id == FOUNDATION and x.region == region
        }
        assert {"nat_gateway_hour", "nat_gateway_data", "public_ipv4", "vended_logs"} <= services
    _, kinesis = rendered("form:kinesis_online_one_region")
    assert _lines(kinesis, "ingest:kinesis-streams", "firehose_ingest")
    assert _lines(kinesis, "ingest:kinesis-streams", "kinesis_put_units")


# ------------------------------------------------------------------ ten times the data

#: Forms priced at a data volume and at ten times it (streaming and batch).
TEN_X = {
    "kinesis_online_one_region": 50.0,
    "batch_one_region_low": 50.0,
    "streaming_three_regions_high": 500.0,
}


def _priced_at(form: str, gb_per_day: float) -> CostEstimate:
    data = dict(FORMS[form])
    data["throughput"] = {**(data.get("throughput") or {}), "data_gb_per_day": gb_per_day}
    constraints = parse_constraints(data)
    plan = request_for_form(form).plan
    return estimate_plan_cost(plan, catalog(), constraints, prices())


@pytest.mark.parametrize("form", sorted(TEN_X))
def test_ten_times_the_data_costs_more_line_by_line(form: str) -> None:
    """Same plan, ten times ``data_gb_per_day``: every line that follows from the data
    volume costs more, every other line the same, the total more."""
    base = _priced_at(form, TEN_X[form])
    ten = _priced_at(form, 10 * TEN_X[form])
    key = [(x.pattern_id, x.service, x.region, x.formula.split(" = ")[0]) for x in base.breakdown]
    assert key == [
        (x.pattern_id, x.service, x.region, x.formula.split(" = ")[0]) for x in ten.breakdown
    ]
    grew = 0
    for before, after in zip(base.breakdown, ten.breakdown, strict=True):
        if "data_gb_per_day" in before.depends_on:
            assert after.usd > before.usd, before.formula
            grew += 1
        else:
            assert after.usd == before.usd, before.formula
    assert grew > 0 and ten.monthly_usd > base.monthly_usd
    volume = {
        (x.pattern_id, x.service) for x in base.breakdown if "data_gb_per_day" in x.depends_on
    }
    assert (FOUNDATION, "nat_gateway_data") in volume and (FOUNDATION, "vended_logs") in volume
    if form == "kinesis_online_one_region":
        assert {
            ("ingest:kinesis-streams", "firehose_ingest"),
            ("ingest:kinesis-streams", "kinesis_put_units"),
        } <= volume


BASELINE_PRICES = {"config_items", "config_rule_evaluations", "macie_buckets", "macie_scanned"}


def _with_baseline(req: CodeGenRequest, on: bool | None) -> CodeGenRequest:
    constraints = req.constraints.model_copy(update={"account_baseline": on})
    cost = estimate_plan_cost(req.plan, catalog(), constraints, prices())
    return req.model_copy(update={"constraints": constraints, "cost": cost})


@pytest.mark.parametrize("on", [None, False, True])
def test_the_account_baseline_switches_the_config_and_macie_lines(on: bool | None) -> None:
    """Issue 38 §3: AWS Config and Macie are rendered only with the account baseline, so
    only then billed; with it on, the lines are back and every created type is priced."""
    req = _with_baseline(designs()["case:streaming_features"], on)
    assert "govern:model-registry-config" in req.plan.pattern_ids()
    govern = [c for c in req.cost.breakdown if c.pattern_id == "govern:model-registry-config"]
    billed = {c.service for c in govern}
    buckets = [c for c in govern if c.service == "s3_storage"]
    switch = next(v for v in req.cost.workload if v.name == "account_baseline")
    assert switch.source == "switch" and switch.value == (1 if on else 0)
    assert "account_baseline" not in {v.name for v in req.cost.assumed}
    if on:
        assert billed >= BASELINE_PRICES
        assert len(buckets) == 2  # the audit bucket and the AWS Config bucket
        config = next(c for c in govern if c.service == "config_items")
        assert "account_baseline" in config.depends_on and config.usd > 0
    else:
        assert not BASELINE_PRICES & billed
        assert [b.formula.split(" = ")[0] for b in buckets] == ["audit_gb_kept"]
        assert "cloudtrail_events" in billed
    files = render_request(req)
    by_cap = {c.capability.value: c.pattern_id for c in req.plan.choices}
    created = [
        r
        for path, text in sorted(files.items())
        if (owner := module_owner(path, by_cap)) is not None
        for r in resources_in(hcl2.loads(text), owner)
    ]
    types = {r.type for r in created}
    assert ("aws_config_configuration_recorder" in types) is bool(on)
    assert ("aws_macie2_account" in types) is bool(on)
    cost = CostEstimate.model_validate(json.loads(files["reports/cost.json"]))
    assert cost.monthly_usd == req.cost.monthly_usd
    assert [g.line() for g in coverage_gaps(created, cost, prices(), _regions(req))] == []


def test_the_baseline_adds_exactly_its_lines_to_the_total() -> None:
    base = designs()["case:streaming_features"]
    off = _with_baseline(base, False).cost
    on = _with_baseline(base, True).cost
    extra = [c for c in on.breakdown if c not in off.breakdown]
    assert {c.service for c in extra} == BASELINE_PRICES | {"s3_storage"}
    assert Decimal(str(on.monthly_usd)) - Decimal(str(off.monthly_usd)) == sum(
        (Decimal(str(c.usd)) for c in extra), Decimal(0)
    )
