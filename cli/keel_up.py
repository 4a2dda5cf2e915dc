"""``keel up``'s body: the checks before a start, the services it starts in order (each
recorded before the next starts), the supervision, and the stop of what it started.

From the first line on, SIGINT, SIGTERM and SIGHUP become ``Interrupted`` (held while a
child is spawned and its PID recorded), and every exit runs the ``finally`` that stops
what was started: a start cut short leaves nothing behind.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli import toolkit
from cli.keel_family import KEEL, _say_err, _setup_logging

if TYPE_CHECKING:
    from keel.settings import Settings
    from services.processes import ManagedProcess, StopSignals


def run_up(model: bool) -> None:
    """Start everything, say where it is, supervise it until a stop; then stop it all."""
    from services.processes import Interrupted, ManagedProcess, StopSignals
    from services.supervise import supervise
    from services.up import console_link, forget_state, state_file

    guard = StopSignals().install()
    settings = _settings(guard)
    up = _Started(settings)
    state_path = state_file(settings)
    code = 0
    try:
        try:
            worker = up.start_all(model)
        except Exception as err:
            code = toolkit.report(KEEL.failure("error", f"keel up failed: {err}").error)
            return
        up.mark_up(guard, state_path)
        _say_up(settings, up.services, up.logs, console_link(settings))
        # A dead worker is what durable execution is for: its workflows wait in Temporal
        # for the next one. Without the API there is nothing to serve. (The dev server and
        # the model server are not ManagedProcess children: they are not watched here.)
        children = {s.name: s for s in up.started if isinstance(s, ManagedProcess)}
        why = supervise(children, _say_err, restart=[worker.name])
        typer.echo(f"{why}; stopping (logs in {up.logs})", err=True)
    except Interrupted as sig:
        if state_path.exists():
            typer.echo(f"{sig}: stopping", err=True)
        else:
            typer.echo(f"{sig} during start-up: stopping what was started", err=True)
            code = 128 + sig.signum
    finally:
        with guard.shutting_down():
            for svc in reversed(up.started):
                svc.stop()
            forget_state(settings)
            guard.uninstall()
        typer.echo("Keel is down." if code == 0 else "Keel is not up.", err=code != 0)
        if code:
            raise typer.Exit(code)


def _settings(guard: StopSignals) -> Settings:
    """The settings, once no other ``keel up`` runs and none left services behind (the
    record of one that stopped is forgotten). A refusal, bad settings or a signal here
    uninstall ``guard``: nothing was started."""
    from services.processes import Interrupted
    from services.up import forget_state, read_recorded

    try:
        _setup_logging()
        settings = toolkit.load_settings()
        settings.check_secrets()
        recorded = read_recorded(settings)
    except Interrupted as sig:
        guard.uninstall()
        raise typer.Exit(128 + sig.signum) from None
    except BaseException:
        guard.uninstall()  # bad settings: reported by the caller, nothing was started
        raise
    if recorded is not None:
        _refuse_if_running(guard, recorded)
        forget_state(settings)
    return settings


def _refuse_if_running(guard: StopSignals, recorded: dict[str, Any]) -> None:
    from services.processes import pid_alive

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


class _Started:
    """What this ``keel up`` started, in order, and its record: ``starting.json`` while
    it starts (each service written before the next starts), ``up.json`` once up."""

    def __init__(self, settings: Settings) -> None:
        from services.up import starting_file

        self.settings = settings
        self.logs = settings.data_dir / "logs"
        self.started: list[Any] = []
        self.services: dict[str, dict[str, Any]] = {}
        self.record_to = starting_file(settings)

    def start(self, svc: Any, name: str, **info: Any) -> None:
        """Start ``svc``; its PID is recorded under ``name`` as it is spawned."""
        from services.up import write_state

        def record(pid: int) -> None:
            self.services[name] = {"pid": pid, **info}
            write_state(self.record_to, self.services)

        svc.on_spawn = record
        self.started.append(svc)
        svc.start()

    def start_all(self, model: bool) -> ManagedProcess:
        """The dev server (unless a Temporal address is set), the model server (when
        ``model`` and it can run), a worker and the API; returns the worker."""
        from services.model_server import LocalModelServer, unavailable_reason
        from services.processes import ServiceError, TemporalDevServer, port_open
        from services.up import keel_process

        settings, logs = self.settings, self.logs
        if not settings.temporal_address:
            temporal = TemporalDevServer(
                db_file=settings.data_dir / "temporal.db",
                log_path=logs / "temporal.log",
                port=settings.dev_server_port,
                ui_port=settings.dev_server_ui_port,
                namespace=settings.temporal_namespace,
            )
            self.start(temporal, "temporal", address=temporal.address, ui=temporal.ui_url)
        if model:
            reason = unavailable_reason()
            if reason:
                typer.echo(f"local model server not started: {reason}", err=True)
            else:
                server = LocalModelServer(
                    port=settings.model_server_port, log_path=logs / "model-server.log"
                )
                self.start(server, "model", address=server.base_url)
        worker = keel_process("worker", logs / "worker.log")
        self.start(worker, "worker", task_queue=settings.task_queue)
        if port_open(settings.api_port):
            raise ServiceError(f"API port {settings.api_port} is already in use")
        api = keel_process("api", logs / "api.log")
        self.start(api, "api", address=f"http://127.0.0.1:{settings.api_port}")
        api.wait_port(settings.api_port, 60)
        return worker

    def mark_up(self, guard: StopSignals, state_path: Path) -> None:
        """Up: the record moves to ``up.json`` in one step (signals held meanwhile)."""
        from services.up import starting_file, write_state

        with guard.deferred():
            self.record_to = state_path
            write_state(state_path, self.services)
            starting_file(self.settings).unlink(missing_ok=True)


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
