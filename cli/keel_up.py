"""``keel up``'s body: the checks before a start, the services it starts in order (each
recorded before the next starts: ``services.up.UpStarts``), the supervision, and the stop
of what it started.

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
    from services.processes import StopSignals


def run_up(model: bool) -> None:
    """Start everything, say where it is, supervise it until a stop; then stop it all."""
    from services.processes import Interrupted, ManagedProcess, StopSignals
    from services.supervise import supervise
    from services.up import UpStarts, console_link, forget_state, state_file

    guard = StopSignals().install()
    settings = _settings(guard)
    up = UpStarts(settings)
    state_path = state_file(settings)
    code = 0
    try:
        try:
            worker = up.start_all(model, lambda line: typer.echo(line, err=True))
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
    from services.up import start_refused

    why = start_refused(recorded)
    if why is not None:
        guard.uninstall()
        KEEL.fail_now("error", why)


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
