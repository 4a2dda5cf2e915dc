"""``keel``: run the Keel service locally (``up``/``down``/``status``), or its parts alone.

Output and errors as in every Keel CLI (``cli/toolkit.py``): ``status``, ``ping`` and
``down`` print text on a terminal and one JSON document otherwise (``--json``/``--text``);
a failure of any command is one ``error:`` line per problem on stderr and, in JSON mode,
the envelope ``{"error": {...}}`` of family ``keel`` on stdout (``keel gates``: family
``gate``). The long-running commands (``up``, ``worker``, ``api``, ``actors serve``,
``demo``) print their progress as text whatever the mode.

Heavy imports (Temporal worker, FastAPI, LiteLLM) happen inside the commands that need
them, so ``keel --help`` and ``keel status`` start fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from activities import lazy_iri
from cli import toolkit
from cli.gate import app as gates_app
from cli.toolkit import JsonOpt, load_settings, sessions
from keel.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from cli.envelope import CliError

app = typer.Typer(
    help="Keel: durable workflows for AI work, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
)
log = logging.getLogger("keel")


def _translate(err: BaseException) -> CliError | None:
    """Keel's own exceptions as the CLI reports them (None: not one of them)."""
    from keel.srl.errors import ActorsConfigError
    from services.processes import ServiceError

    if isinstance(err, ActorsConfigError):
        return KEEL.failure("usage", str(err)).error
    if isinstance(err, ServiceError):
        return KEEL.failure("error", str(err)).error
    return None


#: The toolkit's wrapper for ``keel`` (failures, output, entry point).
KEEL = toolkit.Family("keel", _translate, bad_settings="error")


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def up(
    model: Annotated[bool, typer.Option(help="Start the embedded local model server")] = True,
    json_out: JsonOpt = None,
) -> None:
    """Start the embedded Temporal dev server, the local model server, a worker and the API.

    Stays up until Ctrl-C or 'keel down'; everything binds to 127.0.0.1.
    """
    KEEL.mode(json_out)
    from services.model_server import LocalModelServer, unavailable_reason
    from services.processes import (
        Interrupted,
        ManagedProcess,
        ServiceError,
        StopSignals,
        TemporalDevServer,
        pid_alive,
        port_open,
    )
    from services.supervise import supervise
    from services.up import (
        console_link,
        forget_state,
        keel_process,
        read_recorded,
        starting_file,
        state_file,
        write_state,
    )

    # From the first line on, SIGINT, SIGTERM and SIGHUP become ``Interrupted`` (held
    # while a child is spawned and its PID recorded), and every exit below runs the
    # ``finally`` that stops what was started: a start cut short leaves nothing behind.
    guard = StopSignals().install()
    try:
        _setup_logging()
        settings = load_settings()
        settings.check_secrets()
        recorded = read_recorded(settings)
    except Interrupted as sig:
        guard.uninstall()
        raise typer.Exit(128 + sig.signum) from None
    except BaseException:
        guard.uninstall()  # bad settings: reported by the caller, nothing was started
        raise
    if recorded is not None:
        if pid_alive(int(recorded.get("supervisor", 0)) or -1):
            guard.uninstall()
            KEEL.fail_now(
                "error",
                f"Keel is already running (keel up pid {recorded['supervisor']}); "
                "see `keel status`, or stop it with `keel down`.",
            )
        left = [
            f"{name} pid {svc['pid']}"
            for name, svc in recorded.get("services", {}).items()
            if pid_alive(int(svc["pid"]))
        ]
        if left:
            guard.uninstall()
            KEEL.fail_now(
                "error",
                f"a keel up that was killed left services running ({', '.join(left)}); "
                "stop them with `keel down`.",
            )
        forget_state(settings)
    logs = settings.data_dir / "logs"
    started: list[Any] = []
    services: dict[str, dict[str, Any]] = {}
    record_to = [starting_file(settings)]

    def record(name: str, **info: Any) -> None:
        services[name] = info
        write_state(record_to[0], services)

    def recorder(name: str, **info: Any) -> Any:
        return lambda pid: record(name, pid=pid, **info)

    state_path = state_file(settings)
    code = 0
    try:
        try:
            if not settings.temporal_address:
                temporal = TemporalDevServer(
                    db_file=settings.data_dir / "temporal.db",
                    log_path=logs / "temporal.log",
                    port=settings.dev_server_port,
                    ui_port=settings.dev_server_ui_port,
                    namespace=settings.temporal_namespace,
                )
                temporal.on_spawn = recorder(
                    "temporal", address=temporal.address, ui=temporal.ui_url
                )
                started.append(temporal)
                temporal.start()
            if model:
                reason = unavailable_reason()
                if reason:
                    typer.echo(f"local model server not started: {reason}", err=True)
                else:
                    server = LocalModelServer(
                        port=settings.model_server_port, log_path=logs / "model-server.log"
                    )
                    server.on_spawn = recorder("model", address=server.base_url)
                    started.append(server)
                    server.start()
            worker = keel_process("worker", logs / "worker.log")
            worker.on_spawn = recorder("worker", task_queue=settings.task_queue)
            started.append(worker)
            worker.start()
            if port_open(settings.api_port):
                raise ServiceError(f"API port {settings.api_port} is already in use")
            api = keel_process("api", logs / "api.log")
            api.on_spawn = recorder("api", address=f"http://127.0.0.1:{settings.api_port}")
            started.append(api)
            api.start()
            api.wait_port(settings.api_port, 60)
        except Exception as err:
            code = toolkit.report(KEEL.failure("error", f"keel up failed: {err}").error)
            return
        with guard.deferred():  # up: the record moves to up.json in one step
            record_to[0] = state_path
            write_state(state_path, services)
            starting_file(settings).unlink(missing_ok=True)
        _say_up(settings, services, logs, console_link(settings))
        # A dead worker is what durable execution is for: its workflows wait in Temporal
        # for the next one. Without the API there is nothing to serve. (The dev server and
        # the model server are not ManagedProcess children: they are not watched here.)
        children = {s.name: s for s in started if isinstance(s, ManagedProcess)}
        why = supervise(children, _say_err, restart=[worker.name])
        typer.echo(f"{why}; stopping (logs in {logs})", err=True)
    except Interrupted as sig:
        if state_path.exists():
            typer.echo(f"{sig}: stopping", err=True)
        else:
            typer.echo(f"{sig} during start-up: stopping what was started", err=True)
            code = 128 + sig.signum
    finally:
        with guard.shutting_down():
            for svc in reversed(started):
                svc.stop()
            forget_state(settings)
            guard.uninstall()
        typer.echo("Keel is down." if code == 0 else "Keel is not up.", err=code != 0)
        if code:
            raise typer.Exit(code)


