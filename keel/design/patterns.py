"""Capability patterns: the opinionated building blocks the planner composes (plan §5.2).

The catalogue is data (``configs/design/patterns.yaml``); :func:`load_patterns` takes the
parsed YAML, so this module stays pure. Each pattern says what it suits (workloads,
deployment kind), what it guarantees (latency, throughput, availability, compliance
eligibility), what it costs (a bill of materials priced by :mod:`keel.design.critics`)
and what it leans on (``requires``, ``couples_to``), which the critics read.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from keel.design.constraints import Cloud, Compliance, WorkloadType
from keel.design.errors import DesignIssue, PatternError, issues_from_validation
from keel.design.workload import FormulaError, WorkloadSpec, formula_names


class Capability(StrEnum):
    INGEST = "ingest"
    TRANSFORM = "transform"
    STORE = "store"
    FEATURE = "feature"
    TRAIN = "train"
    SERVE = "serve"
    OBSERVE = "observe"
    GOVERN = "govern"


# Every plan covers the whole lifecycle; a batch-only system still "serves" (batch scoring).
MANDATORY_CAPABILITIES: tuple[Capability, ...] = tuple(Capability)


class Deployment(StrEnum):
    SERVERLESS = "serverless"
    CONTAINERS = "containers"
    MANAGED = "managed"


class BomItem(BaseModel):
    """One monthly resource line of ``unit`` of price-table key ``resource``, per region.

    ``formula`` gives the quantity from the workload (:mod:`keel.design.workload`);
    ``quantity`` is the fixed quantity of catalogues before formulas (``patterns_v1``,
    still in older workflow histories), priced as a constant when there is no formula.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    resource: str = Field(min_length=1)
    quantity: float | None = Field(default=None, ge=0)
    formula: str | None = None
    unit: str = Field(min_length=1)
    note: str = ""

    @model_validator(mode="after")
    def _quantity_or_formula(self) -> BomItem:
        if self.quantity is None and self.formula is None:
            raise ValueError("needs a formula (or a fixed quantity)")
        return self

    def expression(self) -> str:
        """The formula, or the fixed quantity written as one."""
        return self.formula if self.formula is not None else repr(float(self.quantity or 0))


class Pattern(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z]+:[a-z0-9-]+$", description="capability:name")
    capability: Capability
    cloud: Cloud
    summary: str
    workloads: list[WorkloadType] = Field(min_length=1)
    deployment: Deployment
    cost_tier: int = Field(ge=1, le=3, description="1 cheapest, 3 dearest")
    p95_latency_ms: int | None = Field(default=None, gt=0)
    max_rps: float | None = Field(default=None, gt=0)
    availability: float = Field(ge=90.0, lt=100.0)
    compliance: list[Compliance] = Field(default_factory=list)
    failure_domain: Literal["instance", "az", "region"]
    tags: list[str] = Field(default_factory=list)
    requires: list[str] = Field(default_factory=list, description="pattern ids it needs")
    couples_to: list[str] = Field(default_factory=list, description="pattern ids it binds to")
    bom: list[BomItem] = Field(default_factory=list)
    pros: list[str] = Field(default_factory=list)
    cons: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _id_names_capability(self) -> Pattern:
        if self.id.split(":", 1)[0] != self.capability.value:
            raise ValueError(f"id {self.id!r} must start with '{self.capability.value}:'")
        return self


class PatternCatalog(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: str
    patterns: list[Pattern]
    # The named values BOM formulas use; None in catalogues before formulas.
    workload: WorkloadSpec | None = None
    # Lines every plan pays whatever its patterns: ``foundation`` once per region (the
    # network and logging module the root creates in each region), ``every_module`` once
    # per chosen pattern per region (what each capability module creates besides the
    # pattern's own resources, e.g. its KMS key). Empty in catalogues before issue 38.
    foundation: list[BomItem] = Field(default_factory=list)
    every_module: list[BomItem] = Field(default_factory=list)

    def by_id(self) -> dict[str, Pattern]:
        return {p.id: p for p in self.patterns}

    def for_capability(self, capability: Capability, cloud: Cloud) -> list[Pattern]:
        """Patterns of one capability on one cloud, in catalogue order."""
        return [p for p in self.patterns if p.capability == capability and p.cloud == cloud]


def load_patterns(data: Mapping[str, Any]) -> PatternCatalog:
    """Validate parsed ``patterns.yaml``: ``{version, patterns: {capability: [pattern]}}``.

    The capability key is filled into each pattern. Ids must be unique and every
    ``requires``/``couples_to`` must name a pattern in the catalogue.
    """
    raw = dict(data)
    grouped = raw.get("patterns")
    if not isinstance(grouped, Mapping):
        raise PatternError([DesignIssue(field="patterns", message="must be a mapping")])
    flat: list[dict[str, Any]] = []
    for capability, items in grouped.items():
        if not isinstance(items, list):
            raise PatternError(
                [DesignIssue(field=f"patterns.{capability}", message="must be a list")]
            )
        for item in items:
            flat.append({"capability": capability, **dict(item)})
    try:
        catalog = PatternCatalog.model_validate(
            {
                "version": raw.get("version"),
                "patterns": flat,
                "workload": raw.get("workload"),
                "foundation": _shared_bom(raw, "foundation"),
                "every_module": _shared_bom(raw, "every_module"),
            }
        )
    except ValidationError as exc:
        raise PatternError(issues_from_validation(exc)) from None
    issues: list[DesignIssue] = []
    seen: set[str] = set()
    for p in catalog.patterns:
        if p.id in seen:
            issues.append(DesignIssue(field=f"patterns.{p.id}", message="duplicate id"))
        seen.add(p.id)
    for p in catalog.patterns:
        for ref in (*p.requires, *p.couples_to):
            if ref not in seen:
                issues.append(
                    DesignIssue(field=f"patterns.{p.id}", message=f"unknown pattern {ref!r}")
                )
    issues.extend(_formula_issues(catalog))
    if issues:
        raise PatternError(issues)
    return catalog


def _shared_bom(raw: Mapping[str, Any], key: str) -> Any:
    """``raw[key]["bom"]`` (a list of BOM items), or ``[]`` when the section is absent."""
    section = raw.get(key)
    if section is None:
        return []
    if not isinstance(section, Mapping):
        raise PatternError([DesignIssue(field=key, message="must be a mapping with a bom list")])
    return section.get("bom") or []


def _formula_issues(catalog: PatternCatalog) -> list[DesignIssue]:
    """Each workload definition and BOM formula must parse and use only defined names."""
    spec = catalog.workload
    issues = [
        DesignIssue(field=f"workload.{name}", message=msg)
        for name, msg in (spec.problems() if spec else [])
    ]
    known = set(spec.names()) if spec else set()
    sections = [
        ("foundation", catalog.foundation),
        ("every_module", catalog.every_module),
        *((f"patterns.{p.id}", p.bom) for p in catalog.patterns),
    ]
    for section, bom in sections:
        for n, item in enumerate(bom):
            if item.formula is None:
                continue
            where = f"{section}.bom.{n}"
            try:
                unknown = [x for x in formula_names(item.formula) if x not in known]
            except FormulaError as exc:
                issues.append(DesignIssue(field=where, message=str(exc)))
                continue
            if unknown:
                issues.append(
                    DesignIssue(field=where, message=f"unknown name(s): {', '.join(unknown)}")
                )
    return issues
