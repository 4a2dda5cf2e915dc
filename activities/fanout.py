"""Ray fan-out for any family: one local Ray cluster per process and pools of ready actors.

Nothing here knows what runs on an actor: a family passes its actor class (any class with a
``ready()`` method that returns the actor's PID) and the calls it makes on it.

- :func:`ray_init` starts the process's cluster once: loopback only (every Ray server binds
  127.0.0.1), no dashboard UI, ``num_cpus`` logical CPUs, a short temp dir under /tmp named
  by its owner's PID, and ``PYTHONPATH`` carrying the repository so Ray workers import our
  packages and operator code. :func:`ray_shutdown` stops it and reaps every process it
  started, even those Ray itself leaves behind; a worker process that dies takes its Ray
  processes with it (Ray ties them to the driver's life), and the next start removes the
  temp dirs of owners that are gone. Two processes of this host never start their clusters
  at the same moment (an flock on ``/tmp/keel-ray-start.lock``): Ray gives a starting node
  a fixed 30 s to register with its GCS, and two starts at once on a small, busy machine
  missed it ("The current node timed out during startup"; seen with two test workers);
  a start that misses it is stopped and tried once more.
- With ``KEEL_RAY_ADDRESS`` set, :func:`ray_init` joins that existing cluster instead
  (:func:`join_arguments`): the repository's code goes to its nodes as the job's Ray
  ``working_dir`` (no shared filesystem), and :func:`ray_shutdown` only disconnects.
- :class:`ActorPool` keeps at most ``size`` actors of one class (each holds one CPU),
  started and ready before they get work, so a caller's timeout measures the work and not
  a process start. An actor whose call timed out or was cancelled is :meth:`ActorPool.discard`-ed
  (killed), never reused.
- :func:`as_future` and :func:`gather` await object refs from asyncio, the latter with one
  deadline for all of them.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil

__all__ = [
    "ActorPool",
    "PooledActor",
    "RayUnreachable",
    "as_future",
    "configured_address",
    "gather",
    "gcs_unreachable",
    "join_arguments",
    "kill",
    "local_path",
    "on_loopback",
    "on_shutdown",
    "ray_init",
    "ray_shutdown",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
#: First on the PYTHONPATH of every process of the local cluster: its sitecustomize defers
#: the IRI grammar that ``import ray`` builds (activities/ray_site/sitecustomize.py).
RAY_SITE = Path(__file__).resolve().parent / "ray_site"
# Ray must treat this host as a single loopback node: with this set before Ray reads its
# constants, every Ray server (GCS, raylet, workers, agents) binds 127.0.0.1 only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

_ray_lock = threading.Lock()
_ray_state: dict[str, Any] = {"owned": False, "joined": False, "temp_dir": None, "num_cpus": 0}
_remotes: dict[tuple[type, int], Any] = {}
_shutdown_hooks: list[Callable[[], None]] = []

_OWNER_FILE = "keel-owner.pid"
_START_LOCK = Path("/tmp/keel-ray-start.lock")
_START_ATTEMPTS = 2
#: How long the local raylet waits for its runtime-env agent to answer before it exits
#: (Ray's ``agent_register_timeout_ms``, 30 s by default). The agent is a Python process
#: of its own; on a loaded 2-core host its start took longer than 30 s, and the raylet,
#: and every shard on it, went with it ("Runtime Env Agent timed out in 30000ms"; seen
#: with the agents' start held 40 s, tests/support/ray_cluster.py). The agent shares the
#: raylet's fate, so a longer wait only matters while it starts.
AGENT_WAIT_MS = 120_000


@contextlib.contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Hold the host-wide Ray start lock (released when the process dies, whatever way)."""
    import fcntl

    try:
        fd = os.open(_START_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # another user's lock file: start unserialised, as before
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def _sweep_stale_temp_dirs() -> None:
    """Remove Ray temp dirs left by Keel processes that are gone.

    A worker stopped by a signal often never reaches :func:`ray_shutdown`: Ray's own
    SIGTERM handling ends the process once its raylet is gone, and SIGKILL runs nothing.
    Each dir names its owner's PID, so the next Ray start here removes what they left.
    """
    for d in Path("/tmp").glob("keel-ray-*"):
        try:
            owner = int((d / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if owner != os.getpid() and not _alive(owner):
            shutil.rmtree(d, ignore_errors=True)


# Joining a cluster you already run (KEEL_RAY_ADDRESS): Keel's code reaches its nodes as
# the job's Ray ``working_dir`` (the repository less these), never through a shared
# filesystem; Ray makes it each worker's cwd and puts it first on sys.path.
RAY_SHIP_EXCLUDES = [
    ".git",
    ".venv",
    ".tools",
    ".keel",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "__pycache__",
    "*.pyc",
    "docs",
    "bench",
    "node_modules",
]
# Set on the joined cluster's workers: the repository root of the process that joined,
# so an operator folder it names is found under the shipped copy (:func:`local_path`).
DRIVER_ROOT_ENV = "KEEL_RAY_DRIVER_ROOT"


def configured_address() -> str | None:
    """``KEEL_RAY_ADDRESS`` as :class:`keel.settings.Settings` reads it (None: local Ray)."""
    from keel.settings import Settings

    return Settings().ray_address


def join_arguments(address: str) -> dict[str, Any]:
    """The ``ray.init`` keyword arguments with which a worker joins the cluster at
    ``address``: Keel's namespace, no logs echoed, and a runtime_env that ships the
    repository's code (packages, operators, configs) as ``working_dir``."""
    return {
        "address": address,
        "namespace": "keel",
        "log_to_driver": False,
        "configure_logging": False,
        "runtime_env": {
            "working_dir": str(REPO_ROOT),
            "excludes": list(RAY_SHIP_EXCLUDES),
            "env_vars": {
                DRIVER_ROOT_ENV: str(REPO_ROOT),
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            },
        },
    }


def local_path(path: str) -> str:
    """``path`` as this process can read it: on a joined cluster's worker a path under the
    joining process's repository (an operator folder) is mapped to the shipped copy of
    that repository; anywhere else, and for paths outside it, ``path`` itself."""
    driver_root = os.environ.get(DRIVER_ROOT_ENV)
    if not driver_root or driver_root == str(REPO_ROOT):
        return path
    try:
        rel = Path(path).relative_to(driver_root)
    except ValueError:
        return path
    return str(REPO_ROOT / rel)


def on_loopback(address: str) -> bool:
    """Whether a ``KEEL_RAY_ADDRESS`` names a cluster on this host's loopback
    (``127.0.0.1:6379``, ``localhost:6379``, ``[::1]:6379``)."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    return host == "localhost" or host == "::1" or host.startswith("127.")


class RayUnreachable(RuntimeError):
    """Nothing answers at ``KEEL_RAY_ADDRESS``: Ray's own ``ray.init`` would retry there
    for minutes before it failed."""


#: How long :func:`gcs_unreachable` waits for the cluster's address to accept a connection.
PROBE_TIMEOUT_S = 5.0


def gcs_unreachable(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why nothing accepts a TCP connection at a cluster address's host and port (None:
    something does, or the address names no port to try, such as ``auto``)."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def ray_init(num_cpus: int, address: str | None = None) -> None:
    """Connect this process to Ray once (no-op when Ray is already up).

    With ``address`` (default: ``KEEL_RAY_ADDRESS``), join that existing cluster
    (:func:`join_arguments`); Keel never stops a cluster it joined. Without, start the
    process's local Ray: loopback only (see the module docstring), no dashboard UI,
    ``num_cpus`` logical CPUs (at least 1), worker logs kept in the session dir rather
    than echoed to this process.
    """
    import ray
    from ray._private import ray_constants

    with _ray_lock:
        if ray.is_initialized():
            return
        address = address or configured_address()
        if address:
            # A cluster's nodes are found by their own addresses; a cluster on this
            # host's loopback (``127.0.0.1:port``) stays there: Ray would otherwise
            # rewrite the address to the host's network IP, where such a cluster is not.
            ray_constants.ENABLE_RAY_CLUSTER = not on_loopback(address)
            why = gcs_unreachable(address)
            if why is not None:
                raise RayUnreachable(
                    f"no Ray cluster answers at KEEL_RAY_ADDRESS={address} ({why}): start "
                    "it, fix the address, or unset KEEL_RAY_ADDRESS for a local Ray"
                )
            ray.init(**join_arguments(address))
            _ray_state.update(owned=False, joined=True, temp_dir=None, num_cpus=0)
            _remotes.clear()
            atexit.register(ray_shutdown)
            return
        # The env var above covers processes Ray starts; this covers a Ray imported earlier.
        ray_constants.ENABLE_RAY_CLUSTER = False
        with _one_start_at_a_time():
            _start_cluster(num_cpus)


def _start_cluster(num_cpus: int) -> None:
    """Start this process's local cluster (the caller holds both locks)."""
    import ray

    _sweep_stale_temp_dirs()
    temp_dir = tempfile.mkdtemp(prefix="keel-ray-", dir="/tmp")
    Path(temp_dir, _OWNER_FILE).write_text(str(os.getpid()))
    inherited = os.environ.get("PYTHONPATH", "")
    pythonpath = os.pathsep.join(p for p in [str(RAY_SITE), str(REPO_ROOT), inherited] if p)
    for attempt in range(1, _START_ATTEMPTS + 1):
        try:
            # The agents the raylet starts inherit this process's environment, the workers
            # get the runtime_env's too: both start with RAY_SITE first on the path.
            with _environ(PYTHONPATH=pythonpath, RAY_agent_register_timeout_ms=str(AGENT_WAIT_MS)):
                ray.init(
                    num_cpus=max(1, num_cpus),
                    include_dashboard=False,
                    log_to_driver=False,
                    configure_logging=False,
                    namespace="keel",
                    _temp_dir=temp_dir,
                    # No idle workers started ahead: shards run on actors and tasks with
                    # the job's runtime_env, which never took one of those (two per
                    # cluster, 2 s of CPU each, measured).
                    _system_config={"prestart_worker_first_driver": False},
                    runtime_env={
                        "env_vars": {
                            "PYTHONPATH": pythonpath,
                            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                        }
                    },
                )
            break
        except Exception as exc:
            # A failed start leaves its GCS, monitors and agents running, and Ray no
            # longer knows them: stop every process of ours that names its temp dir.
            procs = _ray_processes() | _started_in(temp_dir)
            with contextlib.suppress(Exception):
                ray.shutdown()
            procs |= _started_in(temp_dir)
            _reap(procs)
            # Ray gives a starting node a fixed 30 s to register with its GCS; on a busy
            # machine it can miss that: then try once more.
            if "timed out during startup" not in str(exc) or attempt == _START_ATTEMPTS:
                shutil.rmtree(temp_dir, ignore_errors=True)
                raise
    _ray_state.update(owned=True, temp_dir=temp_dir, num_cpus=max(1, num_cpus))
    _remotes.clear()
    atexit.register(ray_shutdown)


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored after (for what starts meanwhile)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _started_in(temp_dir: str) -> set[psutil.Process]:
    """This process's descendants whose command line names ``temp_dir``."""
    found: set[psutil.Process] = set()
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if any(temp_dir in arg for arg in child.cmdline()):
                found.add(child)
    return found


def on_shutdown(hook: Callable[[], None]) -> None:
    """Call ``hook`` (once per registration) after each :func:`ray_shutdown` of this
    process's cluster: a pool forgets its actors there."""
    with _ray_lock:
        if hook not in _shutdown_hooks:
            _shutdown_hooks.append(hook)


def _ray_processes() -> set[psutil.Process]:
    """The processes of the Ray node this process started (GCS, raylet, monitors, as Ray
    lists them) and everything below them (agents, workers), each held by its identity
    (PID and start time), so that a process that ends meanwhile is never mistaken for
    one that takes its PID later."""
    import ray

    roots: list[int] = []
    with contextlib.suppress(Exception):
        node: Any = ray._private.worker._global_node
        for infos in node.all_processes.values():
            roots.extend(info.process.pid for info in infos if info.process is not None)
    found: set[psutil.Process] = set()
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            found.add(root)
            found.update(root.children(recursive=True))
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _running(proc: psutil.Process) -> bool:
    """Whether ``proc`` is still the process found and has not exited (a zombie, dead but
    not yet reaped, has)."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _reap(procs: set[psutil.Process], timeout_s: float = 5.0) -> None:
    """Wait for ``procs`` to exit; SIGTERM, then SIGKILL, whatever Ray left behind.

    ``ray.shutdown()`` stops its processes, but an agent that was still starting can
    outlive its raylet; those processes were found as ours before the shutdown. psutil
    signals each only while it is still the process found (same PID, same start time),
    never one that took the PID of a process that ended meanwhile; those that are this
    process's own children are reaped (Ray dropped its handles on them).
    """
    left = _wait_gone(set(procs), timeout_s)
    for stop in (psutil.Process.terminate, psutil.Process.kill):
        for proc in left:
            with contextlib.suppress(psutil.Error):
                stop(proc)
        left = _wait_gone(left, 3.0)


def _wait_gone(procs: set[psutil.Process], timeout_s: float) -> set[psutil.Process]:
    """Those of ``procs`` still running after at most ``timeout_s`` (none: at once)."""
    deadline = time.monotonic() + timeout_s
    while procs:
        alive = {p for p in procs if _running(p)}
        # Reaps those of our children found exited: after the check, so that one which
        # dies between a reap and the check is not left a zombie (a clean-clone run
        # found one so, killed but never reaped).
        psutil.wait_procs(procs - alive, timeout=0)
        procs = alive
        if not procs or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return procs


def ray_shutdown() -> None:
    """Stop the Ray cluster this process started (if any), make sure none of its
    processes is left, and remove its temp dir."""
    with _ray_lock:
        if _ray_state.get("joined"):
            # A cluster Keel joined is not ours to stop: only disconnect.
            import ray

            with contextlib.suppress(Exception):
                ray.shutdown()
            _ray_state.update(joined=False)
            _remotes.clear()
            hooks = list(_shutdown_hooks)
            for hook in hooks:
                hook()
            return
        if not _ray_state["owned"]:
            return
        import ray

        procs = _ray_processes()
        with contextlib.suppress(Exception):
            ray.shutdown()
        _reap(procs)
        hooks = list(_shutdown_hooks)
        temp_dir = _ray_state["temp_dir"]
        _ray_state.update(owned=False, temp_dir=None, num_cpus=0)
        _remotes.clear()
    for hook in hooks:
        hook()
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)


def _remote_class(actor_cls: type, num_cpus: int) -> Any:
    """``actor_cls`` as a Ray actor class (no restarts, no task retries: the caller owns
    retries), made once per cluster."""
    import ray

    with _ray_lock:
        remote = _remotes.get((actor_cls, num_cpus))
        if remote is None:
            remote = ray.remote(num_cpus=num_cpus, max_restarts=0, max_task_retries=0)(actor_cls)
            _remotes[(actor_cls, num_cpus)] = remote
        return remote


def as_future(ref: Any) -> asyncio.Future[Any]:
    """An asyncio future for a Ray object ref (of this event loop)."""
    return asyncio.wrap_future(ref.future())


async def gather(refs: Sequence[Any], timeout_s: float | None = None) -> list[Any]:
    """The results of ``refs`` in order; ``TimeoutError`` when they are not all done within
    ``timeout_s``. Refs still running then are left to their actors (kill those with
    :meth:`ActorPool.discard` to stop them)."""
    futs = [as_future(r) for r in refs]
    try:
        return list(await asyncio.wait_for(asyncio.gather(*futs), timeout_s))
    except BaseException:
        for fut in futs:
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())
        raise


def kill(actor: Any, futs: Sequence[asyncio.Future[Any]] = ()) -> None:
    """Kill ``actor`` (a handle); ``futs`` are its calls, which fail once it is gone and
    which nobody awaits any more."""
    import ray

    for fut in futs:
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


class PooledActor:
    """An actor of a pool, and the keys of what its caller has sent it already."""

    __slots__ = ("contexts", "handle")

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.contexts: set[str] = set()


class ActorPool:
    """At most ``size`` ready actors of ``actor_cls`` (one CPU each) on this process's
    cluster, started on demand (:func:`ray_init` with ``size`` CPUs on first use).

    Thread-safe: windows of one worker share a pool across event loops.
    """

    def __init__(self, actor_cls: type, size: int) -> None:
        self.actor_cls = actor_cls
        self.size = max(1, size)
        self._idle: list[PooledActor] = []
        self._actors = 0  # idle + busy; never more than size
        self._lock = threading.Lock()
        on_shutdown(self.drop)

    def _remote(self) -> Any:
        ray_init(self.size)
        return _remote_class(self.actor_cls, 1)

    async def acquire(self) -> PooledActor:
        """An idle actor, a new one while fewer than ``size`` exist, else wait for one."""
        while True:
            with self._lock:
                if self._idle:
                    return self._idle.pop()
                create = self._actors < self.size
                if create:
                    self._actors += 1
            if create:
                break
            await asyncio.sleep(0.01)
        try:
            cls = await asyncio.to_thread(self._remote)
            handle = cls.remote()
            await as_future(handle.ready.remote())  # no timeout: a process start is not work
        except BaseException:
            with self._lock:
                self._actors -= 1
            raise
        return PooledActor(handle)

    def release(self, actor: PooledActor) -> None:
        """Give a healthy actor back for the next caller."""
        with self._lock:
            self._idle.append(actor)

    def discard(self, actor: PooledActor, futs: Sequence[asyncio.Future[Any]] = ()) -> None:
        """Kill an actor whose call timed out, was cancelled or failed; ``futs`` are its
        calls in flight."""
        kill(actor.handle, futs)
        with self._lock:
            self._actors -= 1

    def drop(self) -> None:
        """Forget every actor (the cluster is gone)."""
        with self._lock:
            self._idle.clear()
            self._actors = 0
