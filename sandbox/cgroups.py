"""Memory and process limits on the jail as a whole, through nsjail's cgroup support.

RLIMIT_AS and RLIMIT_NPROC bound each process; they do not bound the jail: three
processes each under RLIMIT_AS together use three times the limit, and memfd or tmpfs
pages are in no process's address space at all. A memory cgroup counts every page the
jail's processes charge (anonymous memory, memfds, its tmpfs files), and a pids cgroup
counts every task.

Each run gets its own cgroup holding the limits (``RunCgroup``), and nsjail puts the jail
in a child of it (``NSJAIL.<pid>``). The parent of the run cgroups is made once per
process:

* cgroup v1 (``/sys/fs/cgroup/memory`` and ``/sys/fs/cgroup/pids`` mounted): a
  ``keel-sandbox`` directory in each hierarchy;
* cgroup v2 (``/sys/fs/cgroup`` is cgroup2): a ``keel-sandbox`` directory with the
  memory and pids controllers enabled for its children.

``jail.cgroups`` decides what happens when that is impossible (see ``JailSettings``).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import SandboxUnavailable
from sandbox.models import JailSettings, SandboxLimits

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
PARENT = "keel-sandbox"
_ready: dict[str, CgroupSetup | None] = {}


@dataclass(frozen=True)
class CgroupSetup:
    """Where the jails' cgroups live on this host."""

    version: int
    #: v1: the memory and pids hierarchies; v2: both are the ``keel-sandbox`` cgroup.
    memory_mount: Path
    pids_mount: Path
    #: v1: the parent of the run cgroups in each hierarchy, relative to its mount: a
    #: ``keel-sandbox`` child of this process's own cgroup, so the jails stay inside
    #: whatever limits the host put on the worker.
    memory_parent: str = ""
    pids_parent: str = ""
    #: v1 only: the memory controller offers memory+swap (``memory.memsw.*``).
    memsw: bool = False

    @property
    def run_parents(self) -> list[Path]:
        """The directories that hold the run cgroups."""
        if self.version == 2:
            return [self.memory_mount]
        return [self.memory_mount / self.memory_parent, self.pids_mount / self.pids_parent]

    def prime(self) -> None:
        """Write this thread's id into the pids cgroup it is already in (a no-op move).

        Moving a task between cgroups takes a lock whose first taking waits for an RCU
        grace period (about 10 ms here) and stays cheap for a grace period after. nsjail
        moves the jail into its cgroup once it has started; a no-op move made from a
        thread while the run directory is prepared and nsjail starts pays that wait in
        parallel instead of on the run's critical path. Only cgroup v1, and only ever an
        optimisation: any failure is ignored.
        """
        if self.version != 1:
            return
        try:
            tasks = self.pids_mount / _own_cgroup("pids", "thread-self") / "tasks"
            tasks.write_text(str(threading.get_native_id()))
        except (OSError, ValueError):
            pass

    def for_run(self, name: str, limits: SandboxLimits) -> RunCgroup:
        """Make the cgroup of one run (``name`` unique on the host); see ``RunCgroup``."""
        return RunCgroup(self, name, limits)


