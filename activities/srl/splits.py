"""SRL datasets processed and made tasks: process (parse check in the jail, dedup, token
filter, split, stats reports) and tasks (processed records as a task file for ``srl
collect``). Ingest and the datasets' config are ``activities.srl.data``; see
docs/srl-data.md for the layout under ``out``::

    processed/{python,javascript,java}/{train,dev,test}.jsonl
    reports/datasets/<dataset>.md, reports/datasets/all.md
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from activities.srl.data import (
    DATASETS,
    PARSE_EXTENSIONS,
    DataError,
    DatasetsConfig,
    _jsonl,
    _write_atomic,
    load_config,
    parses_in_jail,
    read_meta,
    read_normalized,
)
from keel.srl.datasets import (
    DEFAULT_MAX_TOKENS,
    LANGUAGE_GROUPS,
    PARSE_FAILED_TAG,
    NormalizedRecord,
    dedupe,
    filter_tokens,
    flag_parse,
    split_by_language,
    stats_report,
)
from keel.srl.state import heuristic_count_tokens
from keel.srl.tasks import Refusal, tasks_from_records

log = logging.getLogger(__name__)

# ---- process -------------------------------------------------------------------------


class DatasetProcessStats(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str
    records: int
    parse_failed: int
    unchecked_language: int
    layout_confirmed: bool
    report: str


#: How ``srl data process`` names the heuristic count (``keel.srl.state.heuristic_count_tokens``).
HEURISTIC_COUNTER = "heuristic: 1 token per 3 UTF-8 bytes (no tokenizer available)"


class ProcessResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    datasets: list[DatasetProcessStats]
    total: int
    parse_failed: int
    duplicates_dropped: int
    too_long_dropped: int
    other_language: int
    max_tokens: int
    splits: dict[str, dict[str, int]]
    report: str
    token_counter: str = Field(
        HEURISTIC_COUNTER,
        description="what counted the tokens: a model's tokenizer (gguf:<file>) or the "
        "heuristic where none is available",
    )
    unconfirmed: list[str] = Field(
        default_factory=list, description="datasets read whose published layout is unconfirmed"
    )


def _layout_warnings(cfg: DatasetsConfig, names: Sequence[str]) -> dict[str, str | None]:
    """Each dataset's warning that its published layout is unconfirmed (logged), or None."""
    warnings = {name: cfg.spec(name).layout_warning(name) for name in names}
    for warning in warnings.values():
        if warning:
            log.warning(warning)
    return warnings


def _read_ingested(out: Path, names: Sequence[str]) -> dict[str, list[NormalizedRecord]]:
    """The normalised records of each dataset, after checking its ``_meta.json``."""
    per_dataset: dict[str, list[NormalizedRecord]] = {}
    for name in names:
        if not (out / "raw" / name / "_meta.json").is_file():
            raise DataError(f"{name}: not ingested under {out / 'raw'}")
        read_meta(out, name)  # a hand-edited, invalid _meta.json stops here
        per_dataset[name] = read_normalized(out, name)
    return per_dataset


async def _parse_all(per_dataset: Mapping[str, Sequence[NormalizedRecord]]) -> dict[str, bool]:
    """Parse check: every pre and post text (``<dataset>/<i>/pre|post``), one language at
    a time, batched per jail run."""
    by_lang: dict[str, dict[str, str]] = {}
    for name, records in per_dataset.items():
        for i, rec in enumerate(records):
            if rec.language in PARSE_EXTENSIONS:
                by_lang.setdefault(rec.language, {})
                by_lang[rec.language][f"{name}/{i}/pre"] = rec.pre
                by_lang[rec.language][f"{name}/{i}/post"] = rec.post
    parsed: dict[str, bool] = {}
    for language, texts in sorted(by_lang.items()):
        parsed.update(await parses_in_jail(texts, language))
    return parsed