def _say_up(settings: Settings, services: dict[str, Any], logs: Path, console: str) -> None:
    typer.echo("Keel is up:")
    typer.echo(f"  Temporal   {settings.resolved_temporal_address}")
    if "temporal" in services:
        typer.echo(f"  Web UI     {services['temporal']['ui']}")
    if "model" in services:
        typer.echo(f"  Model      {services['model']['address']} (SmolLM2-135M, llama.cpp)")
    typer.echo(f"  Worker     task queue {settings.task_queue!r} (log {logs / 'worker.log'})")
    typer.echo(f"  API        {services['api']['address']}  (docs: /docs)")
    typer.echo(f"  Console    {console}  (design sessions, approval inbox, runs; an API token)")
    typer.echo("Stop with Ctrl-C or `keel down`.")
    sys.stdout.flush()


def _say_err(line: str) -> None:
    typer.echo(line, err=True)


@app.command()
def down(timeout: float = 30.0, json_out: JsonOpt = None) -> None:
    """Stop the services a running 'keel up' started (also those of a start cut short,
    or of a 'keel up' that was killed)."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _down(timeout)


def _down(timeout: float) -> None:
    from services.processes import pid_alive, stop_pid
    from services.up import forget_state, read_recorded

    settings = load_settings()
    state = read_recorded(settings)
    if state is None:
        KEEL.emit({"was_running": False, "stopped": []}, "Keel is not running.")
        return
    supervisor = int(state.get("supervisor", 0)) or -1
    if pid_alive(supervisor):
        with contextlib.suppress(ProcessLookupError):
            os.kill(supervisor, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_alive(supervisor) and time.monotonic() < deadline:
            time.sleep(0.1)
    # What a supervisor that hung, or was killed, left behind. Read again: a start cut
    # short may have recorded one more service since.
    state = read_recorded(settings) or state
    stopped = []
    for name, svc in state.get("services", {}).items():
        if pid_alive(int(svc["pid"])):
            stop_pid(int(svc["pid"]))
            stopped.append(name)
    if pid_alive(supervisor):
        stop_pid(supervisor)
    forget_state(settings)
    KEEL.emit({"was_running": True, "stopped": stopped}, "Keel is down.")


@app.command()
def status(json_out: JsonOpt = None) -> None:
    """Show what 'keel up' runs and whether Temporal answers."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _status()


def _status() -> None:
    from services.processes import pid_alive
    from services.up import read_recorded, read_state

    settings = load_settings()
    state = read_state(settings)
    lines = []
    phase = "up"
    if state is None:
        recorded = read_recorded(settings)
        if recorded is None:
            KEEL.fail("not_running", "Keel is not running (start it with `keel up`).")
        state = recorded
        if pid_alive(int(recorded.get("supervisor", 0)) or -1):
            phase = "starting"
            lines.append("Keel is starting:")
        else:
            phase = "killed"
            lines.append("A keel up was killed and left these (stop them with `keel down`):")
    lines.append(f"keel up pid {state['supervisor']}")
    services = {}
    for name, svc in state["services"].items():
        alive = pid_alive(int(svc["pid"]))
        services[name] = {**svc, "running": alive}
        where = svc.get("address") or svc.get("task_queue", "")
        lines.append(f"  {name:<9} pid {svc['pid']:<8} {'running' if alive else 'DEAD':<8} {where}")
    KEEL.emit(
        {"state": phase, "supervisor": state["supervisor"], "services": services}, "\n".join(lines)
    )


