"""The technical critic and the cost critic (§21.1 nodes 5 and 6, §21.5).

The technical critic reads the plan against the catalogue and constraints and lists risks
in four kinds: feasibility, coupling, bottleneck and failure domain. The cost critic
prices the plan's bill of materials from a price table passed in as data. Money is summed
in :class:`~decimal.Decimal` and rounded to cents once per line, so the same plan always
costs the same to the cent. A BOM line the table cannot price (no entry, or another
unit) is listed as unpriced and left out of the total, never counted as $0.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keel.design.constraints import Constraints, WorkloadType
from keel.design.errors import PriceTableError, issues_from_validation
from keel.design.patterns import Capability, PatternCatalog
from keel.design.planner import Plan

RiskKind = Literal["feasibility", "coupling", "bottleneck", "failure_domain"]
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


def review_plan(constraints: Constraints, plan: Plan, catalog: PatternCatalog) -> TechReview:
    """List the plan's risks, in a fixed order (feasibility, coupling, bottleneck,
    failure domain; within each, capability order)."""
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

    tp = constraints.throughput
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
    return TechReview(risks=risks)


class Price(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    unit: str
    usd: Decimal = Field(gt=0)
    # Where the number was copied from (page name and region class); empty in tables
    # before provenance was recorded.
    source: str = ""


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


def load_prices(data: Mapping[str, Any]) -> PriceTable:
    """Validate parsed ``prices.yaml``; errors name the offending key."""
    try:
        return PriceTable.model_validate(dict(data))
    except ValidationError as exc:
        raise PriceTableError(issues_from_validation(exc)) from None


class BomLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern_id: str
    resource: str
    quantity: float
    unit: str
    region: str | None = None


class CostLine(BaseModel):
    """A priced line, in the §22.2 breakdown shape plus where it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    qty: str
    usd: float
    pattern_id: str
    region: str | None = None


class UnpricedLine(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str
    qty: str
    pattern_id: str
    reason: str


class CostEstimate(BaseModel):
    """The §22.2 Cost Estimate, with the unpriced lines beside the priced ones."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    monthly_usd: float
    breakdown: list[CostLine]
    unpriced: list[UnpricedLine] = Field(default_factory=list)
    method: str
    delta_vs_prev_usd: float | None = None
    delta_vs_prev_pct: float | None = None

    @property
    def complete(self) -> bool:
        return not self.unpriced


def bill_of_materials(plan: Plan, catalog: PatternCatalog) -> list[BomLine]:
    """The plan's resources: each chosen pattern's BOM once per region (one
    region-agnostic copy when no region is stated)."""
    by_id = catalog.by_id()
    regions: list[str | None] = list(plan.regions) or [None]
    lines: list[BomLine] = []
    for region in regions:
        for pid in plan.pattern_ids():
            pattern = by_id.get(pid)
            if pattern is None:
                continue
            for item in pattern.bom:
                lines.append(
                    BomLine(
                        pattern_id=pid,
                        resource=item.resource,
                        quantity=item.quantity,
                        unit=item.unit,
                        region=region,
                    )
                )
    return lines


def _qty(line: BomLine) -> str:
    return f"{line.quantity:g} {line.unit}"


def estimate_cost(
    bom: list[BomLine], prices: PriceTable, previous: CostEstimate | None = None
) -> CostEstimate:
    """Price ``bom``; with ``previous``, the delta against it in USD and percent.

    The percent is ``None`` when the previous total was zero (no meaningful ratio).
    A region missing from ``region_factor`` is priced at factor 1.
    """
    breakdown: list[CostLine] = []
    unpriced: list[UnpricedLine] = []
    total = Decimal(0)
    for line in bom:
        price = prices.prices.get(line.resource)
        if price is None:
            unpriced.append(
                UnpricedLine(
                    service=line.resource,
                    qty=_qty(line),
                    pattern_id=line.pattern_id,
                    reason="no price in the table",
                )
            )
            continue
        if price.unit != line.unit:
            unpriced.append(
                UnpricedLine(
                    service=line.resource,
                    qty=_qty(line),
                    pattern_id=line.pattern_id,
                    reason=f"priced per {price.unit}, asked in {line.unit}",
                )
            )
            continue
        factor = prices.region_factor.get(line.region or "", Decimal(1))
        usd = (Decimal(str(line.quantity)) * price.usd * factor).quantize(
            CENT, rounding=ROUND_HALF_EVEN
        )
        total += usd
        breakdown.append(
            CostLine(
                service=line.resource,
                qty=_qty(line),
                usd=float(usd),
                pattern_id=line.pattern_id,
                region=line.region,
            )
        )
    delta_usd: float | None = None
    delta_pct: float | None = None
    if previous is not None:
        prev = Decimal(str(previous.monthly_usd))
        delta = total - prev
        delta_usd = float(delta)
        if prev != 0:
            delta_pct = float((delta / prev * 100).quantize(Decimal("0.1")))
    return CostEstimate(
        monthly_usd=float(total),
        breakdown=breakdown,
        unpriced=unpriced,
        method=prices.method,
        delta_vs_prev_usd=delta_usd,
        delta_vs_prev_pct=delta_pct,
    )
