"""Sandbox escapes are tests (STYLE.md habit 12): every run here uses the real nsjail.

Each test tries something a hostile program would try and checks that the jail stops
it, or that the host refuses before anything runs. Limits are kept small so the file
stays fast.
"""

from __future__ import annotations

import ast
import asyncio
import ctypes
import errno
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from keel.settings import Settings
from sandbox import (
    AstGrepAction,
    SandboxConfig,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    SandboxUnavailable,
    apply_astgrep,
    check_parses_async,
    run,
    run_async,
    run_python_block,
    run_python_block_async,
)
from sandbox.cgroups import CgroupSetup, RunCgroup, cgroup_setup
from sandbox.jail import find_nsjail
from sandbox.models import JailSettings, PythonSettings, config_for
from sandbox.python_block import python_runtime

pytestmark = pytest.mark.timeout(60)

SMALL = SandboxLimits(
    wall_time_s=5,
    cpu_time_s=2,
    memory_mb=256,
    max_processes=16,
    max_file_size_mb=1,
    max_output_bytes=64 * 1024,
    tmpfs_size_mb=2,
    workspace_size_mb=4,
)


def py(code: str, limits: SandboxLimits = SMALL) -> SandboxResult:
    """Run a Python snippet (as a plain program, not a block) in the jail."""
    rt = python_runtime()
    return run([rt.executable, "-I", "-c", textwrap.dedent(code)], binds=rt.binds, limits=limits)