@app.command()
def ping(json_out: JsonOpt = None) -> None:
    """Check that the configured Temporal server answers."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _ping()


def _ping() -> None:
    settings = load_settings()

    async def check() -> str:
        from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

        from client.temporal import connect

        client = await connect(settings)
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
        return info.server_version

    try:
        version = asyncio.run(check())
    except Exception as err:
        KEEL.fail(
            "error", f"Temporal at {settings.resolved_temporal_address} does not answer: {err}"
        )
    address = settings.resolved_temporal_address
    KEEL.emit(
        {"temporal": address, "server_version": version},
        f"Temporal answers at {address} (server {version})",
    )


@app.command("migrate-search-attributes")
def migrate_search_attributes(
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List them; signal none")] = False,
    task_queue: Annotated[str | None, typer.Option(help="Only workflows on this queue")] = None,
    json_out: JsonOpt = None,
) -> None:
    """Set KeelReaders on open runs and gates started before it existed, so their owners
    and approvers find them in GET /gates and GET /runs (docs/console.md, "Runs")."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _migrate_search_attributes(dry_run, task_queue)


def _migrate_search_attributes(dry_run: bool, task_queue: str | None) -> None:
    settings = load_settings()

    async def migrate() -> list[str]:
        from client.readers import migrate_readers
        from client.temporal import connect
        from workers.main import ensure_search_attributes

        client = await connect(settings)
        await ensure_search_attributes(client, settings.temporal_namespace)
        return await migrate_readers(client, dry_run=dry_run, task_queue=task_queue)

    ids = asyncio.run(migrate())
    KEEL.emit({"dry_run": dry_run, "workflow_ids": ids}, "\n".join(ids))
    verb = "would signal" if dry_run else "signalled"
    toolkit.note(f"{verb} {len(ids)} open workflow(s) without KeelReaders")


