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
from collections.abc import Mapping
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
    from keel.srl.steps import CollectionInput, CollectionResult, SrlTask
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
        Path, typer.Argument(help="Task file (JSONL of SrlTask; 'srl synth' writes one)")
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
    step_mode: Annotated[
        str,
        typer.Option(
            help="expert_prefix (the paper's, default): step n starts from the file after the "
            "expert's steps 1..n-1; free_running: from the episode's own last file"
        ),
    ] = "expert_prefix",
    expert_feedback: Annotated[
        bool,
        typer.Option(
            "--expert-feedback/--no-expert-feedback",
            help="Let feedback derived from the expert's file ('matches the goal', 'removed "
            "code the goal keeps') into the next prompt (off by default)",
        ),
    ] = False,
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
    if step_mode not in ("expert_prefix", "free_running"):
        SRL.fail_now(
            "usage", f"--step-mode must be expert_prefix or free_running, not {step_mode!r}"
        )
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
                step_mode=step_mode,  # type: ignore[arg-type]
                expert_feedback=expert_feedback,
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


def _record_columns(record_json: str) -> dict[str, Any]:
    """The record's parts a trainer reads, as flat values (JSON text for the open ones).
    The chat, the completion and the think text are :func:`keel.srl.export.trainer_columns`'."""
    import json

    record = json.loads(record_json)
    out = record.get("model_output") or {}
    sampling = record.get("sampling") or {}
    reward = record.get("reward") or {}

    def text(value: Any) -> str | None:
        return None if value is None else json.dumps(value, sort_keys=True, ensure_ascii=False)

    return {
        "action": text(out.get("action")),
        "state_update": text(out.get("state_update")),
        "raw": out.get("raw", ""),
        "format_error": out.get("format_error"),
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
        # is reward_total (and `reward`) and step_similarity among the row's columns.
        "paper_reward": reward.get("paper_reward"),
        "reward_version": reward.get("reward_version"),
        "effect": reward.get("effect"),
        "expert_action": text(record.get("expert_action")),
        "expert_text_after": record.get("expert_text_after"),
        "text_before": record.get("text_before"),
        "text_after": record.get("text_after"),
    }


def export_schema() -> Any:
    """The Parquet schema of ``steps.parquet``: every column typed (a column of nulls
    keeps its type; TRL's chat columns are lists of ``{role, content}``)."""
    import pyarrow as pa

    chat = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    s, i, f, b = pa.string(), pa.int64(), pa.float64(), pa.bool_()
    return pa.schema(
        [
            # the row's columns (keel.srl.trajectory.StepRow)
            ("step_key", s), ("schema_version", i), ("collection", s), ("task_id", s),
            ("step", i), ("source", s), ("model", s), ("language", s), ("template", s),
            ("format_ok", b), ("verified", b), ("tests_passed", b), ("diff_lines", i),
            ("step_similarity", f), ("reward_total", f), ("record_json", s),
            ("record_digest", s), ("sample", i), ("seed", i),
            # the record's parts
            ("action", s), ("state_update", s), ("raw", s), ("format_error", s),
            ("state_before", s), ("state_after", s), ("temperature", f), ("top_p", f),
            ("max_tokens", i), ("prompt_tokens", i), ("completion_tokens", i),
            ("finish_reason", s), ("latency_s", f), ("cost_usd", f), ("endpoint", s),
            ("paper_reward", f), ("reward_version", s), ("effect", s), ("expert_action", s),
            ("expert_text_after", s), ("text_before", s), ("text_after", s),
            # TRL's conversational columns and the rewards (keel.srl.export)
            ("messages", chat), ("prompt", chat), ("completion", chat), ("prompt_json", s),
            ("think", s), ("think_source", s), ("reward", f), ("tests_passed_fraction", f),
            ("text_similarity", f), ("logprobs", pa.list_(f)), ("token_ids", pa.list_(i)),
        ]
    )  # fmt: skip


def write_export(
    rows: list[StepRow], out: Path, tasks: Mapping[str, SrlTask] | None = None
) -> dict[str, Path]:
    """``steps.jsonl`` (one §7 record a line) and ``steps.parquet``: the row's columns
    (rewards flat, sample and seed, the record as JSON text), the record's parts as
    columns of their own (action, state update, sampling, tokens, finish_reason, latency,
    cost, both rewards and what they are computed from), and TRL's conversational
    columns: ``messages`` (the chat sent, then the answer), ``prompt`` and ``completion``
    (docs/srl-export.md). ``tasks`` (by id; the collection's task file) give a gold
    replay's completion its expert's reasoning (:func:`keel.srl.export.gold_think`)."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from keel.srl.export import trainer_columns
    from keel.srl.trajectory import StepRow

    schema = export_schema()
    out.mkdir(parents=True, exist_ok=True)
    jsonl = out / "steps.jsonl"
    with jsonl.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(row.record_json + "\n")
    columns: dict[str, list[Any]] = {c: [getattr(r, c) for r in rows] for c in StepRow.model_fields}
    extra = []
    for r in rows:
        task = (tasks or {}).get(r.task_id)
        record = json.loads(r.record_json)
        extra.append(
            _record_columns(r.record_json) | trainer_columns(record, source=r.source, task=task)
        )
    for name in schema.names:
        if name not in columns:
            columns[name] = [e[name] for e in extra]
    # tests_passed: a nullable bool (null where the task has no tests); the fraction of
    # tests passed is tests_passed_fraction.
    columns["tests_passed"] = [e["tests_passed"] for e in extra]
    for name in columns:  # a row column this schema does not name yet: inferred
        if name not in schema.names:
            kind = pa.array(columns[name]).type
            schema = schema.append(pa.field(name, pa.string() if kind == pa.null() else kind))
    table = pa.table({n: columns[n] for n in schema.names}, schema=schema)
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
