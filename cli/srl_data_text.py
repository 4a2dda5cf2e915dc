"""How ``srl data ingest|process``, ``srl tasks`` and ``srl synth`` read as text, for
people (JSON mode prints the documents)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.srl.fitting import ModelFit


def _unconfirmed(names: list[str], indent: str) -> list[str]:
    if not names:
        return []
    return [
        f"{indent}warning: published layout NOT confirmed for {', '.join(names)} (docs/srl-data.md)"
    ]


def ingest_text(dataset: str, result: Any) -> str:
    lines = [
        f"{dataset}: {result.num_records} records -> {result.normalized}",
        f"  manifest: {result.manifest_source}; files: "
        + ", ".join(f"{f.name} ({f.size} bytes)" for f in result.files),
        f"  licence {result.meta.license}, version {result.meta.version}, "
        f"sha256 {result.meta.sha256}",
    ]
    lines.extend(f"  warning: {w}" for w in result.warnings)
    lines.append(f"  malformed records: {len(result.malformed)}")
    lines.extend(f"    {e.render()}" for e in result.malformed[:50])
    return "\n".join(lines)


def process_text(result: Any, max_tokens: int, counter: str) -> str:
    lines = [
        f"records {result.total}, parse-failed {result.parse_failed}, duplicates "
        f"dropped {result.duplicates_dropped}, over {max_tokens} tokens dropped "
        f"{result.too_long_dropped}, other languages {result.other_language}",
        f"  tokens counted by {counter}",
    ]
    for group, counts in result.splits.items():
        lines.append(
            f"  {group:<10} train {counts['train']:>6}  dev {counts['dev']:>5}  "
            f"test {counts['test']:>5}"
        )
    lines += _unconfirmed(result.unconfirmed, "")
    lines.append(f"report: {result.report}")
    return "\n".join(lines)


def tasks_text(result: Any, out: Path, fits: list[ModelFit], summary_path: Path) -> str:
    lines = [
        f"{result.tasks} tasks (of {result.read} records read) -> {out}",
        "  by language: "
        + (", ".join(f"{k} {v}" for k, v in result.by_language.items()) or "none"),
        "  by dataset: " + (", ".join(f"{k} {v}" for k, v in result.by_dataset.items()) or "none"),
        "  refused: " + ", ".join(f"{k} {v}" for k, v in result.refused.items()),
        "  no gold actions: collect with --source teacher or actor, not gold_replay",
    ]
    lines += _unconfirmed(result.unconfirmed, "  ")
    lines.extend(f"  {f.line()}" for f in fits)
    lines.append(f"summary: {summary_path}")
    return "\n".join(lines)


def synth_text(outcome: Any, out: Path, fits: list[ModelFit], summary_path: Path) -> str:
    lines = [
        f"{len(outcome.tasks)} verified tasks -> {out}",
        "  by language: " + ", ".join(f"{k} {v}" for k, v in outcome.verified_by_language.items()),
        f"  candidates checked {outcome.candidates}, sources {outcome.sources}, "
        f"jail runs {outcome.jail_runs}, {outcome.seconds:.1f} s "
        f"({outcome.seconds_per_jail_run * 1000:.0f} ms per jail run)",
    ]
    for template, reasons in sorted(outcome.refused.items()):
        lines.append(
            f"  refused {template}: " + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))
        )
    lines.extend(f"  {f.line()}" for f in fits)
    lines.extend(f"  note: {n}" for n in outcome.notes)
    lines.append(f"summary: {summary_path}")
    return "\n".join(lines)
