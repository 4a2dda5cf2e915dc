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

from cli import srl_data_text, toolkit
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


DatasetsOpt = Annotated[
    list[str] | None,
    typer.Option("--dataset", "-d", help="Only these datasets (repeat; default: all ingested)"),
]
TokenModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Count tokens with this configured model's tokenizer (default: the "
        "models config's default model)",
    ),
]
TasksOutOpt = Annotated[
    Path,
    typer.Option(
        "--out",
        "-o",
        help="The task file: JSONL of SrlTask lines (a .summary.json beside it)",
        dir_okay=False,
    ),
]
DataRootOpt = Annotated[
    Path | None,
    typer.Option(
        "--data",
        help="Data root holding processed/ (default: <data dir>/srl)",
        file_okay=False,
        show_default=False,
    ),
]
TaskLanguagesOpt = Annotated[
    list[str] | None,
    typer.Option("--language", "-l", help="python, javascript (with TypeScript), java (repeat)"),
]
SplitsOpt = Annotated[
    list[str] | None, typer.Option("--split", "-s", help="train, dev, test (repeat)")
]
KeepParseFailedOpt = Annotated[
    bool,
    typer.Option("--keep-parse-failed", help="Keep records 'srl data process' tagged parse-failed"),
]
SynthOutOpt = Annotated[
    Path,
    typer.Option(
        "--out", "-o", help="JSONL of verified tasks (a .summary.json beside it)", dir_okay=False
    ),
]
SynthLanguagesOpt = Annotated[
    list[str] | None,
    typer.Option("--language", "-l", help="python, javascript, typescript, java (repeat)"),
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
        SRL_DATA.emit(result.model_dump(mode="json"), srl_data_text.ingest_text(dataset, result))


def _tokenizer(model: str | None) -> Any:
    """The tokenizer of ``model`` (default: the models config's default model; the
    heuristic when none is configured); an unknown ``model`` is a usage error."""
    from activities.srl.tokens import tokenizer_for
    from client.srl import token_model_spec
    from keel.llm import ModelsConfigError, UnknownModelError
    from keel.settings import get_settings

    try:
        spec = token_model_spec(get_settings().models_config, model)
    except (ModelsConfigError, UnknownModelError) as e:
        raise SRL_DATA.failure("usage", str(e)) from None
    return tokenizer_for(spec)


@data_app.command("process")
def process(
    out: OutOpt = None,
    datasets: DatasetsOpt = None,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1)] = 2048,
    model: TokenModelOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Parse-check (ast-grep in the jail), dedupe, filter by tokens, split, report."""
    from activities.srl.splits import HEURISTIC_COUNTER, process_datasets

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        root = _out(out)
        tokenizer = _tokenizer(model)
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
        text = srl_data_text.process_text(result, max_tokens, counter)
        SRL_DATA.emit(result.model_dump(mode="json"), text)


@data_app.command("stats")
def stats(
    dataset: Annotated[
        str | None, typer.Argument(help="One dataset (default: every report)")
    ] = None,
    out: OutOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Print the Markdown stats reports written by 'srl data process'."""
    from activities.srl.splits import stats_for

    SRL_DATA.mode(json_out)
    with SRL_DATA.reported():
        reports = stats_for(_out(out), dataset)
        SRL_DATA.emit({"reports": reports}, "\n".join(reports.values()))


def tasks(
    out: TasksOutOpt = Path("srl-tasks.jsonl"),
    data: DataRootOpt = None,
    groups: TaskLanguagesOpt = None,
    splits: SplitsOpt = None,
    limit: Annotated[
        int | None, typer.Option("--limit", "-n", min=1, help="At most N tasks")
    ] = None,
    keep_parse_failed: KeepParseFailedOpt = False,
    minimum: Annotated[
        int | None, typer.Option("--min", help="Fail (exit 7) below this many tasks")
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """Turn processed records into a task file for 'srl collect': one SrlTask a record,
    with no gold action (collect with a teacher or actors, not gold_replay)."""
    from activities.srl.splits import write_tasks
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
        summary_path = _write_summary(out, summary)
        fits = _fits(parse_tasks(out.read_bytes()))
        _write_summary(out, summary, fits)
        text = srl_data_text.tasks_text(result, out, fits, summary_path)
        if minimum is not None and result.tasks < minimum:  # one document: the error
            raise SRL_DATA.failure(
                "too_few_tasks", f"only {result.tasks} tasks, --min {minimum}", details=summary
            )
        SRL_DATA.emit(summary, text)


def _fits(tasks: Sequence[TaskLike]) -> list[ModelFit]:
    """How many of ``tasks`` fit each configured model's context (docs/srl-collect.md,
    "Prompts that fit"): their first step's prompt, counted by the model's tokenizer."""
    from activities.srl.fitting import configured_fits

    return configured_fits(tasks)


def _write_summary(out: Path, doc: dict[str, Any], fits: list[ModelFit] | None = None) -> Path:
    """``doc`` (with ``fits``, when given, as its ``fits``) as the task file's summary,
    ``<out>.summary.json``; returns that path."""
    if fits is not None:
        doc["fits"] = [f.model_dump(mode="json") for f in fits]
    path = out.with_name(out.name + ".summary.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def synth(
    out: SynthOutOpt = Path("srl-synth.jsonl"),
    languages: SynthLanguagesOpt = None,
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
        summary_path = _write_summary(out, summary, fits)
        SRL_DATA.emit(summary, srl_data_text.synth_text(outcome, out, fits, summary_path))
        if minimum is not None and len(outcome.tasks) < minimum:
            raise SRL_DATA.failure(
                "too_few_tasks", f"only {len(outcome.tasks)} verified tasks, --min {minimum}"
            )