@app.command()
def worker(json_out: JsonOpt = None) -> None:
    """Run one worker on the configured Temporal server until SIGTERM or Ctrl-C."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _setup_logging()
        settings = load_settings()
        settings.check_secrets()
    asyncio.run(_run_worker(settings))


async def _run_worker(settings: Settings, extra_workflows: Sequence[type] = ()) -> None:
    """``keel worker``'s body; ``extra_workflows`` run beside Keel's (bench/gate_worker.py
    adds the floor's ``FloorGate``)."""
    from activities.llm import load_litellm_async
    from client.temporal import connect
    from workers.main import build_worker, ensure_search_attributes
    from workers.telemetry import init_tracing, make_runtime

    init_tracing(settings)
    # LiteLLM's import takes seconds: pay it at start, not inside the first LLM call; the
    # same for the IRI grammar, whose first check may come inside a workflow task
    # (KEEL_WORKER_PRELOAD=false skips both: each then loads at its first use).
    if settings.worker_preload:
        await load_litellm_async()
        with contextlib.suppress(ImportError):
            lazy_iri.load_now()
    client = await connect(settings, runtime=make_runtime(settings))
    await ensure_search_attributes(client, settings.temporal_namespace)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with build_worker(
            client,
            settings,
            extra_workflows=extra_workflows,
            max_cached_workflows=settings.worker_max_cached_workflows,
        ):
            # What the start loaded (LiteLLM, the IRI grammar, every module: about 300,000
            # objects) lives as long as the process: out of the cycle collector's walks.
            gc.freeze()
            log.info("worker ready on task queue %r", settings.task_queue)
            if settings.metrics_port:
                log.info("metrics on http://127.0.0.1:%d/metrics", settings.metrics_port)
            await stop.wait()
    finally:
        # The CLI leaves through os._exit, which runs no atexit hook: stop the Ray node
        # that MRP windows started here (and remove its temp dir) before that.
        from activities.fanout import ray_shutdown

        await asyncio.to_thread(ray_shutdown)
    log.info("worker stopped")


@app.command()
def api(json_out: JsonOpt = None) -> None:
    """Serve the HTTP API on KEEL_API_HOST:KEEL_API_PORT (127.0.0.1:8088)."""
    import uvicorn

    from api.app import create_app

    KEEL.mode(json_out)
    with KEEL.reported():
        _setup_logging()
        settings = load_settings()
    uvicorn.run(
        create_app(settings), host=settings.api_host, port=settings.api_port, log_level="warning"
    )


@app.command()
def demo(
    stay: Annotated[bool, typer.Option(help="Keep the services up after the demo")] = False,
    json_out: JsonOpt = None,
) -> None:
    """Run the main job end to end: LLM call → approval gate → approved through the API,
    then the three example .rllm apps (examples/) on the local model, the MRP examples,
    an SRL collection and one design pipeline with a generated, validated repository."""
    from services.model_server import unavailable_reason
    from services.processes import Interrupted, ServiceError, StopSignals, pid_alive, stop_pid
    from services.up import read_state, start_up_in_background

    KEEL.mode(json_out)
    with KEEL.reported():
        settings = load_settings()
    started_here: subprocess.Popen[bytes] | None = None

    def spawned(proc: subprocess.Popen[bytes]) -> None:
        nonlocal started_here
        started_here = proc

    # SIGTERM/SIGHUP/Ctrl-C end the demo like a failure: the keel up it started is
    # stopped (held while it is being spawned, so it is never left unknown).
    guard = StopSignals().install()
    try:
        if read_state(settings) is None:
            reason = unavailable_reason()
            if reason:
                KEEL.fail_now("error", f"the demo needs the embedded local model: {reason}")
            typer.echo("Starting Keel (keel up) ...")
            try:
                start_up_in_background(settings, on_spawn=spawned)
            except ServiceError as err:
                KEEL.fail_now("error", str(err))
        asyncio.run(_run_demo(settings))
    except Interrupted as sig:
        typer.echo(f"{sig}: the demo stops", err=True)
        stay = False
        raise typer.Exit(128 + sig.signum) from None
    finally:
        with guard.shutting_down():
            if started_here is not None and not stay:
                typer.echo("Stopping the services this demo started ...")
                stop_pid(started_here.pid, 30)
                started_here.wait(timeout=30)
                if pid_alive(started_here.pid):
                    typer.echo("keel up did not stop cleanly", err=True)
            guard.uninstall()
    if started_here is not None and stay:
        typer.echo("Services stay up; stop them with `keel down`.")
    elif started_here is not None:
        typer.echo(
            "Run `keel up` to browse these runs again: the histories are kept in "
            f"{settings.data_dir / 'temporal.db'}."
        )


async def _run_demo(settings: Settings) -> None:
    import httpx
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    from client.temporal import cause_chain, connect
    from keel.demo import DEMO_WORKFLOW_TYPE, DemoInput, DemoResult
    from keel.gates import gate_workflow_id
    from services.up import console_link, ui_link

    client = await connect(settings)
    approver = next(t for t in settings.api_tokens if "approver" in t.roles)
    wid = f"demo/{uuid.uuid4().hex[:12]}"
    handle = await client.start_workflow(
        DEMO_WORKFLOW_TYPE,
        DemoInput(),
        id=wid,
        task_queue=settings.task_queue,
        result_type=DemoResult,
    )
    typer.echo(f"1. Started workflow {wid} (KeelDemo)")
    typer.echo("2. Asking the local model for a draft (llm.complete activity) ...")
    gate_id = gate_workflow_id(wid, "publish")
    base = f"http://127.0.0.1:{settings.api_port}"
    headers = {"Authorization": f"Bearer {approver.token.get_secret_value()}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        deadline = time.monotonic() + 600
        while True:
            resp = await http.get(f"/gates/{gate_id}")
            if resp.status_code == 200:
                break
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                # The LLM step failed for good (e.g. no model server): say why, don't wait.
                try:
                    await handle.result()
                except WorkflowFailureError as err:
                    # The innermost cause (the activity's own error) says what broke.
                    cause = cause_chain(err)[-1]
                    raise RuntimeError(f"the demo workflow {wid} failed: {cause}") from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"gate {gate_id} did not open in 10 minutes: {resp.text}")
            await asyncio.sleep(0.25)
        gate = resp.json()
        typer.echo(f"3. Gate opened: {gate_id}\n   {gate['subject']}")
        resp = await http.post(
            f"/gates/{gate_id}/approve",
            json={"comment": "approved by the demo"},
            headers={"Idempotency-Key": f"demo-{wid}"},
        )
        resp.raise_for_status()
        typer.echo(f"4. Approved through the API as {approver.actor} (POST /gates/.../approve)")
    result = await handle.result()
    typer.echo(f"5. Workflow completed: published={result.published}")
    typer.echo(f"   draft: {result.draft!r}")
    typer.echo(
        f"   model {result.llm.model_name}: {result.llm.usage.total_tokens} tokens, "
        f"{result.llm.latency_ms:.0f} ms"
    )
    typer.echo("Where to look in the Temporal Web UI:")
    typer.echo(f"   {ui_link(settings, wid)}")
    typer.echo(f"   {ui_link(settings, gate_id)}")
    typer.echo(
        f"The Keel console (design sessions, approval inbox, runs): {console_link(settings)}"
    )
    failed = await _run_rllm_examples(client, settings)
    failed += await _run_mrp_examples(client, settings)
    failed += await _run_srl_example(client, settings)
    failed += await _run_design_example(client, settings)
    if failed:
        raise RuntimeError("the demo's checks failed:\n  " + "\n  ".join(failed))
    typer.echo("All checks passed.")


RLLM_DEMO_TEXT = (
    "Temporal is a durable execution platform. A workflow keeps its state when a worker "
    "crashes, and it resumes on another worker from the last recorded step. Teams use it "
    "to run long business processes and AI pipelines reliably."
)


async def _run_rllm_examples(client: Any, settings: Settings) -> list[str]:
    """The three example ``.rllm`` apps on the local model, as ``RllmApp`` workflows.

    Each output is validated again against its app's ``output_schema`` and checked for
    what the input implies (:data:`keel.demo_checks.CONTENT_RULES`: the summary names
    something from the input, each keyword is a short phrase of words of the input, ...);
    each model call of the recovery loop is printed. Returns the checks that failed.
    """
    from temporalio.client import WorkflowFailureError

    from client.rllm import failure_payload, start_run
    from keel.demo_checks import CONTENT_RULES, attempt_lines, content_problems, schema_problems
    from keel.rllm.run import RllmRunInput, workflow_id_for
    from keel.rllm.schema import apply_defaults
    from services.up import ui_link
    from store.files import bundle_files, load_rllm

    examples = Path(__file__).resolve().parent.parent / "examples"
    typer.echo("6. .rllm apps on the local model (RllmApp workflows, as `runllm run` runs them)")
    typer.echo(f"   input text: {RLLM_DEMO_TEXT!r}")
    failed: list[str] = []
    for name in ("summary.rllm", "extract_keywords.rllm", "compose_summary_keywords.rllm"):
        program = load_rllm(examples / name)
        wid = workflow_id_for(Path(name).stem, str(uuid.uuid4()))
        inp = RllmRunInput(path=name, files=bundle_files(examples / name), input=RLLM_DEMO_TEXT)
        handle = await start_run(client, inp, workflow_id=wid, task_queue=settings.task_queue)
        try:
            r = await handle.result()
        except WorkflowFailureError as err:
            payload, _ = failure_payload(err, workflow_id=wid)
            raise RuntimeError(
                f"the example {name} failed: {payload.error_type}: {payload.message}"
            ) from None
        calls = len(r.attempts) + sum(len(c.attempts) for c in r.children.values())
        retries = r.retries + sum(c.retries for c in r.children.values())
        typer.echo(f"   examples/{name} -> {json.dumps(r.output, ensure_ascii=False)}")
        typer.echo(
            f"      {calls} model call(s), {retries} recovery retries, "
            f"{r.usage.total_tokens} tokens, {r.total_latency_ms:.0f} ms; {ui_link(settings, wid)}"
        )
        for line in attempt_lines(r.attempts):
            typer.echo(f"      {line}")
        for alias, child in r.children.items():
            for line in attempt_lines(child.attempts):
                typer.echo(f"      {alias} ({child.app}): {line}")
        inputs = apply_defaults(program.input_schema, {"text": RLLM_DEMO_TEXT})
        bad_schema = schema_problems(r.output, program.output_schema)
        bad_content = content_problems(program.name, r.output, inputs)
        typer.echo(
            "      output_schema: "
            + ("matches" if not bad_schema else f"{len(bad_schema)} problem(s)")
            + f"; content ({CONTENT_RULES.get(program.name, 'no content check')}): "
            + ("holds" if not bad_content else f"{len(bad_content)} problem(s)")
        )
        failed += [f"examples/{name}: output does not match output_schema: {p}" for p in bad_schema]
        failed += [f"examples/{name}: content check failed: {p}" for p in bad_content]
    return failed


SRL_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "srl" / "tasks.jsonl"
#: The demo's floor for the teacher's well-formed share (6 of 6 measured with structured
#: output; 0 of 6 before it: docs/srl-collect.md).
SRL_DEMO_MIN_WELL_FORMED = 0.9


async def _run_srl_example(client: Any, settings: Settings) -> list[str]:
    """A small SRL collection: the local model as the teacher on six refactoring tasks,
    then the gold actions replayed as the expert source; both precisions, honestly."""
    from client.srl import start_collection, upload_tasks
    from keel.srl.steps import CollectionInput
    from keel.srl.trajectory import precision_lines
    from services.up import ui_link
    from store.artifacts import artifact_store_from_settings
    from store.srl_steps import list_steps

    typer.echo("8. SRL collection on examples/srl/tasks.jsonl (SRLCollection, as `srl collect`)")
    digest, count = upload_tasks(artifact_store_from_settings(settings), SRL_EXAMPLE.read_bytes())
    sm = sessions(settings)
    failed: list[str] = []
    run = uuid.uuid4().hex[:8]
    for source, model in (("teacher", "local"), ("gold_replay", "")):
        collection = f"demo-{source.replace('_', '-')}-{run}"
        inp = CollectionInput(
            collection=collection,
            tasks_digest=digest,
            task_count=count,
            source=source,  # type: ignore[arg-type]
            model=model,
            # One step a task: each example task is solved by one action (the gold replay
            # verifies every one in one), and a second try on the small model doubled
            # the demo's longest step (49 s of its 121 s, measured).
            max_steps=1,
            window=3,
            # Room for a whole JSON-form answer (the step schema's bounds): a cut one
            # is recorded as truncated.
            max_tokens=512,
        )
        handle = await start_collection(client, inp, task_queue=settings.task_queue)
        result = await handle.result()
        t = result.totals
        rows = await asyncio.to_thread(list_steps, sm, collection)
        for line in precision_lines(rows):
            typer.echo(
                f"   {line.source} {line.model} {line.language}: "
                f"{line.verified}/{line.total} verified"
            )
        well_formed = (t.steps - t.format_errors) / t.steps if t.steps else 0.0
        verified = t.verified_steps / t.steps if t.steps else 0.0
        typer.echo(
            f"   {collection}: {t.steps} steps, {well_formed:.0%} well-formed "
            f"({t.format_errors} malformed), {verified:.0%} verified "
            f"({t.verified_steps}; {t.sandbox_failures} sandbox failures); "
            f"{ui_link(settings, handle.id)}"
        )
        if len(rows) != t.steps or t.failed_episodes:
            failed.append(f"SRL {source}: {len(rows)} rows for {t.steps} steps, {t}")
        # The embedded model answers in the step's JSON form by construction (structured
        # output): fewer well-formed answers is a regression. Its verified share is the
        # small model's skill, printed, never a failure.
        if source == "teacher" and well_formed < SRL_DEMO_MIN_WELL_FORMED:
            failed.append(
                f"SRL teacher: {well_formed:.0%} of answers well-formed, "
                f"below {SRL_DEMO_MIN_WELL_FORMED:.0%}"
            )
        if source == "gold_replay" and t.verified_episodes != count:
            failed.append(f"SRL gold replay verified {t.verified_episodes} of {count} tasks")
    return failed


#: The demo's decision set, as a guided intake form: the embedded model is too small to
#: extract constraints from free text reliably, and the form skips the model.
DESIGN_DEMO_FORM: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "low",
    "data_classification": "internal",
    "workload_types": ["batch"],
    "throughput": {"data_gb_per_day": 200},
    "compliance": ["gdpr"],
}


