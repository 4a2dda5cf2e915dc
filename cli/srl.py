"""``srl``: SRL datasets, synthetic tasks and trajectory collection (docs/srl-collect.md).

``srl data ingest|process|stats``, ``srl tasks`` and ``srl synth`` are in
``cli/srl_data.py`` (docs/srl-data.md).

``srl collect TASKS.jsonl`` runs an ``SRLCollection`` on the configured Temporal server
(or the embedded one, started on demand, with a worker) and shows a live progress line;
``srl show``, ``srl report`` (teacher precision, Markdown), ``srl export`` (JSONL and
Parquet, ``client/srl_export.py``) and ``srl state dump`` read the step rows in SQL. Output,
errors and exit codes follow the CLI toolkit (``cli/toolkit.py``): text on a terminal, one
JSON document otherwise, ``{"error": {...}}`` on failure.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import srl_text, toolkit
from cli.srl_data import data_app, synth
from cli.srl_data import tasks as tasks_command
from cli.srl_data import translate as data_translate
from cli.toolkit import note, output
from client.srl_export import write_export

if TYPE_CHECKING:
    from temporalio.client import Client

    from cli.envelope import CliError
    from keel.settings import Settings
    from keel.srl.steps import CollectionInput, CollectionResult
    from keel.srl.trajectory import StepRow

app = typer.Typer(
    help="SRL (Supervised Reinforcement Learning) data engine for an ast-grep refactoring "
    "agent: datasets, synthetic tasks, collections, reports (docs/srl-collect.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
state_app = typer.Typer(help="The structured state of a task's episode.", no_args_is_help=True)
app.add_typer(data_app, name="data")
app.command("synth")(synth)
app.command("tasks")(tasks_command)
app.add_typer(state_app, name="state")

EXIT_CODES = toolkit.EXIT_CODES["srl"]

JsonOpt = toolkit.JsonOpt
CollectionOpt = Annotated[
    str, typer.Option("--collection", "-c", help="The collection id", show_default=False)
]


def _translate(err: BaseException) -> CliError | None:
    from client.srl import CollectionMismatch, ExpertSetError
    from keel.srl.steps import TasksInvalid

    known = data_translate(err)
    if known is not None:
        return known
    if isinstance(err, CollectionMismatch):
        return SRL.failure("invalid_input", str(err)).error
    if isinstance(err, ExpertSetError):
        return SRL.failure("not_found", str(err)).error
    if isinstance(err, TasksInvalid):
        return SRL.failure("invalid_input", str(err)).error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
SRL = toolkit.Family("srl", _translate, bad_settings="error")


# -- collect -------------------------------------------------------------------------------


def _progress(client: Client, workflow_id: str) -> tuple[Any, Any] | None:
    """``srl collect``'s progress line on stderr (a terminal only)."""
    from client.srl import collection_progress

    if not sys.stderr.isatty():
        return None
    started = time.monotonic()
    status = toolkit.StatusLine()

    async def tick() -> None:
        p = await collection_progress(client, workflow_id)
        status.show(srl_text.progress_line(p, started))

    return tick, toolkit.StatusLine.clear


async def _collect(
    settings: Settings, inp: CollectionInput, *, wait: bool, stay: bool
) -> tuple[CollectionResult, float] | None:
    """:func:`client.srl.collect_and_wait` with services on demand, saying where it
    started and, on a terminal, showing progress."""
    from client.srl import CollectionFailed, collect_and_wait
    from services.local import LocalServices

    def started(workflow_id: str) -> None:
        if output.human:
            batches = f", in batches of {inp.batch}" if inp.batch else ""
            note(f"Started {workflow_id}: {inp.task_count} tasks, source {inp.source}{batches}")

    try:
        return await collect_and_wait(
            LocalServices(settings, note),
            toolkit.sessions(settings),
            inp,
            task_queue=settings.task_queue,
            wait=wait,
            keep=stay or not wait,
            on_started=started,
            on_dead=lambda why: SRL.failure("error", why),
            progress=_progress,
        )
    except CollectionFailed as e:
        SRL.fail("run_failed", str(e))


