"""The technical critic and the cost critic (§21.1 nodes 5 and 6, §21.5).

The technical critic reads the plan against the catalogue and constraints and lists risks
in four kinds: feasibility, coupling, bottleneck and failure domain. The cost critic
prices the plan's bill of materials from a price table passed in as data. Money is summed
in :class:`~decimal.Decimal` and rounded to cents once per line, so the same plan always
costs the same to the cent. A BOM line the table cannot price (no entry, or another
unit) is listed as unpriced and left out of the total, never counted as $0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keel.design.constraints import Constraints, WorkloadType
from keel.design.diff import cost_delta
from keel.design.errors import PriceTableError, issues_from_validation
from keel.design.patterns import BomItem, Capability, Pattern, PatternCatalog
from keel.design.planner import Plan
from keel.design.workload import (
    Workload,
    WorkloadValue,
    compute_workload,
    evaluate,
    fmt_number,
    formula_names,
)

RiskKind = Literal[
    "feasibility", "coupling", "bottleneck", "failure_domain", "compliance", "security", "cost"
]
Severity = Literal["low", "medium", "high"]

# Headroom under a pattern's rated throughput before the critic calls it a bottleneck.
BOTTLENECK_HEADROOM = 0.7
# From this availability target up, one region is a single failure domain worth flagging.
MULTI_REGION_AVAILABILITY = 99.95

CENT = Decimal("0.01")


class Risk(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    kind: RiskKind
    severity: Severity
    detail: str
    patterns: list[str] = Field(default_factory=list)


class TechReview(BaseModel):
    """The ``critic_tech`` output."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    risks: list[Risk]

    @property
    def worst(self) -> Severity | None:
        for level in ("high", "medium", "low"):
            if any(r.severity == level for r in self.risks):
                return level  # type: ignore[return-value]
        return None


def _feasibility_risks(plan: Plan, catalog: PatternCatalog) -> list[Risk]:
    """Gaps, patterns not in the catalogue and unmet ``requires`` (all high)."""
    by_id = catalog.by_id()
    chosen = [by_id[pid] for pid in plan.pattern_ids() if pid in by_id]
    chosen_ids = {p.id for p in chosen}
    risks: list[Risk] = []
    for gap in plan.gaps:
        risks.append(
            Risk(
                id=f"feasibility:gap:{gap.capability.value}",
                kind="feasibility",
                severity="high",
                detail=gap.detail,
            )
        )
    for pid in plan.pattern_ids():
        if pid not in by_id:
            risks.append(
                Risk(
                    id=f"feasibility:unknown:{pid}",
                    kind="feasibility",
                    severity="high",
                    detail=f"{pid} is not in catalogue {catalog.version}",
                    patterns=[pid],
                )
            )
    for p in chosen:
        if p.requires and not set(p.requires) & chosen_ids:
            risks.append(
                Risk(
                    id=f"feasibility:requires:{p.id}",
                    kind="feasibility",
                    severity="high",
                    detail=f"{p.id} needs one of {', '.join(p.requires)}",
                    patterns=[p.id],
                )
            )
    return risks


def _coupling_risks(chosen: list[Pattern]) -> list[Risk]:
    """A chosen pattern tightly coupled to other chosen ones (medium)."""
    chosen_ids = {p.id for p in chosen}
    risks: list[Risk] = []
    for p in chosen:
        bound = sorted(set(p.couples_to) & chosen_ids)
        if bound:
            risks.append(
                Risk(
                    id=f"coupling:{p.id}",
                    kind="coupling",
                    severity="medium",
                    detail=f"{p.id} is tightly coupled to {', '.join(bound)}: "
                    "replacing one means reworking the other",
                    patterns=[p.id, *bound],
                )
            )
    return risks


def _bottleneck_risks(constraints: Constraints, chosen: list[Pattern]) -> list[Risk]:
    """Rated patterns asked for more than their headroom allows, or not sized at all."""
    tp = constraints.throughput
    risks: list[Risk] = []
    for p in chosen:
        if p.max_rps is None:
            continue
        asked = None
        if tp is not None:
            asked = tp.requests_per_s if p.capability == Capability.SERVE else None
            if p.capability == Capability.INGEST:
                asked = tp.events_per_s
        if asked is not None and asked > p.max_rps * BOTTLENECK_HEADROOM:
            risks.append(
                Risk(
                    id=f"bottleneck:{p.id}",
                    kind="bottleneck",
                    severity="high" if asked > p.max_rps else "medium",
                    detail=f"{asked:g}/s asked against {p.max_rps:g}/s rated for {p.id}",
                    patterns=[p.id],
                )
            )
        elif asked is None and p.capability in (Capability.SERVE, Capability.INGEST):
            risks.append(
                Risk(
                    id=f"bottleneck:unsized:{p.id}",
                    kind="bottleneck",
                    severity="low",
                    detail=f"no throughput stated; {p.id} is rated for {p.max_rps:g}/s",
                    patterns=[p.id],
                )
            )
    return risks