@pytest.fixture
def open_base_dir() -> Iterator[Path]:
    """A base dir the jail can traverse (pytest's tmp_path sits under a 0700 dir)."""
    d = Path(tempfile.mkdtemp(prefix="keel-sandbox-test-"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        shutil.rmtree(d)


def find_cgroups() -> CgroupSetup | None:
    """This host's cgroup setup for jails, None where the jail runs without."""
    try:
        return cgroup_setup(JailSettings())
    except SandboxUnavailable:
        return None


def _our_processes(marker: str) -> list[int]:
    """PIDs on the host whose command line carries ``marker`` (read-only look at /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(entry))
    return pids


# --- network -------------------------------------------------------------------------


def test_network_blocked_loopback_external_and_dns() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.setblocking(False)
        port = server.getsockname()[1]
        r = py(
            f"""
            import socket
            for addr in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                try:
                    socket.create_connection(addr, timeout=2).close()
                    print("CONNECTED", addr)
                except OSError as e:
                    print("refused", addr, type(e).__name__)
            try:
                socket.getaddrinfo("example.com", 80)
                print("RESOLVED")
            except OSError as e:
                print("no dns", type(e).__name__)
            """
        )
        # The host's server must never have seen a connection from the jail.
        with pytest.raises(BlockingIOError):
            server.accept()
    assert r.exit_code == 0, r.stderr
    assert "CONNECTED" not in r.stdout and "RESOLVED" not in r.stdout
    assert r.stdout.count("refused") == 3 and "no dns" in r.stdout


def test_only_loopback_interface() -> None:
    r = run(["/bin/cat", "/proc/net/dev"], limits=SMALL)
    ifaces = {line.split(":")[0].strip() for line in r.stdout.splitlines() if ":" in line}
    assert ifaces == {"lo"}


# --- host visibility -----------------------------------------------------------------


def test_host_proc_not_visible() -> None:
    r = py(
        """
        import os
        pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
        print(pids)
        print(os.getpid(), os.getuid(), open("/proc/1/cmdline").read().split("\\0")[0])
        """
    )
    assert r.exit_code == 0, r.stderr
    pids_line, me_line = r.stdout.splitlines()
    pids = ast.literal_eval(pids_line)
    assert pids == [1], pids  # only the jailed interpreter itself
    assert str(os.getpid()) not in pids_line
    mypid, uid, init = me_line.split()
    assert mypid == "1" and uid == "1000" and "python" in init


def test_host_files_and_env_not_visible(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_TEST_SECRET", "hunter2")
    r = run(
        [
            "/bin/sh",
            "-c",
            "env; ls /; ls /etc; test -e /etc/shadow && echo SHADOW; "
            "test -e /root && echo ROOT; test -e /work/main && echo REPO; exit 0",
        ],
        limits=SMALL,
    )
    assert "hunter2" not in r.stdout and "KEEL_TEST_SECRET" not in r.stdout
    assert "SHADOW" not in r.stdout and "ROOT" not in r.stdout and "REPO" not in r.stdout
    top = set(r.stdout.split())
    assert {"usr", "work", "tmp", "proc", "dev", "etc"} <= top
    assert "home" not in top and "var" not in top and "sys" not in top


def test_no_capabilities_and_seccomp_blocks_namespaces() -> None:
    r = py(
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print("unshare", libc.unshare(0x10000000), ctypes.get_errno())
        status = open("/proc/self/status").read()
        print([l for l in status.splitlines() if l.startswith("CapEff")][0].split()[1])
        """
    )
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "unshare -1 1"  # EPERM from the seccomp policy
    assert int(lines[1], 16) == 0


# --- resource limits -----------------------------------------------------------------


def test_fork_bomb_contained() -> None:
    r = py(
        """
        import os, time
        n = 0
        try:
            for _ in range(1000):
                if os.fork() == 0:
                    time.sleep(30)
                    os._exit(0)
                n += 1
        except OSError as e:
            print("fork failed after", n, e.errno)
        """,
        limits=SMALL.model_copy(update={"max_processes": 8}),
    )
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("fork failed after")
    forked, err = int(r.stdout.split()[3]), int(r.stdout.split()[4])
    assert forked < 8 and err == errno.EAGAIN  # the pids cap (and RLIMIT_NPROC) refused
    # The children sleep 30 s, past the 5 s wall limit: had the run waited for them it
    # would have been killed at the limit. It ended with pid 1's own exit instead; the
    # sleepers died with it.
    assert not r.timed_out and r.limit is None and r.killed_by_signal is None


def test_shell_fork_bomb_ends() -> None:
    # pid 1 forks once, a subshell that starts the bomb, and then runs builtins only: a
    # `sleep` here would itself be a fork, refused whenever the bomb's survivors hold
    # every pid of the cap, and dash exits 2 on a refused fork (seen on CI). Calling `b`
    # in pid 1 itself made pid 1 fork both sides of the pipe, and the second fork was
    # refused when the first side's children had filled the cap by then (a clean-clone
    # run here: exit 2 after 41 ms).
    r = run(
        [
            "/bin/sh",
            "-c",
            "b() { b | b & }; (b) & i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done; exit 0",
        ],
        limits=SMALL.model_copy(update={"max_processes": 8, "wall_time_s": 3}),
    )
    # The cap stopped the bomb (the shell reports its failed forks), and the run ended
    # with pid 1's own exit after its loop: the bomb's survivors, still forking, did not
    # hold it open to its wall limit.
    assert "Cannot fork" in r.stderr
    assert r.exit_code == 0 and not r.timed_out and r.limit is None, r


def test_memory_limit() -> None:
    r = py(
        """
        try:
            b = bytearray(512 * 1024 * 1024)
            print("allocated")
        except MemoryError:
            print("MemoryError")
        """,
        limits=SMALL.model_copy(update={"memory_mb": 128}),
    )
    assert r.stdout.strip() == "MemoryError"


def test_cpu_limit_kills_busy_loop() -> None:
    r = run(
        ["/bin/sh", "-c", "while :; do :; done"],
        limits=SMALL.model_copy(update={"cpu_time_s": 1, "wall_time_s": 10}),
    )
    assert r.timed_out and r.killed_by_signal == 9 and r.exit_code is None
    assert r.limit == "cpu", r  # the kernel's kill at RLIMIT_CPU, not the 10 s wall limit


def test_wall_timeout_kills_sleeper() -> None:
    r = run(["/bin/sleep", "30"], limits=SMALL.model_copy(update={"wall_time_s": 0.5}))
    assert r.timed_out and r.killed_by_signal == 9 and r.exit_code is None
    assert r.limit == "wall", r  # our wall-clock timer, not the CPU limit (sleep uses none)


def test_disk_fill_limited() -> None:
    r = py(
        """
        import errno, os
        def fill(path):
            try:
                with open(path, "wb") as f:
                    for _ in range(64):
                        f.write(b"x" * 65536)
                return "wrote"
            except OSError as e:
                return errno.errorcode[e.errno]
        print(fill("/work/big"))               # one file past RLIMIT_FSIZE
        def many(d):
            os.makedirs(d, exist_ok=True)
            for i in range(10000):
                try:
                    with open(f"{d}/{i}", "wb") as f:
                        f.write(b"y" * 60000)
                except OSError as e:
                    return errno.errorcode[e.errno]
            return "no limit"
        print(many("/tmp/fill"))               # many files: the tmpfs size
        print(many("/work/fill"))              # the workspace is bounded too
        """,
        limits=SMALL.model_copy(update={"max_open_files": 64}),
    )
    assert r.exit_code == 0, r.stderr
    big, tmp, work = r.stdout.split()
    assert big == "EFBIG"
    assert tmp == "ENOSPC"
    if os.geteuid() == 0:
        assert work == "ENOSPC"  # a 4 MiB tmpfs workspace
    else:
        pytest.skip("workspace is a plain directory without root; only RLIMIT_FSIZE applies")


def test_output_flood_truncated_and_stopped() -> None:
    r = run(["/usr/bin/yes", "flood"], limits=SMALL.model_copy(update={"max_output_bytes": 10_000}))
    assert r.output_truncated and not r.timed_out
    assert len(r.stdout) == 10_000
    # Stopped at the cap (we killed the jail), not at the wall limit or the CPU limit.
    assert r.limit == "output" and r.killed_by_signal == 9 and r.exit_code is None, r


def test_writes_outside_workspace_fail() -> None:
    r = run(
        [
            "/bin/sh",
            "-c",
            "for p in /x /usr/x /etc/x /keel/x /proc/x /dev/x /etc/passwd; do "
            "echo x 2>/dev/null > $p && echo WROTE $p; done; echo x > /work/ok && echo workspace-ok",
        ],
        limits=SMALL,
    )
    assert "WROTE" not in r.stdout
    assert "workspace-ok" in r.stdout


# --- output collection ---------------------------------------------------------------


def test_symlink_and_special_file_outputs_refused() -> None:
    r = run(
        [
            "/bin/sh",
            "-c",
            "ln -s /etc/passwd leak; ln -s / rootdir; ln -s /usr dirlink; mkfifo fifo; "
            "mkdir -p sub && echo fine > sub/ok.txt",
        ],
        limits=SMALL,
        output_files=[
            "leak",
            "rootdir/etc/hostname",
            "dirlink/lib/os-release",
            "fifo",
            "sub/ok.txt",
        ],
    )
    assert r.files == {"sub/ok.txt": b"fine\n"}
    assert set(r.refused_files) == {
        "leak",
        "rootdir/etc/hostname",
        "dirlink/lib/os-release",
        "fifo",
    }
    assert "symlink" in r.refused_files["leak"]
    assert "not a regular file" in r.refused_files["fifo"]


@pytest.mark.parametrize("bad", ["../escape", "a/../../escape", "/etc/passwd", ""])
def test_dotdot_and_absolute_paths_refused_before_running(bad: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(SandboxError):
        run(["/bin/sh", "-c", f"echo > {marker}"], output_files=[bad], limits=SMALL)
    with pytest.raises(SandboxError):
        run(["/bin/true"], workspace_files={bad: b"x"}, limits=SMALL)
    assert not marker.exists()


def test_file_size_limit_stops_writes() -> None:
    r = run(
        ["/bin/sh", "-c", "head -c 900000 /dev/zero > a; head -c 2000000 /dev/zero > b"],
        limits=SMALL.model_copy(update={"max_file_size_mb": 1}),
        output_files=["a", "b"],
    )
    assert r.files["a"] == b"\0" * 900000
    assert len(r.files["b"]) == 1024 * 1024  # RLIMIT_FSIZE stopped the write at 1 MiB
    assert r.exit_code != 0  # head died of SIGXFSZ, so the shell reports failure


def test_workspace_files_in_stdin_out_and_cleanup() -> None:
    r = run(
        ["/bin/sh", "-c", "cat in/data.txt; tr a-z A-Z; ls -ld /work; cp in/data.txt copy"],
        workspace_files={"in/data.txt": "hello\n"},
        stdin=b"shout\n",
        limits=SMALL,
        output_files=["copy"],
    )
    assert r.ok, r.stderr
    assert r.stdout.startswith("hello\nSHOUT\n")
    assert r.files == {"copy": b"hello\n"}


# --- failing closed ------------------------------------------------------------------


def test_missing_nsjail_fails_closed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv("KEEL_NSJAIL_PATH", str(tmp_path / "no-such-nsjail"))
    with pytest.raises(SandboxUnavailable, match="nsjail not found"):
        run(
            ["/bin/sh", "-c", f"echo > {marker}"],
            limits=SMALL,
            config=config_for(None, Settings().nsjail_path),
        )
    monkeypatch.delenv("KEEL_NSJAIL_PATH")
    with pytest.raises(SandboxUnavailable):
        run(
            ["/bin/sh", "-c", f"echo > {marker}"],
            limits=SMALL,
            config=SandboxConfig(nsjail_path=str(tmp_path / "nope")),
        )
    assert not marker.exists()


def test_broken_jail_fails_closed(tmp_path: Path) -> None:
    """An nsjail that rejects its configuration, or a binary that is not nsjail at all."""
    marker = tmp_path / "ran"
    broken = tmp_path / "nsjail-broken"
    broken.write_text(f'#!/bin/sh\nexec {find_nsjail()} --no_such_option "$@"\n')
    broken.chmod(0o755)
    impostor = tmp_path / "nsjail-impostor"
    # Pretends to be nsjail but would run the command unjailed: the probe must catch it.
    impostor.write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done; shift; exec "$@"\n')
    impostor.chmod(0o755)
    for binary, base in ((broken, "b"), (impostor, "i"), (Path("/bin/false"), "f")):
        cfg = SandboxConfig(
            nsjail_path=str(binary), jail=JailSettings(base_dir=str(tmp_path / base))
        )
        (tmp_path / base).mkdir()
        with pytest.raises(SandboxUnavailable):
            run(["/bin/sh", "-c", f"echo > {marker}"], limits=SMALL, config=cfg)
    assert not marker.exists()


def test_unreachable_bind_fails_closed(tmp_path: Path) -> None:
    from sandbox import Bind

    secret = tmp_path / "private"
    secret.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("reachability of a 0700 dir only differs for a root host")
    with pytest.raises(SandboxUnavailable, match="cannot bind"):
        run(["/bin/true"], binds=[Bind(str(secret), "/data")], limits=SMALL)


def test_missing_program_is_an_error_not_a_run() -> None:
    with pytest.raises(SandboxError):
        run(["/usr/bin/definitely-not-here"], limits=SMALL)
    with pytest.raises(SandboxError):
        run(["definitely-not-here"], limits=SMALL)


# --- async: cancellation and concurrency ---------------------------------------------


async def test_cancellation_kills_the_jail() -> None:
    marker = f"keel-cancel-{uuid.uuid4().hex}"
    task = asyncio.ensure_future(
        run_async(
            ["/bin/sh", "-c", f"sleep 30 # {marker}"],
            limits=SMALL.model_copy(update={"wall_time_s": 30}),
        )
    )
    for _ in range(100):
        await asyncio.sleep(0.05)
        if _our_processes(marker):
            break
    assert _our_processes(marker), "the jail never started"
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(40):
        if not _our_processes(marker):
            break
        await asyncio.sleep(0.05)
    assert not _our_processes(marker)


async def test_concurrent_jails_are_independent() -> None:
    lim = SMALL.model_copy(update={"max_processes": 4})
    results = await asyncio.gather(
        *(
            run_async(
                ["/bin/sh", "-c", f"echo {i} > f; sleep 0.2; cat f"],
                limits=lim,
                output_files=["f"],
            )
            for i in range(4)
        )
    )
    assert [r.stdout.strip() for r in results] == ["0", "1", "2", "3"]
    assert all(r.ok for r in results)


def test_blocking_run_from_worker_threads() -> None:
    """Sync Temporal activities call ``run`` from a thread pool, each without a loop."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda i: run(["/bin/echo", str(i)], limits=SMALL), range(3)))
    assert [r.stdout for r in outs] == ["0\n", "1\n", "2\n"]


async def test_blocking_run_refused_inside_event_loop() -> None:
    with pytest.raises(RuntimeError, match="await"):
        run(["/bin/true"], limits=SMALL)


def test_no_run_directories_left_behind() -> None:
    base = Path(SandboxConfig().jail.base_dir or "/tmp") / f"keel-sandbox-{os.geteuid()}"
    run(["/bin/true"], limits=SMALL)
    mine = [p for p in base.iterdir() if p.name.startswith(f"run-{os.getpid()}-")]
    assert mine == []


# --- python blocks -------------------------------------------------------------------


def test_python_block_inputs_and_outputs() -> None:
    r = run_python_block(
        textwrap.dedent(
            """
            import statistics
            mean = statistics.mean(values)
            labels = [f"{prefix}{v}" for v in values]
            scratch = object()          # undeclared: ignored even though unserialisable
            print("computed", len(values))
            """
        ),
        inputs={"values": [1, 2, 3, 6], "prefix": "v"},
        outputs=["mean", "labels"],
        limits=SMALL,
    )
    assert r.ok, r.error
    assert r.outputs == {"mean": 3, "labels": ["v1", "v2", "v3", "v6"]}
    assert r.stdout == "computed 4\n"


def test_python_block_sees_only_its_inputs() -> None:
    r = run_python_block(
        "names = sorted(n for n in globals() if not n.startswith('__'))",
        inputs={"a": 1},
        outputs=["names"],
        limits=SMALL,
    )
    assert r.ok and r.outputs["names"] == ["a"]


def test_python_block_exception_reported() -> None:
    r = run_python_block(
        "def check(x):\n    raise ValueError(f'bad value {x}')\ncheck(n)\n",
        inputs={"n": 7},
        outputs=["y"],
        limits=SMALL,
    )
    assert not r.ok and r.error is not None
    assert r.error.type == "ValueError" and r.error.message == "bad value 7"
    assert 'File "/keel/block.py", line 2, in check' in r.error.traceback
    assert "runner.py" not in r.error.traceback


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("y = {1, 2}", "OutputNotSerializable"),
        ("y = float('nan')", "OutputNotSerializable"),
        ("z = 1", "MissingOutput"),
        ("y = (", "SyntaxError"),
        ("import sys; sys.exit(3)", "SystemExit"),
    ],
)
def test_python_block_structured_errors(code: str, kind: str) -> None:
    r = run_python_block(code, outputs=["y"], limits=SMALL)
    assert not r.ok and r.error is not None and r.error.type == kind, r.error


def test_python_block_timeout_and_network() -> None:
    r = run_python_block(
        "while True:\n    pass\n", outputs=["y"], limits=SMALL.model_copy(update={"cpu_time_s": 1})
    )
    assert not r.ok and r.error is not None and r.error.type == "Timeout"
    r = run_python_block(
        "import urllib.request\n"
        "try:\n    urllib.request.urlopen('http://1.1.1.1', timeout=2); y = 'online'\n"
        "except OSError as e:\n    y = 'offline'\n",
        outputs=["y"],
        limits=SMALL,
    )
    assert r.outputs == {"y": "offline"}


def test_python_block_rejects_bad_names_and_inputs() -> None:
    with pytest.raises(ValueError):
        run_python_block("pass", inputs={"not valid": 1})
    with pytest.raises(ValueError):
        run_python_block("pass", outputs=["__builtins__"])
    with pytest.raises(TypeError):
        run_python_block("pass", inputs={"x": object()})


def test_python_block_never_runs_on_host(tmp_path: Path) -> None:
    marker = tmp_path / "host-marker"
    r = run_python_block(
        f"import pathlib\ntry:\n    pathlib.Path({str(marker)!r}).write_text('x'); y = 'wrote'\n"
        "except OSError as e:\n    y = type(e).__name__\n",
        outputs=["y"],
        limits=SMALL,
    )
    assert r.ok and r.outputs["y"] in ("FileNotFoundError", "OSError", "PermissionError")
    assert not marker.exists()


# --- ast-grep ------------------------------------------------------------------------


def test_astgrep_rewrite_produces_expected_diff() -> None:
    files = {
        "pkg/mod.py": "import lib\n\n\ndef f(x):\n    return lib.old_call(x, 1)\n",
        "other.py": "print('untouched')\n",
    }
    r = apply_astgrep(
        AstGrepAction(
            pattern="lib.old_call($A, $B)", rewrite="lib.new_call($B, $A)", language="python"
        ),
        files,
        limits=SMALL,
    )
    assert r.ok, r.error
    assert r.changed_files == {
        "pkg/mod.py": "import lib\n\n\ndef f(x):\n    return lib.new_call(1, x)\n"
    }
    assert r.diff == (
        "--- a/pkg/mod.py\n"
        "+++ b/pkg/mod.py\n"
        "@@ -2,4 +2,4 @@\n"
        " \n"
        " \n"
        " def f(x):\n"
        "-    return lib.old_call(x, 1)\n"
        "+    return lib.new_call(1, x)\n"
    )


def test_astgrep_yaml_rule_and_bad_action() -> None:
    files = {"a.py": "x = old(1)\n"}
    rule = "id: r\nlanguage: python\nrule:\n  pattern: old($A)\nfix: new($A, 2)\n"
    r = apply_astgrep(AstGrepAction(rule=rule), files, limits=SMALL)
    assert r.ok and r.changed_files == {"a.py": "x = new(1, 2)\n"}
    r = apply_astgrep(
        AstGrepAction(pattern="old($A)", rewrite="x", language="klingon"), files, limits=SMALL
    )
    assert not r.ok and r.error and "klingon" in r.error
    r = apply_astgrep(
        AstGrepAction(pattern="nomatch($A)", rewrite="x", language="python"), files, limits=SMALL
    )
    assert r.ok and r.changed_files == {} and r.diff == ""


def test_check_parses_lists_error_nodes_per_file() -> None:
    files = {
        "good.py": "def f():\n    return 1\n",
        "bad.py": "x = = 1\n",
        "ok.js": "const a = 1;\n",
    }
    r = asyncio.run(
        check_parses_async(
            {k: v for k, v in files.items() if k.endswith(".py")}, "python", limits=SMALL
        )
    )
    assert r.ok, r.error
    assert r.errors["good.py"] == []
    assert r.errors["bad.py"] == ["="]
    r = asyncio.run(
        check_parses_async(
            {"ok.js": files["ok.js"], "bad.js": "const = ;\n"}, "javascript", limits=SMALL
        )
    )
    assert r.ok and r.errors["ok.js"] == [] and r.errors["bad.js"]
    r = asyncio.run(check_parses_async({"a.py": "x\n"}, "klingon", limits=SMALL))
    assert not r.ok and r.error and "klingon" in r.error


def test_astgrep_refuses_escaping_paths() -> None:
    action = AstGrepAction(pattern="a", rewrite="b", language="python")
    with pytest.raises(SandboxError):
        apply_astgrep(action, {"../x.py": "a\n"}, limits=SMALL)
    with pytest.raises(SandboxError):
        apply_astgrep(
            action.model_copy(update={"paths": ["/etc/passwd"]}), {"x.py": "a\n"}, limits=SMALL
        )


def test_self_check_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "all checks passed" in proc.stdout


def test_workspace_tmpfs_always_needs_root(open_base_dir: Path) -> None:
    cfg = SandboxConfig(jail=JailSettings(workspace_tmpfs="always", base_dir=str(open_base_dir)))
    if os.geteuid() == 0:
        r = run(["/bin/sh", "-c", "stat -f -c %T /work"], config=cfg, limits=SMALL)
        assert r.stdout.strip() == "tmpfs"
        assert not any(os.path.ismount(p) for p in open_base_dir.rglob("*"))
    else:
        with pytest.raises(SandboxUnavailable):
            run(["/bin/true"], config=cfg, limits=SMALL)
    base = next(open_base_dir.iterdir())
    assert stat.S_IMODE(base.stat().st_mode) == 0o711
    assert list(base.iterdir()) == []  # the run directory is gone


def test_unreachable_base_dir_fails_closed(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only a root host maps the jail to a user that cannot traverse 0700")
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    cfg = SandboxConfig(jail=JailSettings(base_dir=str(closed)))
    with pytest.raises(SandboxUnavailable, match="base dir"):
        run(["/bin/true"], config=cfg, limits=SMALL)


def test_python_block_in_a_virtualenv(open_base_dir: Path) -> None:
    """A venv interpreter gets its venv and its base install bound read-only."""
    base_python = "/usr/bin/python3"
    if not os.path.exists(base_python):
        pytest.skip("needs a system python3 to build a throwaway venv")
    venv = open_base_dir / "venv"
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    cfg = SandboxConfig(python=PythonSettings(interpreter=str(venv / "bin" / "python")))
    rt = python_runtime(cfg)
    assert [b.src for b in rt.binds] == [str(venv)] and not any(b.rw for b in rt.binds)
    r = run_python_block(
        "import sys, os\nprefix = sys.prefix\n"
        "try:\n    open(os.path.join(sys.prefix, 'x'), 'w'); w = 'wrote'\n"
        "except OSError as e:\n    w = type(e).__name__\n",
        outputs=["prefix", "w"],
        limits=SMALL,
        config=cfg,
    )
    assert r.ok, r.error
    assert r.outputs == {"prefix": str(venv), "w": "OSError"}  # EROFS: read-only bind


# --- issue 13 §2: ways a jail could hurt the host ------------------------------------

_LIBC_INOTIFY = """
    import ctypes, ctypes.util, os
    libc = ctypes.CDLL(None, use_errno=True)
    fds, err = [], 0
    for _ in range(200):
        fd = libc.inotify_init1(0)
        if fd < 0:
            err = ctypes.get_errno()
            break
        fds.append(fd)
    for fd in fds:
        os.close(fd)
    fan = libc.fanotify_init(0, 0)
    fan_err = ctypes.get_errno() if fan < 0 else 0
    inotify = (len(fds), err)
    fanotify = (fan, fan_err)
"""


def _host_inotify_works() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        return False
    os.close(fd)
    return True


def test_inotify_and_fanotify_denied() -> None:
    """A jail's inotify instances count against the user that made the jail (root).

    Holding them would exhaust the host's per-user instance limit, so the syscalls are
    refused (EPERM) before the first one; the host and the next jail are unaffected.
    """
    r = run_python_block(
        textwrap.dedent(_LIBC_INOTIFY), outputs=["inotify", "fanotify"], limits=SMALL
    )
    assert r.ok, r.error
    assert r.outputs["inotify"] == [0, errno.EPERM]
    assert r.outputs["fanotify"] == [-1, errno.EPERM]
    assert _host_inotify_works()
    again = run_python_block("x = 1", outputs=["x"], limits=SMALL)
    assert again.ok and again.outputs == {"x": 1}


def test_memory_bounded_across_processes() -> None:
    """Three processes of 100 MiB each under a 128 MiB limit: the jail as a whole is bounded.

    RLIMIT_AS alone lets each process have 128 MiB, so all three would succeed.
    """
    r = py(
        """
        import os
        def eat(mib):
            return [b"x" * (1024 * 1024) for _ in range(mib)]
        kids = []
        for _ in range(3):
            pid = os.fork()
            if pid == 0:
                try:
                    import time
                    held = eat(100)
                    os.write(1, f"held {os.getpid()} {time.monotonic()}\\n".encode())
                    time.sleep(2)
                    os.write(1, f"free {os.getpid()} {time.monotonic()}\\n".encode())
                    os._exit(0)
                except MemoryError:
                    os._exit(3)
            kids.append(pid)
        for pid in kids:
            os.waitpid(pid, 0)
        """,
        limits=SMALL.model_copy(update={"memory_mb": 128, "wall_time_s": 8}),
    )
    # At most one child holds its 100 MiB at a time: the others are stopped (MemoryError
    # or the cgroup's OOM kill), or, on a loaded machine, held in reclaim until the first
    # one exits (its memory is freed after its "free" line). Hold times never overlap.
    times: dict[tuple[str, str], float] = {}
    for line in r.stdout.splitlines():
        what, pid, at = line.split()
        times[(what, pid)] = float(at)
    held = {pid: t for (what, pid), t in times.items() if what == "held"}
    spans = {pid: (t, times[("free", pid)]) for pid, t in held.items() if ("free", pid) in times}
    assert held, r
    for pid, start in held.items():  # no child got its 100 MiB while another held its own
        assert not any(a < start < b for other, (a, b) in spans.items() if other != pid), r


def test_memfd_pages_count_against_the_limit() -> None:
    """memfd pages are in no process's address space; the cgroup still counts them."""
    r = py(
        """
        import os
        made = 0
        try:
            for i in range(20):
                fd = os.memfd_create(f"m{i}")
                os.write(fd, b"x" * (15 * 1024 * 1024))
                made += 1
                print("made", made, flush=True)
        except OSError as e:
            print("stopped", made, e.errno, flush=True)
        """,
        # max_file_size_mb: RLIMIT_FSIZE applies to memfds too; let each take 15 MiB.
        limits=SMALL.model_copy(update={"memory_mb": 128, "max_file_size_mb": 16}),
    )
    made = max((int(n) for n in re.findall(r"made (\d+)", r.stdout)), default=0)
    # 20 x 15 MiB = 300 MiB; under 128 MiB at most 8 fit (the interpreter needs some).
    assert made < 9, r
    assert r.memory_limit_hit


def test_tmp_has_an_inode_limit() -> None:
    r = py(
        """
        import errno, os
        n = 0
        try:
            for n in range(30000):
                open(f"/tmp/f{n}", "w").close()
            print("created all", n + 1)
        except OSError as e:
            print("stopped", n, errno.errorcode[e.errno])
        """,
        limits=SMALL.model_copy(update={"wall_time_s": 20, "cpu_time_s": 10}),
    )
    assert r.exit_code == 0, r.stderr
    word, count, code = r.stdout.split()
    assert (word, code) == ("stopped", "ENOSPC"), r.stdout
    assert int(count) < 30000


def test_forged_deep_result_is_a_structured_error() -> None:
    """A block that writes its own result file, nested 100,000 deep, then exits."""
    code = (
        "import os\n"
        "with open('/work/.keel_block_result.json', 'w') as f:\n"
        "    f.write('{\"ok\": true, \"outputs\": {\"y\": ' + '[' * 100000 + ']' * 100000 + '}}')\n"
        "os._exit(0)\n"
    )
    r = run_python_block(code, outputs=["y"], limits=SMALL)
    assert not r.ok and r.error is not None
    assert r.error.type == "InvalidResult", r.error
    assert "deep" in r.error.message


def test_forged_result_error_field_is_a_structured_error() -> None:
    """A forged ``error`` that is deeply nested must not escape as RecursionError either."""
    code = (
        "import os\n"
        "with open('/work/.keel_block_result.json', 'w') as f:\n"
        "    f.write('{\"ok\": false, \"error\": ' + '{\"a\": ' * 50000 + '1' + '}' * 50000 + '}')\n"
        "os._exit(0)\n"
    )
    r = run_python_block(code, outputs=["y"], limits=SMALL)
    assert not r.ok and r.error is not None and r.error.type == "InvalidResult", r.error


async def test_run_directory_private_while_a_block_runs(open_base_dir: Path) -> None:
    """Another host user cannot read a running block's inputs (their path is in nsjail's argv)."""
    cfg = SandboxConfig(jail=JailSettings(base_dir=str(open_base_dir)))
    task = asyncio.ensure_future(
        run_python_block_async(
            "import time, os\ntime.sleep(1.5)\nmine = open('/keel/spec.json').read()[:1]\n",
            inputs={"secret": "s3cret"},
            outputs=["mine"],
            limits=SMALL,
            config=cfg,
        )
    )
    try:
        spec: Path | None = None
        for _ in range(100):
            found = list(open_base_dir.glob("keel-sandbox-*/run-*/ro/spec.json"))
            if found:
                spec = found[0]
                break
            await asyncio.sleep(0.02)
        assert spec is not None, "the run directory never appeared"
        run_dir, ro = spec.parent.parent, spec.parent
        for p in (run_dir, ro, spec):
            assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))
        if os.geteuid() == 0:
            peek = subprocess.run(
                ["/bin/cat", str(spec)], user=65534, group=65534, capture_output=True, timeout=10
            )
            assert peek.returncode != 0 and b"s3cret" not in peek.stdout
    finally:
        r = await task
    assert r.ok, r.error  # the jail's own user still reads its inputs
    assert r.outputs == {"mine": "{"}


