"""``keel actors serve``: one ``vllm serve`` per endpoint of the actors config, supervised."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.keel_family import KEEL, _say_err, _setup_logging
from cli.toolkit import JsonOpt, load_settings

if TYPE_CHECKING:
    pass


actors_app = typer.Typer(
    help="The SRL actor servers: one 'vllm serve' per GPU (docs/srl-actors.md).",
    no_args_is_help=True,
)


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
