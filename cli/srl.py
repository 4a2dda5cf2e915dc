"""``srl``: SRL datasets, synthetic tasks and trajectory collection (docs/srl-collect.md).

``srl data ingest|process|stats``, ``srl tasks`` and ``srl synth`` are in
``cli/srl_data.py`` (docs/srl-data.md).

``srl collect TASKS.jsonl`` runs an ``SRLCollection`` on the configured Temporal server
(or the embedded one, started on demand, with a worker) and shows a live progress line;
``srl show``, ``srl report`` (teacher precision, Markdown), ``srl export`` (JSONL and
Parquet) and ``srl state dump`` read the step rows in SQL. Output, errors and exit codes
follow the CLI toolkit (``cli/toolkit.py``): text on a terminal, one JSON document
otherwise, ``{"error": {...}}`` on failure.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit
from cli.srl_data import data_app, synth
from cli.srl_data import tasks as tasks_command
from cli.srl_data import translate as data_translate
from cli.toolkit import note, output

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


def _progress_line(p: Any, started: float) -> str:
    t = p.totals
    minutes = max(time.monotonic() - started, 1e-6) / 60
    precision = f"{t.verified_steps / t.steps:.1%}" if t.steps else "-"
    episodes = p.task_count * p.samples if p.task_count is not None else None
    return (
        f"episodes {p.done}/{episodes} ({p.in_flight} running), steps {t.steps}, "
        f"verified {t.verified_steps}, precision {precision}, {t.steps / minutes:.1f} steps/min"
    )


async def _watch(client: Client, workflow_id: str, services: Any, show: bool) -> None:
    from keel.srl.steps import CollectionProgress

    handle = client.get_workflow_handle(workflow_id)
    started = time.monotonic()
    last = ""

    async def tick() -> None:
        nonlocal last
        p = await handle.query("progress", result_type=CollectionProgress)
        line = _progress_line(p, started)
        if line != last:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()
            last = line

    await toolkit.watch_services(
        services,
        on_dead=lambda why: SRL.failure("error", why),
        tick=tick if show else None,
        interval_s=1.0,
    )


async def _collect(
    settings: Settings, inp: CollectionInput, *, wait: bool, stay: bool
) -> tuple[CollectionResult, float] | None:
    """Start the collection (services on demand) and, with ``wait``, its result and the
    seconds from its start to its result."""
    from temporalio.client import WorkflowFailureError

    from client.srl import check_identity, start_collection
    from services.local import LocalServices

    check_identity(toolkit.sessions(settings), inp)
    services = LocalServices(settings, note)
    try:
        client = await services.connect()
        handle = await start_collection(client, inp, task_queue=settings.task_queue)
        started = time.monotonic()
        if output.human:
            note(f"Started {handle.id}: {inp.task_count} tasks, source {inp.source}")
        await services.ensure_worker(handle.id, "srl-worker.log")
        if not wait:
            return None
        show = sys.stderr.isatty()
        try:
            result = await toolkit.wait_watching(
                handle.result(), _watch(client, handle.id, services, show)
            )
            return result, time.monotonic() - started
        except WorkflowFailureError as err:
            SRL.fail("run_failed", f"collection {inp.collection} failed: {err.cause or err}")
        finally:
            if show:
                sys.stderr.write("\r\033[K")
                sys.stderr.flush()
    finally:
        await asyncio.to_thread(services.stop, stay or not wait)


@app.command()
def collect(
    tasks: Annotated[
        Path, typer.Argument(help="Task file (JSONL of SrlTask; `srl synth` writes one)")
    ],
    collection: CollectionOpt,
    source: Annotated[
        str, typer.Option(help="gold_replay (the expert), teacher (a model) or actor (the pool)")
    ] = "gold_replay",
    model: Annotated[str, typer.Option(help="Teacher model (configs/models.yaml)")] = "",
    max_steps: Annotated[int, typer.Option(min=1, max=20, help="Step cap per episode")] = 3,
    window: Annotated[int, typer.Option(min=1, max=200, help="Episodes in flight")] = 8,
    per_run: Annotated[
        int, typer.Option(min=1, max=1000, help="Episodes per run before continue-as-new")
    ] = 200,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N tasks")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, max=2.0)] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=16, max=8192)] = 512,
    top_p: Annotated[float, typer.Option(min=0.0, max=1.0, help="Nucleus sampling")] = 1.0,
    samples: Annotated[
        int, typer.Option(min=1, max=64, help="Rollouts per task, each with its own seed")
    ] = 1,
    seed: Annotated[
        int, typer.Option(min=0, max=2**31 - 1, help="Base of every sample's seed")
    ] = 0,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait, with progress")] = True,
    stay: Annotated[bool, typer.Option("--stay", help="Keep services this started")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Run an SRLCollection over a task file: every step recorded once, in SQL.

    Run again under the same id, it reuses every step recorded (no model call) and
    collects what is missing; another source, model or sampling is refused."""
    from pydantic import ValidationError

    from client.srl import collection_workflow_id, upload_tasks
    from keel.srl.steps import CollectionInput
    from store.artifacts import artifact_store_from_settings

    SRL.mode(json_out)
    if source not in ("gold_replay", "teacher", "actor"):
        SRL.fail_now("usage", f"--source must be gold_replay, teacher or actor, not {source!r}")
    with SRL.reported():
        settings = toolkit.load_settings()
        try:
            data = tasks.read_bytes()
        except OSError as e:
            SRL.fail("invalid_input", f"cannot read {tasks}: {e.strerror or e}")
        if limit is not None:
            data = b"".join(data.splitlines(keepends=True)[:limit])
        digest, count = upload_tasks(artifact_store_from_settings(settings), data, source)
        try:
            inp = CollectionInput(
                collection=collection,
                tasks_digest=digest,
                task_count=count,
                source=source,  # type: ignore[arg-type]
                model=model,
                max_steps=max_steps,
                window=window,
                per_run=per_run,
                temperature=temperature,
                max_tokens=max_tokens,
                top_p=top_p,
                samples=samples,
                seed=seed,
            )
        except ValidationError as e:
            SRL.fail("usage", [err["msg"] for err in e.errors()])
        done = asyncio.run(_collect(settings, inp, wait=wait, stay=stay))
        if done is None:
            wid = collection_workflow_id(collection)
            SRL.emit(
                {"collection": collection, "workflow_id": wid, "status": "running"},
                f"{collection}: started ({wid}); follow it with `srl show {collection}`",
            )
            return
        result, elapsed = done
        t = result.totals
        doc = {**result.model_dump(mode="json"), "elapsed_s": round(elapsed, 3)}
        rate = t.steps / (elapsed / 60) if elapsed > 0 else 0.0
        SRL.emit(
            doc,
            f"{collection}: {t.episodes} episodes ({t.verified_episodes} verified, "
            f"{t.failed_episodes} failed), {t.steps} steps, {t.verified_steps} verified, "
            f"{t.format_errors} malformed, {t.sandbox_failures} sandbox failures, "
            f"{t.reused_steps} reused; "
            f"{elapsed:.1f}s ({rate:.1f} steps/min)",
        )


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
    from client.srl import collection_view
    from services.local import LocalServices

    SRL.mode(json_out)
    with SRL.reported():
        settings = toolkit.load_settings()

        async def view() -> Any:
            services = LocalServices(settings, note)
            try:
                # A read: it never starts Keel (it used to, and left it running).
                client = await services.connect(start=False)
                return await collection_view(client, toolkit.sessions(settings), collection)
            finally:
                await asyncio.to_thread(services.stop, True)

        v = asyncio.run(view())
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
    """Write the collection's steps: §7 JSONL records and Parquet with reward columns."""
    SRL.mode(json_out)
    with SRL.reported():
        rows = _rows(toolkit.load_settings(), collection)
        paths = write_export(rows, out)
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
    each verified task's expert steps (`srl collect` on it scores step n against the
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


