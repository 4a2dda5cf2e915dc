"""State diff between two decision sets and the Change Summary (§21.7, §22.2).

A small structural diff stands in for DeepDiff here so the domain stays pure and its
output is plain, stable data: dotted paths (``plan.choices[3].pattern_id``) for what
was added, removed or changed. Lists are compared by position, except lists of objects
that all carry a ``capability`` or ``id`` key, which are matched by that key so that one
inserted choice does not show every later one as changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from keel.design.hcl import (
    aws_alias,
    blocks,
    canonical_body,
    join_path,
    parent_dir,
    parse_tf,
    substitute,
)

DOC_SUFFIXES = (".md", ".rst", ".txt")
_MATCH_KEYS = ("capability", "id")


class Change(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    old: Any = None
    new: Any = None


class StateDiff(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    added: list[str] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    changed: list[Change] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def top_keys(self) -> list[str]:
        """The state keys touched (``plan``, ``cost``...), sorted."""
        paths = [*self.added, *self.removed, *(c.path for c in self.changed)]
        return sorted({p.split(".", 1)[0].split("[", 1)[0] for p in paths})


def _key_of(items: list[Any]) -> str | None:
    for key in _MATCH_KEYS:
        if items and all(isinstance(x, Mapping) and key in x for x in items):
            values = [x[key] for x in items]
            if len(set(map(str, values))) == len(values):
                return key
    return None


def _join(prefix: str, part: str) -> str:
    return f"{prefix}.{part}" if prefix else part


def _walk(old: Any, new: Any, path: str, out: StateDiff) -> None:
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        for k in sorted(set(old) | set(new), key=str):
            sub = _join(path, str(k))
            if k not in new:
                out.removed.append(sub)
            elif k not in old:
                out.added.append(sub)
            else:
                _walk(old[k], new[k], sub, out)
        return
    if isinstance(old, list) and isinstance(new, list):
        key = _key_of(old) if old else None
        if key is not None and key == _key_of(new):
            old_by = {str(x[key]): x for x in old}
            new_by = {str(x[key]): x for x in new}
            for k in sorted(set(old_by) | set(new_by)):
                sub = f"{path}[{key}={k}]"
                if k not in new_by:
                    out.removed.append(sub)
                elif k not in old_by:
                    out.added.append(sub)
                else:
                    _walk(old_by[k], new_by[k], sub, out)
            return
        for idx in range(max(len(old), len(new))):
            sub = f"{path}[{idx}]"
            if idx >= len(new):
                out.removed.append(sub)
            elif idx >= len(old):
                out.added.append(sub)
            else:
                _walk(old[idx], new[idx], sub, out)
        return
    if old != new or type(old) is not type(new):
        out.changed.append(Change(path=path, old=old, new=new))


def state_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> StateDiff:
    """Paths added, removed and changed from ``old`` to ``new`` (JSON-like data), sorted.

    Pass ``model_dump(mode="json")`` of the state models, not the models themselves.
    """
    out = StateDiff()
    _walk(old, new, "", out)
    return StateDiff(
        added=sorted(out.added),
        removed=sorted(out.removed),
        changed=sorted(out.changed, key=lambda c: c.path),
    )


class DiffSummary(BaseModel):
    """The §22.2 Diff Summary (the Change Summary's machine form)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    docs_changed: list[str]
    files_added: int
    files_removed: int
    files_modified: int
    cost_delta_usd: float | None
    state_keys_changed: list[str]
    git_commit: str | None = None


def change_summary(
    old_state: Mapping[str, Any],
    new_state: Mapping[str, Any],
    old_files: Mapping[str, str],
    new_files: Mapping[str, str],
    cost_delta_usd: float | None = None,
    git_commit: str | None = None,
) -> DiffSummary:
    """Summarise two decision sets: their state and their files (``path -> digest``).

    A file is modified when its digest differs; ``docs_changed`` lists documentation
    files added, removed or modified.
    """
    added = sorted(set(new_files) - set(old_files))
    removed = sorted(set(old_files) - set(new_files))
    modified = sorted(p for p in set(old_files) & set(new_files) if old_files[p] != new_files[p])
    docs = sorted(p for p in (*added, *removed, *modified) if p.endswith(DOC_SUFFIXES))
    return DiffSummary(
        docs_changed=docs,
        files_added=len(added),
        files_removed=len(removed),
        files_modified=len(modified),
        cost_delta_usd=cost_delta_usd,
        state_keys_changed=state_diff(old_state, new_state).top_keys(),
        git_commit=git_commit,
    )


def change_summary_md(summary: DiffSummary, diff: StateDiff, limit: int = 50) -> str:
    """The Change Summary as markdown: counts, cost delta and the first ``limit`` paths."""
    lines = ["## Change Summary", ""]
    lines.append(
        f"Files: +{summary.files_added} -{summary.files_removed} ~{summary.files_modified}"
    )
    if summary.cost_delta_usd is not None:
        sign = "+" if summary.cost_delta_usd >= 0 else "-"
        lines.append(f"Cost: {sign}${abs(summary.cost_delta_usd):,.2f}/month")
    if summary.docs_changed:
        lines.append("Docs changed: " + ", ".join(summary.docs_changed))
    lines.append("State keys changed: " + (", ".join(summary.state_keys_changed) or "none"))
    entries = [f"- added `{p}`" for p in diff.added]
    entries += [f"- removed `{p}`" for p in diff.removed]
    entries += [f"- changed `{c.path}`: {c.old!r} -> {c.new!r}" for c in diff.changed]
    if entries:
        lines += ["", *entries[:limit]]
        if len(entries) > limit:
            lines.append(f"- ... {len(entries) - limit} more")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ Terraform and cost


class ResourceChange(BaseModel):
    """One Terraform resource added, removed or changed between two generated trees.

    ``address`` is Terraform's (``module.ingest_us_east_1.aws_kinesis_stream.events``);
    ``module`` the module directory (``infra/modules/ingest``) and ``region`` the region
    of the instance's provider, where the tree names one.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str
    resource: str
    module: str
    region: str | None = None


class TerraformDiff(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    added: list[ResourceChange] = Field(default_factory=list)
    removed: list[ResourceChange] = Field(default_factory=list)
    changed: list[ResourceChange] = Field(default_factory=list)
    #: ``.tf`` files (of either tree) that python-hcl2 could not read, so not compared.
    unreadable: list[str] = Field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


class CostLineChange(BaseModel):
    """One bill-of-materials line whose quantity or price changed (or that came or went)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capability: str
    resource: str
    region: str | None = None
    unit: str = ""
    old_pattern: str | None = None
    new_pattern: str | None = None
    old_quantity: float | None = None
    new_quantity: float | None = None
    old_usd: float | None = None
    new_usd: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def delta_usd(self) -> float:
        return round((self.new_usd or 0.0) - (self.old_usd or 0.0), 2)


def _read_tree(
    files: Mapping[str, str],
) -> tuple[dict[str, tuple[ResourceChange, str]], list[str]]:
    """:func:`terraform_resources`, and the ``.tf`` files that are not HCL (left out)."""
    by_dir: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    regions: dict[str, str] = {}
    instances: list[tuple[str, str, dict[str, Any]]] = []
    unreadable: list[str] = []
    for path in sorted(p for p in files if p.endswith(".tf")):
        try:
            parsed = parse_tf(files[path])
        except ValueError:
            unreadable.append(path)
            continue
        by_dir.setdefault(parent_dir(path), []).extend(blocks(parsed, "resource"))
        for _, _, args in blocks(parsed, "provider"):
            alias, region = args.get("alias"), args.get("region")
            if isinstance(alias, str) and isinstance(region, str) and alias and region:
                regions[alias] = region
        for name, _, args in blocks(parsed, "module"):
            source = args.get("source")
            if isinstance(source, str) and source.startswith("."):
                instances.append((name, join_path(parent_dir(path), source), args))
    out: dict[str, tuple[ResourceChange, str]] = {}
    used = {source for _, source, _ in instances}
    for name, source, args in instances:
        alias = aws_alias(args.get("providers"))
        where = regions.get(alias) if alias else None
        for rtype, rname, body in by_dir.get(source, []):
            address = f"module.{name}.{rtype}.{rname}"
            out[address] = (
                ResourceChange(
                    address=address, resource=f"{rtype}.{rname}", module=source, region=where
                ),
                canonical_body(substitute(body, args)),
            )
    for directory, resources in by_dir.items():
        if directory in used:
            continue
        for rtype, rname, body in resources:
            address = f"{directory}:{rtype}.{rname}" if directory else f"{rtype}.{rname}"
            out[address] = (
                ResourceChange(address=address, resource=f"{rtype}.{rname}", module=directory),
                canonical_body(body),
            )
    return out, unreadable


def terraform_resources(files: Mapping[str, str]) -> dict[str, tuple[ResourceChange, str]]:
    """Every resource a generated tree declares, by address, with its body as compared
    (the parsed arguments and blocks as canonical JSON, so comments and layout do not
    count; inside a module instance, each ``var.x`` replaced by the argument the instance
    passes, so a changed size or wiring shows as a changed resource).

    The ``.tf`` files are read with python-hcl2, so any layout Terraform accepts reads
    the same (``terraform fmt``'s, one-line blocks, odd spacing); a file that is not HCL
    is left out (:func:`terraform_diff` names it). A directory that some ``module`` block
    uses as its ``source`` contributes its resources once per instance
    (``module.<instance>.<type>.<name>``, in the instance's provider region); any other
    directory's resources are addressed ``<dir>:<type>.<name>``.
    """
    return _read_tree(files)[0]


def terraform_diff(old_files: Mapping[str, str], new_files: Mapping[str, str]) -> TerraformDiff:
    """The resources added, removed and changed from ``old_files`` to ``new_files``, and
    the ``.tf`` files of either side that are not HCL (their resources not compared)."""
    (old, old_bad), (new, new_bad) = _read_tree(old_files), _read_tree(new_files)
    return TerraformDiff(
        added=[new[a][0] for a in sorted(set(new) - set(old))],
        removed=[old[a][0] for a in sorted(set(old) - set(new))],
        changed=[new[a][0] for a in sorted(set(old) & set(new)) if old[a][1] != new[a][1]],
        unreadable=sorted(set(old_bad) | set(new_bad)),
    )


def _cost_key(line: Mapping[str, Any]) -> tuple[str, str, str]:
    pattern = str(line.get("pattern_id", ""))
    capability = str(line.get("capability") or pattern.split(":", 1)[0])
    return capability, str(line.get("service", "")), str(line.get("region") or "")


def cost_line_diff(
    old_lines: list[Mapping[str, Any]], new_lines: list[Mapping[str, Any]]
) -> list[CostLineChange]:
    """Priced lines (``CostEstimate.breakdown`` as JSON) matched by capability, resource
    and region: those whose quantity or cost changed, and those only on one side.
    Lines of one key (a pattern may list a resource twice) are summed."""

    def index(lines: list[Mapping[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
        out: dict[tuple[str, str, str], dict[str, Any]] = {}
        for line in lines:
            key = _cost_key(line)
            seen = out.setdefault(
                key,
                {"pattern": line.get("pattern_id"), "unit": line.get("unit", ""), "q": 0.0,
                 "usd": 0.0, "has_q": False},
            )  # fmt: skip
            if line.get("quantity") is not None:
                seen["q"] += float(line["quantity"])
                seen["has_q"] = True
            seen["usd"] += float(line.get("usd", 0.0))
        return out

    old, new = index(old_lines), index(new_lines)
    changes: list[CostLineChange] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        same = (
            a is not None
            and b is not None
            and a["pattern"] == b["pattern"]
            and round(a["q"], 9) == round(b["q"], 9)
            and round(a["usd"], 2) == round(b["usd"], 2)
        )
        if same:
            continue
        capability, resource, region = key
        changes.append(
            CostLineChange(
                capability=capability,
                resource=resource,
                region=region or None,
                unit=str((b or a or {}).get("unit", "")),
                old_pattern=a["pattern"] if a else None,
                new_pattern=b["pattern"] if b else None,
                old_quantity=a["q"] if a and a["has_q"] else None,
                new_quantity=b["q"] if b and b["has_q"] else None,
                old_usd=round(a["usd"], 2) if a else None,
                new_usd=round(b["usd"], 2) if b else None,
            )
        )
    return changes


def cost_delta(
    old_usd: float | Decimal | None, new_usd: float | Decimal | None
) -> tuple[float | None, float | None]:
    """The one rule for a change of monthly cost, for the cost critic (against the previous
    decision set) and ``design diff`` (against any): ``new - old`` in USD, exact on the
    totals' decimals, and its percent of ``old`` to 0.1; the percent is ``None`` when
    ``old`` is zero (no meaningful ratio), both are ``None`` when a side has no cost."""
    if old_usd is None or new_usd is None:
        return None, None
    old, new = Decimal(str(old_usd)), Decimal(str(new_usd))
    delta = new - old
    pct = float((delta / old * 100).quantize(Decimal("0.1"))) if old != 0 else None
    return float(delta), pct


def diffable(
    constraints: Mapping[str, Any] | None, plan: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A decision set as ``design diff`` compares its state: its constraints and the
    pattern chosen per capability (the candidates' scoring would drown the choices)."""
    return {
        "constraints": dict(constraints or {}),
        "plan": {c["capability"]: c["pattern_id"] for c in (plan or {}).get("choices", [])},
    }


class DecisionSetDiff(BaseModel):
    """What ``design diff`` reports: one decision set against another of its project."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str
    decision_set: str
    previous: str
    files_added: list[str]
    files_removed: list[str]
    files_modified: list[str]
    docs_changed: list[str]
    state_keys_changed: list[str]
    changes: StateDiff
    #: ``None`` when there is no generated repository to compare.
    terraform: TerraformDiff | None
    cost_lines: list[CostLineChange]
    cost_delta_usd: float | None
    cost_delta_pct: float | None
    monthly_usd: float | None


def decision_set_diff(
    *,
    project: str,
    decision_set: str,
    previous: str,
    old_state: Mapping[str, Any],
    new_state: Mapping[str, Any],
    files: Mapping[str, str],
    old_tf: Mapping[str, str] | None,
    new_tf: Mapping[str, str] | None,
    old_cost: Mapping[str, Any] | None,
    new_cost: Mapping[str, Any] | None,
    recorded: Mapping[str, Any] | None = None,
) -> DecisionSetDiff:
    """The Change Summary of ``decision_set`` against ``previous``: files (``path ->
    added | removed | modified``, from the project's history), state (:func:`diffable`
    of each), the Terraform resources (``None`` without both trees), the cost lines and
    the cost delta (:func:`cost_delta` of the totals; costs are ``CostEstimate`` JSON).

    ``recorded`` is the Diff Summary the run stored when ``previous`` is its own parent:
    its ``docs_changed`` and ``state_keys_changed`` are kept as the run computed them."""
    recorded = recorded or {}
    added, removed, modified = (
        sorted(p for p, s in files.items() if s == kind)
        for kind in ("added", "removed", "modified")
    )
    changes = state_diff(old_state, new_state)
    terraform = (
        terraform_diff(old_tf, new_tf) if old_tf is not None and new_tf is not None else None
    )
    old_total = old_cost.get("monthly_usd") if old_cost else None
    new_total = new_cost.get("monthly_usd") if new_cost else None
    delta_usd, delta_pct = cost_delta(old_total, new_total)
    docs = sorted(p for p in (*added, *removed, *modified) if p.endswith(DOC_SUFFIXES))
    return DecisionSetDiff(
        project=project,
        decision_set=decision_set,
        previous=previous,
        files_added=added,
        files_removed=removed,
        files_modified=modified,
        docs_changed=recorded.get("docs_changed") or docs,
        state_keys_changed=(
            changes.top_keys()
            if recorded.get("state_keys_changed") is None
            else list(recorded["state_keys_changed"])
        ),
        changes=changes,
        terraform=terraform,
        cost_lines=cost_line_diff(
            list((old_cost or {}).get("breakdown", [])), list((new_cost or {}).get("breakdown", []))
        ),
        cost_delta_usd=delta_usd,
        cost_delta_pct=delta_pct,
        monthly_usd=new_total,
    )
