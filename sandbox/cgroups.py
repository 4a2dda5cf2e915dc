"""Memory and process limits on the jail as a whole, through nsjail's cgroup support.

RLIMIT_AS and RLIMIT_NPROC bound each process; they do not bound the jail: three
processes each under RLIMIT_AS together use three times the limit, and memfd or tmpfs
pages are in no process's address space at all. A memory cgroup counts every page the
jail's processes charge (anonymous memory, memfds, its tmpfs files), and a pids cgroup
counts every task.

nsjail makes one child cgroup per run (``NSJAIL.<pid>``) under a parent that must exist;
this module makes that parent once per process:

* cgroup v1 (``/sys/fs/cgroup/memory`` and ``/sys/fs/cgroup/pids`` mounted): a
  ``keel-sandbox`` directory in each hierarchy;
* cgroup v2 (``/sys/fs/cgroup`` is cgroup2): a ``keel-sandbox`` directory with the
  memory and pids controllers enabled for its children.

``jail.cgroups`` decides what happens when that is impossible (see ``JailSettings``).
"""

from __future__ import annotations

import logging
import os
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
    """Where nsjail puts each run's cgroup."""

    version: int
    memory_mount: Path
    pids_mount: Path
    #: v1 only: the memory controller offers memory+swap (``memory.memsw.*``).
    memsw: bool = False

    def nsjail_args(self, limits: SandboxLimits) -> list[str]:
        """The nsjail flags that bound one run by ``limits``."""
        mem = str(limits.memory_mb * 1024 * 1024)
        pids = str(limits.max_processes)
        if self.version == 2:
            return [
                "--use_cgroupv2",
                "--cgroupv2_mount", str(self.memory_mount),
                "--cgroup_mem_max", mem,
                # No swap: memory past the limit must stop the jail, not page out.
                "--cgroup_mem_swap_max", "0",
                "--cgroup_pids_max", pids,
            ]  # fmt: skip
        args = [
            "--cgroup_mem_mount", str(self.memory_mount),
            "--cgroup_mem_parent", PARENT,
            "--cgroup_mem_max", mem,
            "--cgroup_pids_mount", str(self.pids_mount),
            "--cgroup_pids_parent", PARENT,
            "--cgroup_pids_max", pids,
        ]  # fmt: skip
        if self.memsw:
            args += ["--cgroup_mem_memsw_max", mem]
        return args


def _setup_v1(root: Path) -> CgroupSetup:
    memory, pids = root / "memory", root / "pids"
    for hierarchy in (memory, pids):
        if not (hierarchy / "cgroup.procs").is_file():
            raise OSError(f"no cgroup v1 hierarchy at {hierarchy}")
        (hierarchy / PARENT).mkdir(mode=0o755, exist_ok=True)
    return CgroupSetup(
        version=1,
        memory_mount=memory,
        pids_mount=pids,
        memsw=(memory / PARENT / "memory.memsw.limit_in_bytes").is_file(),
    )


def _enable_controllers(cgroup: Path, wanted: set[str]) -> None:
    enabled = set((cgroup / "cgroup.subtree_control").read_text().split())
    missing = wanted - enabled
    if missing:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


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