def _failure_domain_risks(
    constraints: Constraints, plan: Plan, chosen: list[Pattern]
) -> list[Risk]:
    """Single-instance patterns, and one region under a multi-region availability."""
    risks: list[Risk] = []
    single = [p.id for p in chosen if p.failure_domain == "instance"]
    if single:
        risks.append(
            Risk(
                id="failure_domain:instance",
                kind="failure_domain",
                severity="medium",
                detail="runs on a single instance: " + ", ".join(single),
                patterns=single,
            )
        )
    target = constraints.availability_target
    if (
        target is not None
        and target >= MULTI_REGION_AVAILABILITY
        and len(plan.regions) < 2
        and WorkloadType.ONLINE in plan.workloads
    ):
        risks.append(
            Risk(
                id="failure_domain:single_region",
                kind="failure_domain",
                severity="high",
                detail=f"{target}% availability from one region: a regional outage is an outage",
            )
        )
    return risks


def review_plan(constraints: Constraints, plan: Plan, catalog: PatternCatalog) -> TechReview:
    """List the plan's risks, in a fixed order (feasibility, coupling, bottleneck,
    failure domain; within each, capability order)."""
    by_id = catalog.by_id()
    chosen = [by_id[pid] for pid in plan.pattern_ids() if pid in by_id]
    return TechReview(
        risks=[
            *_feasibility_risks(plan, catalog),
            *_coupling_risks(chosen),
            *_bottleneck_risks(constraints, chosen),
            *_failure_domain_risks(constraints, plan, chosen),
        ]
    )


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str
    usd: Decimal = Field(gt=0)
    # Where the number was copied from (page name and region class); empty in tables
    # before provenance was recorded.
    source: str = ""
    # The day this price was last checked, when it differs from the table's ``as_of``.
    as_of: date | None = None


class TerraformPriced(BaseModel):
    """A Terraform resource type that costs money: the price keys whose lines bill it.

    ``when`` (attribute -> value) narrows the entry to resources set up that way (an
    ``aws_apigatewayv2_api`` with ``protocol_type = "HTTP"`` is billed as an HTTP API).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prices: list[str] = Field(min_length=1)
    when: dict[str, str] = Field(default_factory=dict)
    note: str = ""


class TerraformFree(BaseModel):
    """A Terraform resource type with no charge of its own, and why; ``usage`` names the
    price keys where what it carries or triggers is priced instead, if anywhere."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: str = Field(min_length=1)
    when: dict[str, str] = Field(default_factory=dict)
    usage: list[str] = Field(default_factory=list)


class TerraformCoverage(BaseModel):
    """Which Terraform resource types are billed (and by which prices) and which are free:
    every type the generated Terraform creates must be in one of the two."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    priced: dict[str, TerraformPriced] = Field(default_factory=dict)
    free: dict[str, TerraformFree] = Field(default_factory=dict)


class PriceTable(BaseModel):
    """``configs/design/prices.yaml``: list prices copied by hand on ``as_of``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: str
    # Older tables (in older workflow histories) had neither: the defaults keep them valid.
    version: str = "unversioned"
    as_of: date | None = None
    provenance: str = ""
    currency: Literal["USD"] = "USD"
    region_factor: dict[str, Decimal] = Field(default_factory=dict)
    prices: dict[str, Price]
    # Tables before issue 38 had no coverage map: the default keeps them valid.
    terraform: TerraformCoverage = Field(default_factory=TerraformCoverage)


def load_prices(data: Mapping[str, Any]) -> PriceTable:
    """Validate parsed ``prices.yaml``; errors name the offending key."""
    try:
        return PriceTable.model_validate(dict(data))
    except ValidationError as exc:
        raise PriceTableError(issues_from_validation(exc)) from None