async def _run_design_example(client: Any, settings: Settings) -> list[str]:
    """One decision set through ``DesignPipeline``: the guided form, no gate (policy
    passes and there is no previous set), the template renderer's repository and the
    validators, counted passed, failed and not run apart. Every validator is required
    (Keel has no optional ones), so one that failed or did not run fails the demo with
    its reason from the stored report. Returns the checks that failed."""
    from cli.design import user
    from client.design import start_design
    from keel.demo_checks import tally_validators
    from keel.design.steps import DesignInput
    from services.up import ui_link
    from store.design import create_project, submit_decision_set

    typer.echo("9. Design pipeline on a guided intake form (DesignPipeline, as `design run`)")
    project, ds, owner = f"demo-{uuid.uuid4().hex[:8]}", "ds1", user()
    sm = sessions(settings)
    await asyncio.to_thread(create_project, sm, project, owner=owner, name="keel demo")
    await asyncio.to_thread(submit_decision_set, sm, project, ds)
    inp = DesignInput(
        project=project,
        decision_set=ds,
        requester=owner,
        intake=DESIGN_DEMO_FORM,
        require_approval=False,
    )
    started = time.monotonic()
    handle = await start_design(client, inp, task_queue=settings.task_queue)
    r = await handle.result()
    elapsed = time.monotonic() - started
    checks = ", ".join(f"{k} {v}" for k, v in r.validation.items())
    policy = r.policy.overall if r.policy else "-"
    cost = f"${r.cost.monthly_usd:,.2f}/month" if r.cost else "-"
    typer.echo(
        f"   {project}/{ds}: {r.status}, version {r.version}, "
        f"{len(r.plan.choices) if r.plan else 0} capabilities, {cost}, policy {policy}; "
        f"{r.file_count} files generated in {elapsed:.0f}s"
    )
    typer.echo(f"      validators: {checks}")
    tally = tally_validators(r.validation, await asyncio.to_thread(_validator_reasons, settings, r))
    typer.echo(f"      validators: {tally.line} (every validator the pipeline runs is required)")
    typer.echo(
        f"      `design show {project} {ds}`, `design download {project} {ds}`; "
        f"{ui_link(settings, handle.id)}"
    )
    failed: list[str] = []
    if r.status != "completed" or not r.archive_digest:
        failed.append(f"design {project}/{ds} ended {r.status}")
    failed += [f"design {project}/{ds}: {problem}" for problem in tally.problems]
    return failed


