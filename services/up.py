"""The state of a running ``keel up`` (``<data_dir>/run/up.json``), and starting one in the
background for commands that need Keel and find none (``keel demo``, ``mrp run``, ``runllm run``).

What ``keel up``, ``keel down`` and ``keel status`` decide is here too (``cli/keel_up.py``
and ``cli/keel.py`` print): the start order and its record (:class:`UpStarts`), when a new
``keel up`` is refused (:func:`start_refused`), the stop of what one recorded
(:func:`stop_recorded`) and the status document (:func:`up_status`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from services.processes import (
    ManagedProcess,
    ServiceError,
    deferred_signals,
    pid_alive,
    pids_with_env,
    stop_pid,
    tail,
)

#: Set by ``keel up`` in its own environment before it starts anything, so every service
#: (and whatever they start) carries it; recorded as ``up_id``. ``keel down`` stops the
#: processes that carry a killed ``keel up``'s id as well as those it recorded: a SIGKILL
#: between a service's spawn and its record (nothing can hold that one) left the API
#: running once, its port bound, after ``keel down`` (tests/core/faults/test_up_interrupted.py).
UP_ID_ENV = "KEEL_UP_ID"

if TYPE_CHECKING:
    from keel.settings import Settings
    from services.processes import StopSignals


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
    record = {"supervisor": os.getpid(), "up_id": os.environ.get(UP_ID_ENV), "services": services}
    tmp.write_text(json.dumps(record, indent=2))
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


class UpStarts:
    """What one ``keel up`` started, in order, and its record: ``starting.json`` while
    it starts (each service written before the next starts), ``up.json`` once up."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.logs = settings.data_dir / "logs"
        self.started: list[Any] = []
        self.services: dict[str, dict[str, Any]] = {}
        self.record_to = starting_file(settings)
        # The id goes in the record before anything starts, and to every child by its
        # environment: what a SIGKILL leaves unrecorded is still found (stop_recorded).
        os.environ[UP_ID_ENV] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        write_state(self.record_to, self.services)

    def start(self, svc: Any, name: str, **info: Any) -> None:
        """Start ``svc``; its PID is recorded under ``name`` as it is spawned."""

        def record(pid: int) -> None:
            self.services[name] = {"pid": pid, **info}
            write_state(self.record_to, self.services)

        svc.on_spawn = record
        self.started.append(svc)
        svc.start()

    def start_all(self, model: bool, say: Callable[[str], None]) -> ManagedProcess:
        """The dev server (unless a Temporal address is set), the model server (when
        ``model`` and it can run; ``say`` tells why not), a worker and the API; returns
        the worker."""
        from services.model_server import LocalModelServer, unavailable_reason
        from services.processes import TemporalDevServer, port_open

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
                say(f"local model server not started: {reason}")
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
        with guard.deferred():
            self.record_to = state_path
            write_state(state_path, self.services)
            starting_file(self.settings).unlink(missing_ok=True)


def stop_recorded(settings: Settings, timeout: float) -> list[str] | None:
    """``keel down``: SIGTERM to the running ``keel up`` (waiting up to ``timeout``
    seconds for it to stop what it started), then stop what its record still names
    alive (a ``keel up`` that hung or was killed, or a start cut short), and forget the
    record. The names of the services stopped here; None when nothing was recorded."""
    state = read_recorded(settings)
    if state is None:
        return None
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
    # What it spawned and was killed before it could record.
    for pid in _unrecorded(state):
        if pid_alive(pid):
            stop_pid(pid)
            stopped.append(f"pid {pid} (unrecorded)")
    forget_state(settings)
    return stopped


def _unrecorded(recorded: dict[str, Any]) -> list[int]:
    """Live processes that carry the recorded ``keel up``'s id but are not in its record
    (none while that ``keel up`` still runs: it stops its own)."""
    up_id = recorded.get("up_id")
    if not up_id or pid_alive(int(recorded.get("supervisor", 0)) or -1):
        return []
    known = {int(svc["pid"]) for svc in recorded.get("services", {}).values()}
    return [p for p in pids_with_env(UP_ID_ENV, str(up_id)) if p not in known]


def start_refused(recorded: dict[str, Any]) -> str | None:
    """Why a new ``keel up`` may not start beside the one ``recorded`` (its supervisor
    still runs, or it was killed and left services running); None: it may (the record is
    stale)."""
    if pid_alive(int(recorded.get("supervisor", 0)) or -1):
        return (
            f"Keel is already running (keel up pid {recorded['supervisor']}); "
            "see `keel status`, or stop it with `keel down`."
        )
    left = [
        f"{name} pid {svc['pid']}"
        for name, svc in recorded.get("services", {}).items()
        if pid_alive(int(svc["pid"]))
    ] + [f"pid {pid} (unrecorded)" for pid in _unrecorded(recorded)]
    if left:
        return (
            f"a keel up that was killed left services running ({', '.join(left)}); "
            "stop them with `keel down`."
        )
    return None


def up_status(settings: Settings) -> dict[str, Any] | None:
    """``keel status``: ``{"state", "supervisor", "services"}`` of the recorded ``keel up``
    (``state``: ``up``, ``starting`` while its supervisor still starts services, or
    ``killed`` when it died before it was up; each service with ``running``: whether its
    PID is alive); None when nothing is recorded."""
    state = read_state(settings)
    phase = "up"
    if state is None:
        recorded = read_recorded(settings)
        if recorded is None:
            return None
        state = recorded
        phase = "starting" if pid_alive(int(recorded.get("supervisor", 0)) or -1) else "killed"
    services = {
        name: {**svc, "running": pid_alive(int(svc["pid"]))}
        for name, svc in state["services"].items()
    }
    return {"state": phase, "supervisor": state["supervisor"], "services": services}