class BomLine(BaseModel):
    """One resource line of one region, its quantity with the formula that gave it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern_id: str
    resource: str
    quantity: float
    unit: str
    region: str | None = None
    # The quantity's expression as written, the value of each name it uses, the
    # workload inputs it follows from, and the whole shown with numbers filled in.
    formula: str = ""
    inputs: dict[str, float] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    shown: str = ""


class CostLine(BaseModel):
    """A priced line, in the §22.2 breakdown shape plus where it came from.

    ``formula`` shows how the quantity follows from the workload, with the numbers
    filled in; ``unit_usd`` times ``region_factor`` times quantity, rounded to the cent, is
    ``usd``. The fields after ``region`` are empty in estimates made before formulas.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    qty: str
    usd: float
    pattern_id: str
    region: str | None = None
    capability: str = ""
    quantity: float | None = None
    unit: str = ""
    formula: str = ""
    inputs: dict[str, float] = Field(default_factory=dict)
    depends_on: list[str] = Field(default_factory=list)
    unit_usd: str = ""
    region_factor: str = ""
    price_source: str = ""
    # The day the unit price was checked (the price's own date, else the table's).
    price_as_of: str = ""


class UnpricedLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    qty: str
    pattern_id: str
    reason: str


class CostEstimate(BaseModel):
    """The §22.2 Cost Estimate, with the unpriced lines beside the priced ones.

    ``by_capability`` sums the priced lines per capability (the pattern id's prefix);
    the sums add up to ``monthly_usd`` to the cent. ``workload`` lists every named value
    the formulas used and where it came from; ``prices`` names the price table.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    monthly_usd: float
    breakdown: list[CostLine]
    unpriced: list[UnpricedLine] = Field(default_factory=list)
    method: str
    delta_vs_prev_usd: float | None = None
    delta_vs_prev_pct: float | None = None
    by_capability: dict[str, float] = Field(default_factory=dict)
    workload: list[WorkloadValue] = Field(default_factory=list)
    prices: dict[str, str] = Field(default_factory=dict)
    previous_method: str | None = None

    @property
    def complete(self) -> bool:
        return not self.unpriced

    @property
    def assumed(self) -> list[WorkloadValue]:
        """Workload inputs the form did not state, priced at their defaults."""
        return [v for v in self.workload if v.source == "default"]


def workload_of(catalog: PatternCatalog, constraints: Constraints | None) -> Workload:
    """The named values of ``catalog``'s workload for ``constraints`` (none stated when
    ``None``); empty for a catalogue without a workload section."""
    if catalog.workload is None:
        return Workload()
    return compute_workload(catalog.workload, constraints or Constraints())


#: The pattern id of the lines of ``foundation`` in the catalogue (the per-region network
#: and logging module every plan creates); its capability in ``by_capability`` too.
FOUNDATION = "foundation"


def bill_of_materials(
    plan: Plan, catalog: PatternCatalog, constraints: Constraints | None = None
) -> list[BomLine]:
    """The plan's resources: the catalogue's ``foundation`` lines and each chosen
    pattern's BOM (with the ``every_module`` lines) once per region (one
    region-agnostic copy when no region is stated), each quantity its formula's value
    for the workload of ``constraints`` (``None``: every workload input at its default).
    A line whose formula uses a switch that is off (see :mod:`keel.design.workload`) is
    left out: the templates do not create it. A BOM item without a formula (catalogues before formulas) keeps its fixed quantity.
    """
    by_id = catalog.by_id()
    workload = workload_of(catalog, constraints)
    env = workload.env()
    regions: list[str | None] = list(plan.regions) or [None]
    lines: list[BomLine] = []

    def add(pid: str, item: BomItem, region: str | None) -> None:
        expr = item.expression()
        if workload.switched_off(expr):
            # A resource the templates render only with a switch on (the account
            # baseline's AWS Config and Macie): not created, so not billed.
            return
        quantity = evaluate(expr, env)
        lines.append(
            BomLine(
                pattern_id=pid,
                resource=item.resource,
                quantity=quantity,
                unit=item.unit,
                region=region,
                formula=item.formula or "",
                inputs={n: env[n] for n in formula_names(expr)},
                depends_on=workload.depends_on(expr),
                shown=(
                    workload.explain(expr, quantity, item.unit)
                    if item.formula
                    else f"{fmt_number(quantity)} {item.unit} (fixed)"
                ),
            )
        )

    for region in regions:
        for item in catalog.foundation:
            add(FOUNDATION, item, region)
        for pid in plan.pattern_ids():
            pattern = by_id.get(pid)
            if pattern is None:
                continue
            for item in (*pattern.bom, *catalog.every_module):
                add(pid, item, region)
    return lines


def _qty(line: BomLine) -> str:
    return f"{line.quantity:g} {line.unit}"


def _unpriced_reason(line: BomLine, price: Price | None) -> str | None:
    """Why ``line`` cannot be priced by ``price``, or ``None`` when it can."""
    if price is None:
        return "no price in the table"
    if price.unit != line.unit:
        return f"priced per {price.unit}, asked in {line.unit}"
    if not math.isfinite(line.quantity) or line.quantity < 0:
        return f"quantity {line.quantity} is not a finite non-negative number"
    return None


def _cost_line(line: BomLine, price: Price, prices: PriceTable) -> tuple[CostLine, Decimal]:
    """``line`` priced (quantity times unit price times region factor, to the cent), and
    its amount as a Decimal."""
    factor = prices.region_factor.get(line.region or "", Decimal(1))
    usd = (Decimal(str(line.quantity)) * price.usd * factor).quantize(
        CENT, rounding=ROUND_HALF_EVEN
    )
    cost = CostLine(
        service=line.resource,
        qty=_qty(line),
        usd=float(usd),
        pattern_id=line.pattern_id,
        region=line.region,
        capability=line.pattern_id.split(":", 1)[0],
        quantity=line.quantity,
        unit=line.unit,
        formula=line.shown or _qty(line),
        inputs=line.inputs,
        depends_on=line.depends_on,
        unit_usd=str(price.usd),
        region_factor=str(factor),
        price_source=price.source,
        price_as_of=str(price.as_of or prices.as_of or ""),
    )
    return cost, usd


def _table_names(prices: PriceTable) -> dict[str, str]:
    """What names the price table in an estimate (method, version, as of, provenance)."""
    table = {"method": prices.method, "version": prices.version}
    if prices.as_of is not None:
        table["as_of"] = prices.as_of.isoformat()
    if prices.provenance:
        table["provenance"] = prices.provenance
    return table


def estimate_cost(
    bom: list[BomLine],
    prices: PriceTable,
    previous: CostEstimate | None = None,
    workload: Workload | None = None,
) -> CostEstimate:
    """Price ``bom``; with ``previous``, the delta against it in USD and percent.

    The percent is ``None`` when the previous total was zero (no meaningful ratio).
    A region missing from ``region_factor`` is priced at factor 1. ``workload`` is
    recorded beside the lines (see :func:`workload_of`).
    """
    breakdown: list[CostLine] = []
    unpriced: list[UnpricedLine] = []
    total = Decimal(0)
    by_capability: dict[str, Decimal] = {}
    for line in bom:
        price = prices.prices.get(line.resource)
        reason = _unpriced_reason(line, price)
        if price is None or reason is not None:
            unpriced.append(
                UnpricedLine(
                    service=line.resource,
                    qty=_qty(line),
                    pattern_id=line.pattern_id,
                    reason=reason or "",
                )
            )
            continue
        cost, usd = _cost_line(line, price, prices)
        total += usd
        by_capability[cost.capability] = by_capability.get(cost.capability, Decimal(0)) + usd
        breakdown.append(cost)
    delta_usd, delta_pct = cost_delta(previous.monthly_usd if previous else None, total)
    return CostEstimate(
        monthly_usd=float(total),
        breakdown=breakdown,
        unpriced=unpriced,
        method=prices.method,
        delta_vs_prev_usd=delta_usd,
        delta_vs_prev_pct=delta_pct,
        by_capability={k: float(v) for k, v in sorted(by_capability.items())},
        workload=list(workload.values) if workload else [],
        prices=_table_names(prices),
        previous_method=previous.method if previous is not None else None,
    )


def estimate_plan_cost(
    plan: Plan,
    catalog: PatternCatalog,
    constraints: Constraints | None,
    prices: PriceTable,
    previous: CostEstimate | None = None,
) -> CostEstimate:
    """The cost critic in one call: ``plan``'s bill of materials sized from the workload
    of ``constraints``, priced, with the workload recorded beside the lines."""
    return estimate_cost(
        bill_of_materials(plan, catalog, constraints),
        prices,
        previous,
        workload_of(catalog, constraints),
    )