def _flag_dataset(
    name: str,
    records: Sequence[NormalizedRecord],
    parsed: Mapping[str, bool],
    warning: str | None,
    count_tokens: Callable[[str], int],
    reports: Path,
) -> tuple[DatasetProcessStats, list[NormalizedRecord]]:
    """One dataset's records tagged with their parse check, and its report written."""
    flagged = []
    unchecked = 0
    for i, rec in enumerate(records):
        if rec.language in PARSE_EXTENSIONS:
            rec = flag_parse(rec, parsed[f"{name}/{i}/pre"], parsed[f"{name}/{i}/post"])
        else:
            unchecked += 1
        flagged.append(rec)
    failed = sum(PARSE_FAILED_TAG in r.tags for r in flagged)
    layout = (
        "NOT confirmed: the field mapping is inferred (docs/srl-data.md)"
        if warning
        else "confirmed (docs/srl-data.md)"
    )
    report = stats_report(name, flagged, count_tokens) + (
        f"\n- published layout: {layout}\n"
        f"- parse-failed (ast-grep in the jail, Python also ast.parse): {failed}\n"
        f"- language not parse-checked (not Python, JS/TS or Java): {unchecked}\n"
    )
    _write_atomic(reports / f"{name}.md", report.encode())
    stats = DatasetProcessStats(
        dataset=name,
        records=len(flagged),
        parse_failed=failed,
        unchecked_language=unchecked,
        layout_confirmed=warning is None,
        report=str(reports / f"{name}.md"),
    )
    return stats, flagged


def _write_splits(out: Path, records: Sequence[NormalizedRecord]) -> dict[str, dict[str, int]]:
    """``processed/<group>/<split>.jsonl`` for each language group; their sizes."""
    grouped = split_by_language(records)
    splits: dict[str, dict[str, int]] = {}
    for group in ("python", "javascript", "java"):
        parts = grouped.get(group, {"train": [], "dev": [], "test": []})
        splits[group] = {}
        for split in ("train", "dev", "test"):
            items = parts[split]  # type: ignore[index]
            _write_atomic(out / "processed" / group / f"{split}.jsonl", _jsonl(items))
            splits[group][split] = len(items)
    return splits


def _processing_section(
    names: Sequence[str],
    unconfirmed: Sequence[str],
    read: int,
    parse_failed: int,
    duplicates: int,
    too_long: int,
    max_tokens: int,
    token_counter: str,
    other: int,
    splits: Mapping[str, Mapping[str, int]],
) -> str:
    """The summary report's ``## Processing`` section and its table of splits."""
    return (
        "\n## Processing\n\n"
        f"- datasets: {', '.join(names)}\n"
        f"- published layout NOT confirmed: {', '.join(unconfirmed) or 'none'}\n"
        f"- records read: {read}\n"
        f"- parse-failed (kept, tagged `{PARSE_FAILED_TAG}`): {parse_failed}\n"
        f"- duplicate (instruction, pre) dropped: {duplicates}\n"
        f"- over {max_tokens} input tokens dropped: {too_long} (counted by {token_counter})\n"
        f"- other languages left out of the splits: {other}\n\n"
        "| language group | train | dev | test |\n| --- | ---: | ---: | ---: |\n"
        + "".join(f"| {g} | {c['train']} | {c['dev']} | {c['test']} |\n" for g, c in splits.items())
    )


async def process_datasets(
    out: Path,
    datasets: Sequence[str] | None = None,
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    count_tokens: Callable[[str], int] = heuristic_count_tokens,
    token_counter: str = HEURISTIC_COUNTER,
    config: DatasetsConfig | None = None,
) -> ProcessResult:
    """Parse-check, dedupe (across datasets, in the order given), token-filter and split
    the ingested datasets; write ``processed/`` and ``reports/datasets/`` under ``out``."""
    names = list(datasets) if datasets else [d for d in DATASETS if (out / "raw" / d).is_dir()]
    if not names:
        raise DataError(f"nothing ingested under {out / 'raw'}; run `srl data ingest` first")
    warnings = _layout_warnings(config or load_config(), names)
    per_dataset = _read_ingested(out, names)
    parsed = await _parse_all(per_dataset)

    stats: list[DatasetProcessStats] = []
    flagged_all: list[NormalizedRecord] = []
    reports = out / "reports" / "datasets"
    for name, records in per_dataset.items():
        one, flagged = _flag_dataset(name, records, parsed, warnings[name], count_tokens, reports)
        stats.append(one)
        flagged_all.extend(flagged)

    unique, duplicates = dedupe(flagged_all)
    short, too_long = filter_tokens(unique, count_tokens, max_tokens)
    splits = _write_splits(out, short)
    other = sum(1 for r in short if r.language not in LANGUAGE_GROUPS)
    kept = [r for r in short if r.language in LANGUAGE_GROUPS]
    unconfirmed = [name for name in names if warnings[name]]
    parse_failed = sum(s.parse_failed for s in stats)
    summary = stats_report("all datasets (processed)", kept, count_tokens) + _processing_section(
        names,
        unconfirmed,
        len(flagged_all),
        parse_failed,
        duplicates,
        too_long,
        max_tokens,
        token_counter,
        other,
        splits,
    )
    _write_atomic(reports / "all.md", summary.encode())
    return ProcessResult(
        datasets=stats,
        total=len(flagged_all),
        parse_failed=parse_failed,
        duplicates_dropped=duplicates,
        too_long_dropped=too_long,
        other_language=other,
        max_tokens=max_tokens,
        splits=splits,
        report=str(reports / "all.md"),
        unconfirmed=unconfirmed,
        token_counter=token_counter,
    )