def _validator_reasons(settings: Settings, r: Any) -> dict[str, str]:
    """Each validator's summary (why it failed or did not run) from the design run's
    stored validation report; empty when the run stored none."""
    from store.artifacts import artifact_store_from_settings

    if not r.validation_digest:
        return {}
    report = artifact_store_from_settings(settings).get_json(r.validation_digest)
    return {str(x["name"]): str(x.get("summary", "")) for x in report.get("results", [])}


MRP_EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "mrp"


async def _run_mrp_examples(
    client: Any,
    settings: Settings,
    examples: Path = MRP_EXAMPLES,
    names: tuple[str, ...] = ("wordcount", "sentiment", "invoices"),
) -> list[str]:
    """The three example MRP jobs (examples/mrp) as ``MRPJob`` workflows on Ray.

    A pure example's produced values (read back from its output file) are compared with
    examples/mrp/expected/<name>.json, worked out from the inputs apart from Keel's code
    (examples/mrp/expected/derive.py); its output digests are checked against
    examples/mrp/golden.json as well, a regression check. The LLM example has no expected
    values or golden digests (a model's answers depend on the CPU llama.cpp was built
    for): how many replies had a label word is printed, every review must have a row, and
    a replay of the run, answering from the run's own LLM cache, must reproduce every
    digest. Returns the checks that failed.
    """
    from temporalio.client import WorkflowFailureError

    from client.mrp import failure_of, start_job
    from keel.demo_checks import ValueCheck, compare_invoices, compare_wordcount, sentiment_tally
    from keel.mrp.dsl import parse_job
    from keel.mrp.run import MRPJobInput, workflow_id_for
    from services.up import ui_link

    golden = json.loads((examples / "golden.json").read_text())
    failed: list[str] = []
    compare: dict[str, Callable[[Any, Any], ValueCheck]] = {
        "wordcount": lambda out, want: compare_wordcount(out["data"], want),
        "invoices": compare_invoices,
    }

    async def run(job_id: str, inp: MRPJobInput) -> Any:
        run_id = uuid.uuid4().hex[:16]
        wid = workflow_id_for(job_id, run_id)
        handle = await start_job(
            client,
            inp.model_copy(update={"run_id": run_id}),
            workflow_id=wid,
            task_queue=settings.task_queue,
        )
        try:
            return await handle.result()
        except WorkflowFailureError as err:
            kind, message = failure_of(err)
            raise RuntimeError(f"the MRP job {wid} failed: {kind}: {message}") from None

    typer.echo("7. MRP jobs (MRPJob workflows on Ray, as `mrp run` runs them)")
    for name in names:
        job = examples / f"{name}.yaml"
        text = job.read_text()
        job_id = parse_job(text, job.name).spec.job_id
        inp = MRPJobInput(job_yaml=text, source=job.name, base_dir=str(examples))
        r = await run(job_id, inp)
        if name in golden:
            ok = r.output_digests == golden[name]
            check = "matches golden.json" if ok else "DIFFERS from golden.json"
        else:
            replay = await run(job_id, MRPJobInput(replay_of=r.run_id, llm_replay_only=True))
            ok = replay.replay_matched is True and replay.output_digests == r.output_digests
            check = (
                f"replay {replay.run_id} matched every digest"
                if ok
                else f"replay {replay.run_id} DIFFERS from the run"
            )
        if not ok:
            failed.append(f"examples/mrp/{job.name}: {check}")
        values: ValueCheck | None = None
        if r.status == "succeeded" and name in compare:
            want = json.loads((examples / "expected" / f"{name}.json").read_text())
            values = compare[name](_produced_value(r), want)
            values.line += f" (examples/mrp/expected/{name}.json)"
        elif r.status == "succeeded" and name == "sentiment":
            spec = parse_job(text, job.name).spec
            values = sentiment_tally(_produced_value(r)["data"], len(spec.inputs.items or []))
        if values is not None:
            failed += [f"examples/mrp/{job.name}: {d}" for d in _first(values.differences)]
        c = r.counters
        typer.echo(
            f"   examples/mrp/{job.name}: {r.status}, {c.total} shards ({c.run} run, "
            f"{c.skipped} from checkpoints), {r.cost.units} units, "
            f"{r.cost.llm_calls} LLM calls ({r.cost.llm_cached} cached); {check}"
        )
        if values is not None:
            typer.echo(f"      {values.line}")
        typer.echo(f"      reduce {r.reduce_digest}")
        for key, digest in r.output_digests.items():
            if key.startswith("produced:") and not key.endswith(".audit.jsonl"):
                typer.echo(f"      {key.removeprefix('produced:')} {digest}")
        wid = workflow_id_for(job_id, r.run_id)
        typer.echo(
            f"      run {r.run_id}: `mrp inspect --run-id {r.run_id}`; {ui_link(settings, wid)}"
        )
    return failed