class RunCgroup:
    """One run's own cgroup, holding the limits; nsjail puts the jail in a child of it.

    The limit sits on this cgroup rather than only on nsjail's ``NSJAIL.<pid>`` child
    (which gets the limit plus 1 MiB, so it never binds first) because nsjail removes its
    child when the jail ends: the counters here survive, and say whether the jail ran
    into its memory limit. A jail whose nsjail was killed leaves its child behind;
    ``finish`` removes both.
    """

    def __init__(self, setup: CgroupSetup, name: str, limits: SandboxLimits) -> None:
        self.setup = setup
        self.name = name
        self.limits = limits
        mem = limits.memory_mb * 1024 * 1024
        self.dirs = [parent / name for parent in setup.run_parents]
        try:
            for d in self.dirs:
                d.mkdir(mode=0o755, exist_ok=True)
            mdir = self.dirs[0]
            if setup.version == 2:
                _enable_controllers(mdir, {"memory", "pids"})
                (mdir / "memory.max").write_text(str(mem))
                (mdir / "memory.swap.max").write_text("0")
                (mdir / "pids.max").write_text(str(limits.max_processes))
            else:
                (mdir / "memory.limit_in_bytes").write_text(str(mem))
                if setup.memsw:
                    (mdir / "memory.memsw.limit_in_bytes").write_text(str(mem))
                (self.dirs[1] / "pids.max").write_text(str(limits.max_processes))
        except OSError as exc:
            self.finish()
            raise SandboxUnavailable(f"cannot make the run's cgroup {name}: {exc}") from exc

    def nsjail_args(self) -> list[str]:
        """The nsjail flags that put the jail in a child of this cgroup."""
        # Above ours, so that the limit set on this cgroup is the one that binds.
        mem = str((self.limits.memory_mb + 1) * 1024 * 1024)
        pids = str(self.limits.max_processes)
        if self.setup.version == 2:
            return [
                "--use_cgroupv2",
                "--cgroupv2_mount", str(self.dirs[0]),
                "--cgroup_mem_max", mem,
                # No swap: memory past the limit must stop the jail, not page out.
                "--cgroup_mem_swap_max", "0",
                "--cgroup_pids_max", pids,
            ]  # fmt: skip
        args = [
            "--cgroup_mem_mount", str(self.setup.memory_mount),
            "--cgroup_mem_parent", f"{self.setup.memory_parent}/{self.name}",
            "--cgroup_mem_max", mem,
            "--cgroup_pids_mount", str(self.setup.pids_mount),
            "--cgroup_pids_parent", f"{self.setup.pids_parent}/{self.name}",
            "--cgroup_pids_max", pids,
        ]  # fmt: skip
        if self.setup.memsw:
            args += ["--cgroup_mem_memsw_max", mem]
        return args

    def memory_limit_hit(self) -> bool:
        """Whether the jail ran into its memory limit (an allocation failed or was reclaimed for)."""
        mdir = self.dirs[0]
        try:
            if self.setup.version == 2:
                events = dict(
                    line.split() for line in (mdir / "memory.events").read_text().splitlines()
                )
                return int(events.get("max", 0)) > 0 or int(events.get("oom_kill", 0)) > 0
            # The peak, not failcnt: recent kernels keep failcnt only on the cgroup whose
            # own counter refused a charge, and with memory+swap accounting that is the
            # memsw counter; the peak is kept on every level and reaches the limit.
            peak = int((mdir / "memory.max_usage_in_bytes").read_text())
            return peak >= self.limits.memory_mb * 1024 * 1024
        except (OSError, ValueError):
            return False

    def finish(self) -> None:
        """Remove the run's cgroups (nsjail's leftover children first); safe to call twice."""
        for d in self.dirs:
            _remove_cgroup(d)


def _remove_cgroup(path: Path) -> None:
    """rmdir a cgroup and its child cgroups, SIGKILLing what still runs in them.

    Only a run's jail runs there, and by the time a run's cgroup is removed nsjail has
    exited (or its owner has died): what is left is a jailed program that outlived an
    nsjail SIGKILLed on its own before the program armed its own death signal. Tasks of
    a killed jail may take a moment to go.
    """
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            _remove_cgroup(child)
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                break
            _kill_tasks(path)
            time.sleep(0.02)
    log.warning("could not remove sandbox cgroup %s", path)