def _record_columns(record_json: str) -> dict[str, Any]:
    """The record's parts a trainer reads, as flat values (JSON text for the open ones)."""
    import json

    record = json.loads(record_json)
    out = record.get("model_output") or {}
    sampling = record.get("sampling") or {}
    reward = record.get("reward") or {}

    def text(value: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)

    return {
        "think": out.get("think", ""),
        "action": text(out.get("action")),
        "state_update": text(out.get("state_update")),
        "raw": out.get("raw", ""),
        "format_error": out.get("format_error"),
        "prompt": text(record.get("prompt")),
        "state_before": text(record.get("state_before")),
        "state_after": text(record.get("state_after")),
        "temperature": sampling.get("temperature"),
        "top_p": sampling.get("top_p"),
        "max_tokens": sampling.get("max_tokens"),
        "prompt_tokens": out.get("prompt_tokens"),
        "completion_tokens": out.get("completion_tokens"),
        "finish_reason": out.get("finish_reason"),
        "latency_s": out.get("latency_s"),
        "cost_usd": out.get("cost_usd"),
        "endpoint": out.get("endpoint"),
        # Both rewards, and what they are computed from (docs/srl.md, "Rewards"): Keel's
        # is reward_total and step_similarity among the row's columns.
        "paper_reward": reward.get("paper_reward"),
        "reward_version": reward.get("reward_version"),
        "effect": reward.get("effect"),
        "expert_action": text(record.get("expert_action")),
        "expert_text_after": record.get("expert_text_after"),
        "text_before": record.get("text_before"),
        "text_after": record.get("text_after"),
    }


def write_export(rows: list[StepRow], out: Path) -> dict[str, Path]:
    """``steps.jsonl`` (one §7 record a line) and ``steps.parquet``: the row's columns
    (rewards flat, sample and seed, the record as JSON text) and the record's parts as
    columns of their own (think, action, state update, prompt, sampling, tokens,
    finish_reason, latency, cost), and both rewards with what they are computed from
    (``paper_reward`` a float column beside ``reward_total``, ``reward_version``,
    ``effect``, the expert action, the file before and after)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from keel.srl.trajectory import StepRow

    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "steps.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.record_json + "\n")
    columns: dict[str, list[Any]] = {c: [getattr(r, c) for r in rows] for c in StepRow.model_fields}
    extra = [_record_columns(r.record_json) for r in rows]
    for name in _record_columns("{}"):
        columns[name] = [e[name] for e in extra]
    types = {
        "seed": pa.int64(),
        "temperature": pa.float64(),
        "top_p": pa.float64(),
        "max_tokens": pa.int64(),
        "prompt_tokens": pa.int64(),
        "completion_tokens": pa.int64(),
        "latency_s": pa.float64(),
        "cost_usd": pa.float64(),
        "paper_reward": pa.float64(),
        "reward_version": pa.string(),
        "effect": pa.string(),
        "expert_action": pa.string(),
        "expert_text_after": pa.string(),
        "text_before": pa.string(),
        "text_after": pa.string(),
    }
    fields = [
        pa.field(c, types[c]) if c in types else pa.field(c, pa.array(v).type)
        for c, v in columns.items()
    ]
    schema = pa.schema(
        [f if f.type != pa.null() else pa.field(f.name, pa.string()) for f in fields]
    )
    table = pa.table(columns, schema=schema)
    parquet = out / "steps.parquet"
    pq.write_table(table, parquet)
    return {"jsonl": jsonl, "parquet": parquet}


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
