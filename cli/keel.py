"""``keel``: run the Keel service locally (``up``/``down``/``status``), or its parts alone.

Output and errors as in every Keel CLI (``cli/toolkit.py``): ``status``, ``ping`` and
``down`` print text on a terminal and one JSON document otherwise (``--json``/``--text``);
a failure of any command is one ``error:`` line per problem on stderr and, in JSON mode,
the envelope ``{"error": {...}}`` of family ``keel`` on stdout (``keel gates``: family
``gate``). The long-running commands (``up``, ``worker``, ``api``, ``actors serve``,
``demo``) print their progress as text whatever the mode.

Heavy imports (Temporal worker, FastAPI, LiteLLM) happen inside the commands that need
them, so ``keel --help`` and ``keel status`` start fast. The demo's steps are in
``cli/demo.py``, ``keel actors`` in ``cli/actors.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import subprocess
from typing import TYPE_CHECKING, Annotated

import typer

from activities import lazy_iri
from cli import toolkit
from cli.actors import actors_app
from cli.demo import _run_demo
from cli.gate import app as gates_app
from cli.keel_family import KEEL, _setup_logging, log
from cli.keel_up import run_up
from cli.toolkit import JsonOpt, load_settings
from keel.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Sequence


app = typer.Typer(
    help="Keel: durable workflows for AI work, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
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
    run_up(model)


@app.command()
def down(timeout: float = 30.0, json_out: JsonOpt = None) -> None:
    """Stop the services a running 'keel up' started (also those of a start cut short,
    or of a 'keel up' that was killed)."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _down(timeout)


def _down(timeout: float) -> None:
    from services.up import stop_recorded

    stopped = stop_recorded(load_settings(), timeout)
    if stopped is None:
        KEEL.emit({"was_running": False, "stopped": []}, "Keel is not running.")
        return
    KEEL.emit({"was_running": True, "stopped": stopped}, "Keel is down.")


@app.command()
def status(json_out: JsonOpt = None) -> None:
    """Show what 'keel up' runs and whether Temporal answers."""
    KEEL.mode(json_out)
    with KEEL.reported():
        _status()


def _status() -> None:
    from services.up import up_status

    doc = up_status(load_settings())
    if doc is None:
        KEEL.fail("not_running", "Keel is not running (start it with `keel up`).")
    lines = {
        "up": [],
        "starting": ["Keel is starting:"],
        "killed": ["A keel up was killed and left these (stop them with `keel down`):"],
    }[doc["state"]]
    lines.append(f"keel up pid {doc['supervisor']}")
    for name, svc in doc["services"].items():
        where = svc.get("address") or svc.get("task_queue", "")
        state = "running" if svc["running"] else "DEAD"
        lines.append(f"  {name:<9} pid {svc['pid']:<8} {state:<8} {where}")
    KEEL.emit(doc, "\n".join(lines))


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


#: The cycle collector's first threshold in ``keel worker`` (Python's default: 700).
WORKER_GC_THRESHOLD = 10_000


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
            # Young collections every WORKER_GC_THRESHOLD allocations, not Python's 700:
            # an MRP compile of 100,000 shards builds a few objects a shard, and each
            # young collection also walked those still young; compile_parsed went 4.48 ->
            # 2.89 s and the YAML parse 2.80 -> 2.08 s (bench/mrp_scale.py's job, in one
            # process). Garbage cycles wait at most that many allocations longer.
            gc.set_threshold(WORKER_GC_THRESHOLD, *gc.get_threshold()[1:])
            log.info("worker ready on task queue %r", settings.task_queue)
            if settings.metrics_port:
                log.info("metrics on http://127.0.0.1:%d/metrics", settings.metrics_port)
            await stop.wait()
    finally:
        # The CLI leaves through os._exit, which runs no atexit hook: stop the Ray node
        # that MRP windows started here (and remove its temp dir) before that, and the
        # idle operator hosts MRP calls kept warm (rather than leave them to notice).
        from activities.fanout import ray_shutdown
        from activities.mrp.host import stop_hosts

        stop_hosts()
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


app.add_typer(actors_app, name="actors")
app.add_typer(gates_app, name="gates")


def main(argv: list[str] | None = None) -> None:
    KEEL.main(app, argv)


if __name__ == "__main__":
    main()