def _kill_tasks(path: Path) -> None:
    """SIGKILL every process in the cgroup at ``path`` (read from it just before)."""
    try:
        pids = [int(line) for line in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


_OWNER_RE = re.compile(r"^(?:run-|NSJAIL\.)(\d+)")


def _owner_alive(name: str) -> bool:
    """Whether the process named in a run cgroup (``run-<pid>-...``, ``NSJAIL.<pid>``) lives."""
    m = _OWNER_RE.match(name)
    if not m:
        return True  # not ours to remove
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(setup: CgroupSetup, alive: Callable[[str], bool] = _owner_alive) -> None:
    """Remove run cgroups left by processes that died mid-run (a SIGKILLed worker)."""
    for parent in setup.run_parents:
        for child in parent.iterdir():
            if child.is_dir() and not alive(child.name):
                _remove_cgroup(child)


def _own_cgroup(controller: str, who: str = "self") -> str:
    """This process's (``thread-self``: thread's) v1 cgroup of ``controller``."""
    for line in Path(f"/proc/{who}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path.strip("/")
    return ""


def _setup_v1(root: Path) -> CgroupSetup:
    memory, pids = root / "memory", root / "pids"
    parents = []
    for hierarchy in (memory, pids):
        if not (hierarchy / "cgroup.procs").is_file():
            raise OSError(f"no cgroup v1 hierarchy at {hierarchy}")
        rel = "/".join(p for p in (_own_cgroup(hierarchy.name), PARENT) if p)
        (hierarchy / rel).mkdir(mode=0o755, parents=True, exist_ok=True)
        parents.append(rel)
    return CgroupSetup(
        version=1,
        memory_mount=memory,
        pids_mount=pids,
        memory_parent=parents[0],
        pids_parent=parents[1],
        memsw=(memory / parents[0] / "memory.memsw.limit_in_bytes").is_file(),
    )


def _enable_controllers(cgroup: Path, wanted: set[str]) -> None:
    enabled = set((cgroup / "cgroup.subtree_control").read_text().split())
    missing = wanted - enabled
    if missing:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in sorted(missing)))


def _setup_v2(root: Path) -> CgroupSetup:
    wanted = {"memory", "pids"}
    available = set((root / "cgroup.controllers").read_text().split())
    if not wanted <= available:
        raise OSError(f"{root} does not offer the {sorted(wanted - available)} controller(s)")
    parent = root / PARENT
    _enable_controllers(root, wanted)
    parent.mkdir(mode=0o755, exist_ok=True)
    # nsjail's per-run cgroups are children of ``parent``, which holds no process, so
    # enabling the controllers for them cannot clash with the no-internal-process rule.
    _enable_controllers(parent, wanted)
    return CgroupSetup(version=2, memory_mount=parent, pids_mount=parent)


def _detect(root: Path) -> CgroupSetup:
    if (root / "memory" / "cgroup.procs").is_file():
        return _setup_v1(root)
    if (root / "cgroup.controllers").is_file():
        return _setup_v2(root)
    raise OSError(f"no cgroup v1 memory hierarchy or cgroup v2 under {root}")


def cgroup_setup(settings: JailSettings, root: Path = CGROUP_ROOT) -> CgroupSetup | None:
    """The cgroup parent for jails, made once per process; None when runs go without.

    ``jail.cgroups``: ``never`` gives None; ``always`` raises ``SandboxUnavailable``
    when the parent cannot be made; ``auto`` does the same for a root host process (nsjail
    then runs as root, and the jail's resources are charged to root) and, for any other
    user, logs a warning once and gives None (per-process rlimits only).
    """
    mode = settings.cgroups
    if mode == "never":
        return None
    key = f"{mode}:{root}"
    if key in _ready:
        return _ready[key]
    try:
        setup: CgroupSetup | None = _detect(root)
        if setup is not None:
            sweep_stale(setup)
    except OSError as exc:
        if mode == "always" or os.geteuid() == 0:
            raise SandboxUnavailable(
                f"cannot set cgroup memory and pids limits for the jail ({exc}); without "
                "them a run's total memory is unbounded. Mount the cgroup v1 memory and "
                "pids controllers or cgroup v2, or set jail.cgroups: never in "
                "configs/sandbox.yaml to accept per-process limits only"
            ) from exc
        log.warning(
            "sandbox runs without cgroup limits (%s): memory_mb and max_processes bound "
            "each process, not the jail as a whole",
            exc,
        )
        setup = None
    _ready[key] = setup
    return setup