# ---- tasks ---------------------------------------------------------------------------

GROUPS: tuple[str, ...] = ("python", "javascript", "java")
SPLITS: tuple[str, ...] = ("train", "dev", "test")


class TasksResult(BaseModel):
    """What ``srl tasks`` wrote: the task file, what it holds and what it left out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    out: str
    tasks: int
    read: int
    sources: list[str]
    by_language: dict[str, int]
    by_dataset: dict[str, int]
    refused: dict[Refusal, int]
    unconfirmed: list[str] = Field(
        description="datasets in the task file whose published layout is unconfirmed"
    )
    gold_actions: bool = Field(
        False, description="always False: a record has no expert action (no gold_replay)"
    )


def write_tasks(
    out: Path,
    dest: Path,
    *,
    groups: Sequence[str] | None = None,
    splits: Sequence[str] = ("train",),
    limit: int | None = None,
    keep_parse_failed: bool = False,
    config: DatasetsConfig | None = None,
) -> TasksResult:
    """Turn ``processed/<group>/<split>.jsonl`` under ``out`` into a task file at ``dest``
    (JSONL of :class:`SrlTask` lines, no gold action) that ``srl collect`` takes.

    Groups and splits are read in the order given, records in file order; a record that
    makes no task (``pre == post``, a language the sandbox does not edit, over
    ``MAX_FILE_CHARS``, tagged parse-failed, a repeat) is counted by reason in
    ``refused``. The file is written whole or not at all."""
    chosen_groups = list(groups or GROUPS)
    for name, chosen, known in (("group", chosen_groups, GROUPS), ("split", splits, SPLITS)):
        unknown = [c for c in chosen if c not in known]
        if unknown:
            raise DataError(f"unknown {name} {', '.join(unknown)}; known: {', '.join(known)}")
    paths = [out / "processed" / g / f"{s}.jsonl" for g in chosen_groups for s in splits]
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"{missing[0]}: not found; run `srl data process` first")

    def records() -> Iterator[NormalizedRecord]:
        for path in paths:
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    yield NormalizedRecord.model_validate_json(line)
                except ValueError as exc:
                    raise DataError(f"{path}:{n}: not a processed record: {exc}") from None

    made = tasks_from_records(records(), keep_parse_failed=keep_parse_failed, limit=limit)
    _write_atomic(dest, b"".join(t.model_dump_json().encode() + b"\n" for t in made.tasks))
    by_language: dict[str, int] = {}
    for task in made.tasks:
        by_language[task.language] = by_language.get(task.language, 0) + 1
    cfg = config or load_config()
    unconfirmed = sorted(
        d for d in made.by_dataset if d in cfg.datasets and cfg.datasets[d].layout_warning(d)
    )
    return TasksResult(
        out=str(dest),
        tasks=len(made.tasks),
        read=made.read,
        sources=[str(p) for p in paths],
        by_language=by_language,
        by_dataset=made.by_dataset,
        refused=made.refused,
        unconfirmed=unconfirmed,
    )


def stats_for(out: Path, dataset: str | None = None) -> dict[str, str]:
    """The written Markdown reports: one dataset's, or all of them by name."""
    reports = out / "reports" / "datasets"
    if dataset is not None:
        path = reports / f"{dataset}.md"
        if not path.is_file():
            raise DataError(f"no report {path}; run `srl data process` first")
        return {dataset: path.read_text(encoding="utf-8")}
    if not reports.is_dir():
        raise DataError(f"no reports under {reports}; run `srl data process` first")
    return {p.stem: p.read_text(encoding="utf-8") for p in sorted(reports.glob("*.md"))}


__all__ = [
    "GROUPS",
    "HEURISTIC_COUNTER",
    "SPLITS",
    "DatasetProcessStats",
    "ProcessResult",
    "TasksResult",
    "process_datasets",
    "stats_for",
    "write_tasks",
]