SourceOpt = Annotated[
    str, typer.Option(help="gold_replay (the expert), teacher (a model) or actor (the pool)")
]
TeacherOpt = Annotated[str, typer.Option(help="Teacher model (configs/models.yaml)")]
MaxStepsOpt = Annotated[int, typer.Option(min=1, max=20, help="Step cap per episode")]
WindowOpt = Annotated[int, typer.Option(min=1, max=200, help="Episodes in flight")]
PerRunOpt = Annotated[
    int, typer.Option(min=1, max=1000, help="Episodes per run before continue-as-new")
]
LimitOpt = Annotated[int | None, typer.Option(min=1, help="Only the first N tasks")]
TemperatureOpt = Annotated[float, typer.Option(min=0.0, max=2.0)]
MaxTokensOpt = Annotated[int, typer.Option(min=16, max=8192)]
TopPOpt = Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling")]
SamplesOpt = Annotated[
    int, typer.Option(min=1, max=64, help="Rollouts per task, each with its own seed")
]
SeedOpt = Annotated[int, typer.Option(min=0, max=2**31 - 1, help="Base of every sample's seed")]
StepModeOpt = Annotated[
    str,
    typer.Option(
        help="expert_prefix (the paper's, default): step n starts from the file after the "
        "expert's steps 1..n-1; free_running: from the episode's own last file"
    ),
]
ExpertFeedbackOpt = Annotated[
    bool,
    typer.Option(
        "--expert-feedback/--no-expert-feedback",
        help="Let feedback derived from the expert's file ('matches the goal', 'removed "
        "code the goal keeps') into the next prompt (off by default)",
    ),
]
BatchOpt = Annotated[
    int,
    typer.Option(
        min=0,
        max=1000,
        help="Episodes per srl.episodes activity; 0 (default): a child workflow per "
        "episode. Faster at volume (no workflow start and two activities a step), but "
        "an answer received and not yet recorded is asked again after a lost worker "
        "(a child keeps it in its history)",
    ),
]
WaitOpt = Annotated[bool, typer.Option("--wait/--no-wait", help="Wait, with progress")]
StayOpt = Annotated[bool, typer.Option("--stay", help="Keep services this started")]


def _check_choices(source: str, step_mode: str) -> None:
    if source not in ("gold_replay", "teacher", "actor"):
        SRL.fail_now("usage", f"--source must be gold_replay, teacher or actor, not {source!r}")
    if step_mode not in ("expert_prefix", "free_running"):
        SRL.fail_now(
            "usage", f"--step-mode must be expert_prefix or free_running, not {step_mode!r}"
        )


def _upload(settings: Settings, tasks: Path, limit: int | None, source: str) -> tuple[str, int]:
    """The task file read, then stored by :func:`client.srl.upload_tasks` (its first
    ``limit`` lines): its digest and task count."""
    from client.srl import upload_tasks
    from store.artifacts import artifact_store_from_settings

    try:
        data = tasks.read_bytes()
    except OSError as e:
        SRL.fail("invalid_input", f"cannot read {tasks}: {e.strerror or e}")
    return upload_tasks(artifact_store_from_settings(settings), data, source, limit)


def _collection_input(**fields: Any) -> CollectionInput:
    """The collection's input; a value the model refuses is a usage error."""
    from pydantic import ValidationError

    from keel.srl.steps import CollectionInput

    try:
        return CollectionInput(**fields)
    except ValidationError as e:
        SRL.fail("usage", [err["msg"] for err in e.errors()])


def _started(collection: str) -> None:
    """``--no-wait``: the collection's workflow id, and how to follow it."""
    from client.srl import collection_workflow_id

    wid = collection_workflow_id(collection)
    SRL.emit(
        {"collection": collection, "workflow_id": wid, "status": "running"},
        f"{collection}: started ({wid}); follow it with `srl show {collection}`",
    )