def test_host_dev_null_cannot_be_touched() -> None:
    before = os.stat("/dev/null")
    r = run(
        [
            "/bin/sh",
            "-c",
            "echo hi > /dev/null && echo wrote; touch /dev/null; echo touch=$?",
        ],
        limits=SMALL,
    )
    after = os.stat("/dev/null")
    assert "wrote" in r.stdout, r  # writing to the device still works
    assert "touch=0" not in r.stdout, r
    assert after.st_mtime_ns == before.st_mtime_ns
    assert stat.S_ISCHR(after.st_mode)


def test_block_killed_at_memory_limit_says_so() -> None:
    """The OOM kill of the block is reported as memory, not as running out of time."""
    if find_cgroups() is None:
        pytest.skip("no cgroups on this host")
    code = (
        "import os\n"
        "fds = []\n"
        "for i in range(20):\n"
        "    fd = os.memfd_create('m')\n"
        "    os.write(fd, b'x' * (15 * 1024 * 1024))\n"
        "    fds.append(fd)\n"
        "y = len(fds)\n"
    )
    r = run_python_block(
        code,
        outputs=["y"],
        limits=SMALL.model_copy(update={"memory_mb": 96, "max_file_size_mb": 16}),
    )
    assert not r.ok and r.error is not None
    assert r.error.type == "MemoryLimitExceeded", r.error
    assert r.run.memory_limit_hit and not r.run.timed_out and r.run.killed_by_signal == 9
    assert r.run.limit == "memory", r.run


