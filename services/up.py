"""The state of a running ``keel up`` (``<data_dir>/run/up.json``), and starting one in the
background for commands that need Keel and find none (``keel demo``, ``mrp run``, ``runllm run``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.processes import (
    ManagedProcess,
    ServiceError,
    deferred_signals,
    pid_alive,
    stop_pid,
    tail,
)

if TYPE_CHECKING:
    from keel.settings import Settings


def state_file(settings: Settings) -> Path:
    """Where ``keel up`` writes what it runs, once all of it is up."""
    return settings.data_dir / "run" / "up.json"


def starting_file(settings: Settings) -> Path:
    """Where ``keel up`` records each service it starts while it is starting, before it
    starts the next, so ``keel down`` can stop a start cut short at any point."""
    return settings.data_dir / "run" / "starting.json"


def write_state(path: Path, services: dict[str, dict[str, Any]]) -> None:
    """Replace the state file in one step: ``keel status`` and ``keel down`` read it while
    ``keel up`` rewrites it (a restarted worker's pid), and must never see half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"supervisor": os.getpid(), "services": services}, indent=2))
    os.replace(tmp, path)


def read_state(settings: Settings) -> dict[str, Any] | None:
    """The running ``keel up``'s state, or None if none runs (stale files are removed)."""
    path = state_file(settings)
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not pid_alive(int(state.get("supervisor", 0)) or -1):
        path.unlink(missing_ok=True)
        return None
    return state


def read_recorded(settings: Settings) -> dict[str, Any] | None:
    """What a ``keel up`` recorded, up or still starting, whether or not it is still
    alive (a supervisor killed with SIGKILL leaves its services and this record)."""
    for path in (state_file(settings), starting_file(settings)):
        try:
            state: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        return state
    return None


def forget_state(settings: Settings) -> None:
    """Remove both records (``keel up`` stopped everything it started)."""
    state_file(settings).unlink(missing_ok=True)
    starting_file(settings).unlink(missing_ok=True)


def ui_link(settings: Settings, workflow_id: str | None = None) -> str:
    """The Temporal Web UI page of the embedded dev server (of one workflow, when given)."""
    base = f"http://127.0.0.1:{settings.dev_server_ui_port}/namespaces/{settings.temporal_namespace}/workflows"
    if workflow_id is None:
        return base
    return f"{base}/{urllib.parse.quote(workflow_id, safe='')}"


def console_link(settings: Settings) -> str:
    """The Keel console (design sessions, approval inbox, runs) served by ``keel up``'s API."""
    return f"http://127.0.0.1:{settings.api_port}/ui"


def keel_process(command: str, log_path: Path) -> ManagedProcess:
    """``keel <command>`` (``worker``, ``api``) as a child process in its own session."""
    return ManagedProcess(command, [sys.executable, "-m", "cli.keel", command], log_path)


def start_up_in_background(
    settings: Settings,
    timeout_s: float = 300,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``keel up`` as a detached child (output in ``<data_dir>/up.log``) and wait until
    it is up. ``on_spawn`` gets the child as soon as it exists (stop signals held until
    then), so a caller interrupted during the wait can still stop it.

    Raises:
        ServiceError: it exited or did not come up within ``timeout_s``; the message ends
            with the tail of its log.
    """
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    log_path = settings.data_dir / "up.log"
    with open(log_path, "ab") as up_log, deferred_signals():
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.keel", "up"],
            stdout=up_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if on_spawn is not None:
            on_spawn(proc)
    deadline = time.monotonic() + timeout_s
    while read_state(settings) is None:
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_pid(proc.pid, 30)
            raise ServiceError(f"keel up did not start; see {log_path}:\n{tail(log_path, 40)}")
        time.sleep(0.2)
    return proc