def _first(lines: list[str], most: int = 10) -> list[str]:
    """At most ``most`` of ``lines``, then one saying how many more there were."""
    more = len(lines) - most
    return lines[:most] + ([f"... and {more} more"] if more > 0 else [])


def _produced_value(r: Any) -> Any:
    """The value an MRP run produced, read back from its one data file under the run's
    output root (JSON as parsed, Parquet as a list of row dicts). The bytes must still have
    the digest the run recorded, so it is the file the golden digests speak of."""
    from keel.digest import digest_bytes

    data = [f for f in r.produced if not f.path.endswith(".audit.jsonl")]
    if len(data) != 1 or r.output_root is None:
        raise RuntimeError(f"MRP run {r.run_id}: expected one output file, got {r.produced}")
    path = Path(r.output_root) / data[0].path
    raw = path.read_bytes()
    if digest_bytes(raw) != data[0].digest:
        raise RuntimeError(f"MRP run {r.run_id}: {path} no longer has digest {data[0].digest}")
    if path.suffix == ".parquet":
        import io

        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(raw)).to_pylist()
    return json.loads(raw)


actors_app = typer.Typer(
    help="The SRL actor servers: one 'vllm serve' per GPU (docs/srl-actors.md).",
    no_args_is_help=True,
)
app.add_typer(actors_app, name="actors")
app.add_typer(gates_app, name="gates")