@app.command()
def collect(
    tasks: Annotated[
        Path, typer.Argument(help="Task file (JSONL of SrlTask; 'srl synth' writes one)")
    ],
    collection: CollectionOpt,
    source: SourceOpt = "gold_replay",
    model: TeacherOpt = "",
    max_steps: MaxStepsOpt = 3,
    window: WindowOpt = 8,
    per_run: PerRunOpt = 200,
    limit: LimitOpt = None,
    temperature: TemperatureOpt = 0.0,
    max_tokens: MaxTokensOpt = 512,
    top_p: TopPOpt = 1.0,
    samples: SamplesOpt = 1,
    seed: SeedOpt = 0,
    step_mode: StepModeOpt = "expert_prefix",
    expert_feedback: ExpertFeedbackOpt = False,
    batch: BatchOpt = 0,
    wait: WaitOpt = True,
    stay: StayOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Run an SRLCollection over a task file: every step recorded once, in SQL.

    Run again under the same id, it reuses every step recorded (no model call) and
    collects what is missing; another source, model or sampling is refused."""
    SRL.mode(json_out)
    _check_choices(source, step_mode)
    with SRL.reported():
        settings = toolkit.load_settings()
        digest, count = _upload(settings, tasks, limit, source)
        inp = _collection_input(
            collection=collection,
            tasks_digest=digest,
            task_count=count,
            source=source,
            model=model,
            max_steps=max_steps,
            window=window,
            per_run=per_run,
            temperature=temperature,
            max_tokens=max_tokens,
            top_p=top_p,
            samples=samples,
            seed=seed,
            step_mode=step_mode,
            expert_feedback=expert_feedback,
            batch=batch,
        )
        done = asyncio.run(_collect(settings, inp, wait=wait, stay=stay))
        if done is None:
            return _started(collection)
        result, elapsed = done
        doc = {**result.model_dump(mode="json"), "elapsed_s": round(elapsed, 3)}
        SRL.emit(doc, srl_text.collect_text(collection, result.totals, elapsed))


# -- show, report, export, state -----------------------------------------------------------


def _rows(settings: Settings, collection: str, task_id: str | None = None) -> list[StepRow]:
    from store.srl_steps import list_steps

    rows = list_steps(toolkit.sessions(settings), collection, task_id=task_id)
    if not rows:
        what = f"task {task_id} in " if task_id else ""
        SRL.fail("not_found", f"no steps recorded for {what}collection {collection!r}")
    return rows


@app.command()
def show(
    collection: Annotated[str, typer.Argument(help="The collection id")],
    json_out: JsonOpt = None,
) -> None:
    """A collection's status, progress or result, and its recorded steps."""
    from client.srl import collection_view_here
    from services.local import LocalServices

    SRL.mode(json_out)
    with SRL.reported():
        settings = toolkit.load_settings()
        v = asyncio.run(
            collection_view_here(
                LocalServices(settings, note), lambda: toolkit.sessions(settings), collection
            )
        )
        if v is None:
            SRL.fail("not_found", f"no collection {collection!r}")
        r = v.recorded
        SRL.emit(
            v.model_dump(mode="json"),
            f"{collection}: {v.status}, {v.done}/{v.task_count} episodes; recorded "
            f"{r['steps']} steps, {r['verified']} verified, {r['format_errors']} malformed",
        )


@app.command()
def report(
    collection: Annotated[
        list[str],
        typer.Option("--collection", "-c", help="A collection id (repeat to join several)"),
    ],
    out: Annotated[Path | None, typer.Option(help="Write the Markdown here")] = None,
    json_out: JsonOpt = None,
) -> None:
    """The precision report: verified / total by source, model, language and template."""
    from keel.srl.trajectory import precision_lines, precision_report

    SRL.mode(json_out)
    with SRL.reported():
        settings = toolkit.load_settings()
        rows = [r for c in collection for r in _rows(settings, c)]
        text = precision_report(rows, title=f"SRL precision: {', '.join(collection)}")
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text, encoding="utf-8")
            note(f"wrote {out}")
        lines = [p.model_dump() | {"precision": p.precision} for p in precision_lines(rows)]
        SRL.emit({"collections": collection, "lines": lines, "markdown": text}, text.rstrip())


@app.command()
def export(
    collection: CollectionOpt,
    out: Annotated[Path, typer.Option(help="Folder for steps.jsonl and steps.parquet")],
    json_out: JsonOpt = None,
) -> None:
    """Write the collection's steps: §7 JSONL records and Parquet with reward columns and
    TRL's conversational columns (docs/srl-export.md)."""
    from client.srl import collection_tasks
    from store.artifacts import artifact_store_from_settings

    SRL.mode(json_out)
    with SRL.reported():
        settings = toolkit.load_settings()
        rows = _rows(settings, collection)
        tasks = collection_tasks(
            toolkit.sessions(settings), artifact_store_from_settings(settings), collection
        )
        paths = write_export(rows, out, tasks)
        SRL.emit(
            {"collection": collection, "steps": len(rows), **{k: str(v) for k, v in paths.items()}},
            f"{collection}: {len(rows)} steps -> {paths['jsonl']}, {paths['parquet']}",
        )


@app.command()
def expert(
    collection: CollectionOpt,
    out: Annotated[Path, typer.Option("--out", "-o", help="The expert task file to write")],
    json_out: JsonOpt = None,
) -> None:
    """Write the collection's verified trajectories as an expert set: its task file with
    each verified task's expert steps ('srl collect' on it scores step n against the
    expert's step n)."""
    from client.srl import expert_task_file
    from store.artifacts import artifact_store_from_settings

    SRL.mode(json_out)
    with SRL.reported():
        settings = toolkit.load_settings()
        data, done = expert_task_file(
            toolkit.sessions(settings), artifact_store_from_settings(settings), collection
        )
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        missing = f"; without a verified episode: {', '.join(done.without)}" if done.without else ""
        SRL.emit(
            {**done.model_dump(mode="json"), "out": str(out)},
            f"{collection}: {done.experts} expert trajectories ({done.expert_steps} steps, "
            f"{done.source} {done.model or ''}".rstrip()
            + f") -> {out}{missing}",
        )


@state_app.command("dump")
def state_dump(
    task_id: Annotated[str, typer.Argument(help="The task id")],
    collection: CollectionOpt,
    json_out: JsonOpt = None,
) -> None:
    """The task's state after its last recorded step (and before it, at step 1)."""
    import json

    from keel.srl.state import parse_state, render

    SRL.mode(json_out)
    with SRL.reported():
        rows = _rows(toolkit.load_settings(), collection, task_id)
        last = json.loads(rows[-1].record_json)
        state = parse_state(last.get("state_after") or last["state_before"])
        SRL.emit(
            {
                "collection": collection,
                "task_id": task_id,
                "step": rows[-1].step,
                "state": state.model_dump(),
            },
            render(state),
        )


def main(argv: list[str] | None = None) -> None:
    SRL.main(app, argv)


if __name__ == "__main__":
    main()
