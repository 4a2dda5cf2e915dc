"""``srl data ingest|process|stats``, ``srl tasks`` and ``srl synth`` (docs/srl-data.md).

``srl data ingest <dataset> --from PATH`` checks the published files under PATH against
the manifest (``configs/srl/datasets.yaml``, or ``--manifest FILE`` where the published
hashes are unknown) and writes ``raw/<dataset>/`` under ``--out``; ``srl data process``
parse-checks in the jail, dedupes, filters by tokens and splits; ``srl data stats``
prints the Markdown reports. ``srl tasks`` turns processed records into a task file
for ``srl collect`` (no gold actions). ``srl synth`` writes verified synthetic tasks as
JSONL.

Output: text on a terminal, one JSON document on stdout otherwise (``--json``/``--text``
force either); errors as in every Keel CLI (``cli/toolkit.py``), family ``srl``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit
from cli.toolkit import note

if TYPE_CHECKING:
    from collections.abc import Sequence

    from activities.srl.fitting import ModelFit, TaskLike
    from cli.envelope import CliError

data_app = typer.Typer(
    help="SRL datasets: ingest published files, process them into splits, show stats.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_CODES = toolkit.EXIT_CODES["srl"]

JsonOpt = toolkit.JsonOpt
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Data root (default: <data dir>/srl)",
        file_okay=False,
        show_default=False,
    ),
]


def translate(err: BaseException) -> CliError | None:
    """The SRL data errors as the CLI reports them (None: not one of them)."""
    from activities.srl.data import (
        DataError,
        DatasetFileMissing,
        DownloadImpossible,
        ManifestRequired,
    )
    from keel.srl.errors import ManifestMismatch
    from sandbox import SandboxUnavailable

    if isinstance(err, ManifestMismatch):
        lines = [f"{err}", "nothing was written"]
        return SRL_DATA.failure("manifest_mismatch", lines, details={"file": err.name}).error
    if isinstance(err, DownloadImpossible):
        return SRL_DATA.failure("download_impossible", str(err)).error
    if isinstance(err, ManifestRequired):
        return SRL_DATA.failure("manifest_required", str(err)).error
    if isinstance(err, DatasetFileMissing):
        return SRL_DATA.failure("not_found", str(err)).error
    if isinstance(err, DataError):
        return SRL_DATA.failure("usage", str(err)).error
    if isinstance(err, SandboxUnavailable):
        return SRL_DATA.failure("error", f"the sandbox is unavailable: {err}").error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
SRL_DATA = toolkit.Family("srl", translate, bad_settings="error")


def _out(out: Path | None) -> Path:
    if out is not None:
        return out
    return toolkit.load_settings().data_dir / "srl"


@data_app.command("ingest")
def ingest(
    dataset: Annotated[
        str,
        typer.Argument(help="commitpackft, ocedataft, editpackft, agentpack, marv or smellycode"),
    ],
    from_: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="Folder holding the published files (their published relative names)",
            exists=True,
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    manifest: Annotated[
        Path | None,
        typer.Option(
            "--manifest",
            help="Your manifest {dataset, version, files: [{name, sha256, size}]} (YAML/JSON)",
            exists=True,
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    out: OutOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Check the files against the manifest, normalise them, write _meta.json."""
    from activities.srl.data import ingest_dataset

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        root = _out(out)
        result = ingest_dataset(dataset, from_, root, manifest_path=manifest)
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
        SRL_DATA.emit(result.model_dump(mode="json"), "\n".join(lines))


@data_app.command("process")
def process(
    out: OutOpt = None,
    datasets: Annotated[
        list[str] | None,
        typer.Option("--dataset", "-d", help="Only these datasets (repeat; default: all ingested)"),
    ] = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 2048,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Count tokens with this configured model's tokenizer (default: the "
            "models config's default model)",
        ),
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """Parse-check (ast-grep in the jail), dedupe, filter by tokens, split, report."""
    from activities.srl.data import HEURISTIC_COUNTER, process_datasets
    from activities.srl.tokens import tokenizer_for
    from keel.llm import ModelsConfigError, UnknownModelError
    from keel.settings import get_settings
    from store.files import load_models_config

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        root = _out(out)
        try:
            _, spec = load_models_config(get_settings().models_config).resolve(model or "")
        except (ModelsConfigError, UnknownModelError) as e:
            if model:
                raise SRL_DATA.failure("usage", str(e)) from None
            spec = None
        tokenizer = tokenizer_for(spec)
        counter = tokenizer.name if tokenizer.exact else HEURISTIC_COUNTER
        note(f"processing {root / 'raw'} (parse check in the jail; tokens: {counter})")
        result = asyncio.run(
            process_datasets(
                root,
                datasets,
                max_tokens=max_tokens,
                count_tokens=tokenizer.count_text,
                token_counter=counter,
            )
        )
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
        if result.unconfirmed:
            lines.append(
                "warning: published layout NOT confirmed for "
                f"{', '.join(result.unconfirmed)} (docs/srl-data.md)"
            )
        lines.append(f"report: {result.report}")
        SRL_DATA.emit(result.model_dump(mode="json"), "\n".join(lines))


