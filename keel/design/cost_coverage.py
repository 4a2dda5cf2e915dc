"""Every billed resource priced (issue 38 §4): the generated Terraform against the estimate.

The cost critic prices a plan's bill of materials (:mod:`keel.design.critics`); the
Terraform is rendered from templates (``activities/design/infra.py``). Nothing ties the
two together but this check: each resource type the Terraform creates must either be
billed by a line of ``reports/cost.json`` (one of the price keys ``prices.yaml`` names for
it under ``terraform.priced``, on the line of the module's pattern, in every region of
the plan) or be listed as free under ``terraform.free`` with the reason. A type in
neither list, or whose entry's ``when`` does not hold, is a gap.

The module is pure: it takes Terraform already parsed (python-hcl2's dictionaries), the
estimate and the price table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from keel.design.critics import FOUNDATION, CostEstimate, PriceTable


class CreatedResource(BaseModel):
    """One ``resource`` block: its type, name, the module it is in (a pattern id or
    ``foundation``) and its top-level string and number attributes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    name: str
    owner: str
    attributes: dict[str, str] = Field(default_factory=dict)


class CoverageGap(BaseModel):
    """A created resource type with no price line and no free entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    owner: str
    reason: str

    def line(self) -> str:
        return f"{self.owner}: {self.type}: {self.reason}"


def resources_in(doc: Mapping[str, Any], owner: str) -> list[CreatedResource]:
    """The ``resource`` blocks of one parsed ``.tf`` file (``hcl2.load``'s shape:
    ``{"resource": [{type: {name: {attr: value}}}]}``), attributed to ``owner``."""
    out: list[CreatedResource] = []
    for block in doc.get("resource", []) or []:
        for rtype, named in block.items():
            for name, body in (named or {}).items():
                attrs = {
                    k: str(v)
                    for k, v in (body or {}).items()
                    if isinstance(v, str | int | float) and not isinstance(v, bool)
                }
                out.append(CreatedResource(type=rtype, name=name, owner=owner, attributes=attrs))
    return out


def _holds(when: Mapping[str, str], resource: CreatedResource) -> bool:
    return all(resource.attributes.get(k) == v for k, v in when.items())


def coverage_gaps(
    created: Iterable[CreatedResource],
    cost: CostEstimate,
    table: PriceTable,
    regions: Iterable[str | None],
) -> list[CoverageGap]:
    """The created resources that are neither priced in ``cost`` nor listed as free.

    A priced type needs a line of its owner (pattern id, or ``foundation``) with one of
    its price keys in each of ``regions`` (the plan's regions; ``[None]`` for a plan
    without one). Each gap is reported once per (owner, type).
    """
    coverage = table.terraform
    regions = list(regions)
    billed: dict[tuple[str, str | None], set[str]] = {}
    for line in cost.breakdown:
        billed.setdefault((line.pattern_id, line.region), set()).add(line.service)
    gaps: dict[tuple[str, str], CoverageGap] = {}

    def gap(res: CreatedResource, reason: str) -> None:
        gaps.setdefault(
            (res.owner, res.type), CoverageGap(type=res.type, owner=res.owner, reason=reason)
        )

    for res in created:
        free = coverage.free.get(res.type)
        if free is not None and _holds(free.when, res):
            continue
        priced = coverage.priced.get(res.type)
        if priced is None or not _holds(priced.when, res):
            gap(res, "not priced and not listed as free in prices.yaml (terraform:)")
            continue
        unknown = [k for k in priced.prices if k not in table.prices]
        if unknown:
            gap(res, f"priced by {', '.join(unknown)}, which the price table does not have")
            continue
        missing = [
            r or "(no region)"
            for r in regions
            if not billed.get((res.owner, r), set()) & set(priced.prices)
        ]
        if missing:
            gap(
                res,
                f"no line of {' or '.join(priced.prices)} for {res.owner} in " + ", ".join(missing),
            )
    return list(gaps.values())


def module_owner(path: str, pattern_by_capability: Mapping[str, str]) -> str | None:
    """The owner of a generated ``.tf`` file: ``foundation``, the pattern id of a
    capability module, ``root`` for the root module; ``None`` for anything else."""
    parts = path.split("/")
    if parts[0] != "infra" or not path.endswith(".tf"):
        return None
    if len(parts) == 2:
        return "root"
    if len(parts) == 4 and parts[1] == "modules":
        if parts[2] == FOUNDATION:
            return FOUNDATION
        return pattern_by_capability.get(parts[2])
    return None


__all__ = [
    "CoverageGap",
    "CreatedResource",
    "coverage_gaps",
    "module_owner",
    "resources_in",
]
