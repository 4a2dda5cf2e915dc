"""State diff between two decision sets and the Change Summary (§21.7, §22.2).

A small structural diff stands in for DeepDiff here so the domain stays pure and its
output is plain, stable data: dotted paths (``plan.choices[3].pattern_id``) for what
was added, removed or changed. Lists are compared by position, except lists of objects
that all carry a ``capability`` or ``id`` key, which are matched by that key so that one
inserted choice does not show every later one as changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

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