@data_app.command("stats")
def stats(
    dataset: Annotated[
        str | None, typer.Argument(help="One dataset (default: every report)")
    ] = None,
    out: OutOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Print the Markdown stats reports written by 'srl data process'."""
    from activities.srl.data import stats_for

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        reports = stats_for(_out(out), dataset)
        SRL_DATA.emit({"reports": reports}, "\n".join(reports.values()))


def tasks(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="The task file: JSONL of SrlTask lines (a .summary.json beside it)",
            dir_okay=False,
        ),
    ] = Path("srl-tasks.jsonl"),
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Data root holding processed/ (default: <data dir>/srl)",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    groups: Annotated[
        list[str] | None,
        typer.Option(
            "--language", "-l", help="python, javascript (with TypeScript), java (repeat)"
        ),
    ] = None,
    splits: Annotated[
        list[str] | None, typer.Option("--split", "-s", help="train, dev, test (repeat)")
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=1, help="At most N tasks")
    ] = None,
    keep_parse_failed: Annotated[
        bool,
        typer.Option(
            "--keep-parse-failed", help="Keep records 'srl data process' tagged parse-failed"
        ),
    ] = False,
    minimum: Annotated[
        int | None, typer.Option("--min", help="Fail (exit 7) below this many tasks")
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """Turn processed records into a task file for 'srl collect': one SrlTask a record,
    with no gold action (collect with a teacher or actors, not gold_replay)."""
    from activities.srl.data import write_tasks
    from keel.srl.steps import parse_tasks

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        root = _out(data)
        result = write_tasks(
            root,
            out,
            groups=groups,
            splits=splits or ["train"],
            limit=limit,
            keep_parse_failed=keep_parse_failed,
        )
        summary = result.model_dump(mode="json")
        summary_path = out.with_name(out.name + ".summary.json")
        _write_summary(summary_path, summary)
        lines = [
            f"{result.tasks} tasks (of {result.read} records read) -> {out}",
            "  by language: "
            + (", ".join(f"{k} {v}" for k, v in result.by_language.items()) or "none"),
            "  by dataset: "
            + (", ".join(f"{k} {v}" for k, v in result.by_dataset.items()) or "none"),
            "  refused: " + ", ".join(f"{k} {v}" for k, v in result.refused.items()),
            "  no gold actions: collect with --source teacher or actor, not gold_replay",
        ]
        if result.unconfirmed:
            lines.append(
                "  warning: published layout NOT confirmed for "
                f"{', '.join(result.unconfirmed)} (docs/srl-data.md)"
            )
        fits = _fits(parse_tasks(out.read_bytes()))
        summary["fits"] = [f.model_dump(mode="json") for f in fits]
        _write_summary(summary_path, summary)
        lines.extend(f"  {f.line()}" for f in fits)
        lines.append(f"summary: {summary_path}")
        if minimum is not None and result.tasks < minimum:  # one document: the error
            raise SRL_DATA.failure(
                "too_few_tasks", f"only {result.tasks} tasks, --min {minimum}", details=summary
            )
        SRL_DATA.emit(summary, "\n".join(lines))


def _fits(tasks: Sequence[TaskLike]) -> list[ModelFit]:
    """How many of ``tasks`` fit each configured model's context (docs/srl-collect.md,
    "Prompts that fit"): their first step's prompt, counted by the model's tokenizer."""
    from activities.srl.fitting import configured_fits

    return configured_fits(tasks)


def _write_summary(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def synth(
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            "-o",
            help="JSONL of verified tasks (a .summary.json beside it)",
            dir_okay=False,
        ),
    ] = Path("srl-synth.jsonl"),
    languages: Annotated[
        list[str] | None,
        typer.Option("--language", "-l", help="python, javascript, typescript, java (repeat)"),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, help="Verified tasks wanted")] = 300,
    seeds: Annotated[int, typer.Option("--seeds", min=1, help="Seeds 0..N-1 per template")] = 2,
    minimum: Annotated[
        int | None, typer.Option("--min", help="Fail (exit 7) below this many verified tasks")
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """Synthesise ast-grep tasks over licensed package sources; keep those whose gold
    action reproduces the post-text in the jail and re-parses."""
    from activities.srl.synth import verified_synth_tasks

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        langs = languages or ["python", "javascript", "typescript"]
        note(f"synthesising up to {limit} tasks for {', '.join(langs)}; verifying in the jail")
        try:
            outcome = asyncio.run(
                verified_synth_tasks(languages=langs, limit=limit, seeds=list(range(seeds)))
            )
        except ValueError as e:
            raise SRL_DATA.failure("usage", str(e)) from None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(t.model_dump_json() + "\n" for t in outcome.tasks), encoding="utf-8")
        summary = outcome.model_dump(mode="json", exclude={"tasks"})
        summary["out"] = str(out)
        fits = _fits(outcome.tasks)
        summary["fits"] = [f.model_dump(mode="json") for f in fits]
        summary_path = out.with_name(out.name + ".summary.json")
        _write_summary(summary_path, summary)
        lines = [
            f"{len(outcome.tasks)} verified tasks -> {out}",
            "  by language: "
            + ", ".join(f"{k} {v}" for k, v in outcome.verified_by_language.items()),
            f"  candidates checked {outcome.candidates}, sources {outcome.sources}, "
            f"jail runs {outcome.jail_runs}, {outcome.seconds:.1f} s "
            f"({outcome.seconds_per_jail_run * 1000:.0f} ms per jail run)",
        ]
        for template, reasons in sorted(outcome.refused.items()):
            lines.append(
                f"  refused {template}: "
                + ", ".join(f"{r} {n}" for r, n in sorted(reasons.items()))
            )
        lines.extend(f"  {f.line()}" for f in fits)
        lines.extend(f"  note: {n}" for n in outcome.notes)
        lines.append(f"summary: {summary_path}")
        SRL_DATA.emit(summary, "\n".join(lines))
        if minimum is not None and len(outcome.tasks) < minimum:
            raise SRL_DATA.failure(
                "too_few_tasks", f"only {len(outcome.tasks)} verified tasks, --min {minimum}"
            )