def test_removing_a_run_cgroup_kills_what_still_runs_in_it() -> None:
    """What an nsjail SIGKILLed on its own mid set-up leaves (its child, before that armed
    its own death signal) is killed when the run's cgroup is removed after the run."""
    setup = find_cgroups()
    if setup is None:
        pytest.skip("no cgroups on this host")
    cgroup = RunCgroup(setup, f"run-{os.getpid()}-leftover", SMALL)
    left = subprocess.Popen(["/bin/sleep", "300"])
    try:
        for d in cgroup.dirs:
            (d / "cgroup.procs").write_text(str(left.pid))
        cgroup.finish()
        assert left.wait(timeout=5) == -signal.SIGKILL
        assert not [d for d in cgroup.dirs if d.exists()]
    finally:
        if left.poll() is None:
            left.kill()
            left.wait()
        cgroup.finish()


def test_run_cgroups_removed_even_when_the_jail_is_killed() -> None:
    setup = find_cgroups()
    if setup is None:
        pytest.skip("no cgroups on this host")
    r = run(["/bin/sleep", "30"], limits=SMALL.model_copy(update={"wall_time_s": 0.5}))
    assert r.timed_out and not r.memory_limit_hit
    parents = setup.run_parents
    mine = re.compile(rf"^run-{os.getpid()}-")
    for parent in parents:
        assert not [p for p in parent.iterdir() if p.is_dir() and mine.match(p.name)]