VLLM_MISSING = (
    "vLLM is not installed here (no `vllm` beside {python} or on PATH); install it on the "
    "GPU machine with `uv pip install vllm` (it is not a Keel extra: docs/srl-actors.md)"
)


def _find_vllm() -> str | None:
    import shutil

    beside = Path(sys.executable).parent / "vllm"
    if beside.exists():
        return str(beside)
    return shutil.which("vllm")


@actors_app.command("serve")
def actors_serve(
    config: Annotated[Path, typer.Option(help="The actors config (endpoints, GPUs, ports)")] = Path(
        "configs/vllm_actors.yaml"
    ),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command lines and start nothing")
    ] = False,
    only: Annotated[
        list[str] | None, typer.Option("--only", help="Start only this endpoint (repeatable)")
    ] = None,
    vllm: Annotated[
        str | None, typer.Option(help="The vllm executable (default: beside Python, or on PATH)")
    ] = None,
    json_out: JsonOpt = None,
) -> None:
    """Start one 'vllm serve' per endpoint of the config and keep them running until Ctrl-C.

    Each is a child process in its own process group, bound to the endpoint's
    bind_host (127.0.0.1 unless configured), on its GPU (CUDA_VISIBLE_DEVICES),
    logging to <data_dir>/logs/actors/<name>.log; one that exits is restarted after
    1, 2, 4 ... 30 s. Ctrl-C or SIGTERM stops them all by PID.
    """
    KEEL.mode(json_out)
    with KEEL.reported():
        _actors_serve(config, dry_run, only, vllm)


def _actors_serve(config: Path, dry_run: bool, only: list[str] | None, vllm: str | None) -> None:
    from keel.srl.actors import shell_line, vllm_command, vllm_env
    from services.processes import Interrupted, ManagedProcess, StopSignals, port_open
    from services.supervise import stop_all, supervise
    from store.files import load_actors_config

    cfg = load_actors_config(config)  # ActorsConfigError: a usage error
    endpoints = cfg.endpoints
    if only:
        unknown = sorted(set(only) - {e.name for e in endpoints})
        if unknown:
            KEEL.fail("usage", f"no endpoint named {', '.join(unknown)} in {config}")
        endpoints = [e for e in endpoints if e.name in only]
    exe = vllm or _find_vllm()
    if dry_run:
        for e in endpoints:
            typer.echo(shell_line(e, exe or "vllm"))
        return
    if exe is None:
        KEEL.fail("error", VLLM_MISSING.format(python=sys.executable))
    busy = [
        f"{e.name} ({e.bind_host}:{e.port})"
        for e in endpoints
        if port_open(e.port, "127.0.0.1" if e.bind_host in ("0.0.0.0", "::") else e.bind_host)
    ]
    if busy:
        KEEL.fail("error", f"ports already in use: {', '.join(busy)}")

    _setup_logging()
    logs = load_settings().data_dir / "logs" / "actors"
    procs = {
        e.name: ManagedProcess(
            f"actor {e.name}", vllm_command(e, exe), logs / f"{e.name}.log", env=vllm_env(e)
        )
        for e in endpoints
    }
    # As in ``keel up``: SIGINT, SIGTERM and SIGHUP become ``Interrupted``, held while a
    # child is spawned, so every actor started is known and stopped by its PID.
    guard = StopSignals().install()
    try:
        for e in endpoints:
            pid = procs[e.name].start()
            typer.echo(f"{e.name} pid {pid} {e.base_url} (log {logs / (e.name + '.log')})")
        typer.echo("Stop with Ctrl-C.")
        sys.stdout.flush()
        # A dead actor is drained by the pool and comes back when it answers again.
        supervise(procs, _say_err)
    except Interrupted:
        pass
    finally:
        with guard.shutting_down():
            stop_all(procs.values())
            guard.uninstall()
    typer.echo("actors stopped")


def main(argv: list[str] | None = None) -> None:
    KEEL.main(app, argv)


if __name__ == "__main__":
    main()
