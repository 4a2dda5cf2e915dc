"""Unit tests of the sandbox's pure parts: paths, command line, log parsing, config, diffs.

The jail itself is exercised for real in tests/core/integration/test_sandbox_escapes.py.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pytest
from pydantic import ValidationError

from keel.settings import Settings
from sandbox import AstGrepAction, SandboxConfig, SandboxError, SandboxLimits, SandboxResult
from sandbox.astgrep import unified_diff
from sandbox.cgroups import cgroup_setup, sweep_stale
from sandbox.errors import SandboxUnavailable
from sandbox.jail import (
    SECCOMP_POLICY,
    Bind,
    _limit_reached,
    _read_log,
    build_command,
    find_nsjail,
)
from sandbox.models import JailSettings, config_for, load_config
from sandbox.python_block import RESULT_FILE, _check_name, _interpret
from sandbox.workspace import Workspace, _rmtree, _sweep_stale, validate_relpath


@pytest.fixture
def base_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="keel-sandbox-unit-"))
    d.chmod(0o711)
    try:
        yield d
    finally:
        subprocess.run(["rm", "-rf", str(d)], check=True)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("a.py", "a.py"), ("./pkg//mod.py", "pkg/mod.py"), ("a/./b/c", "a/b/c")],
)
def test_validate_relpath_normalises(path: str, expected: str) -> None:
    assert validate_relpath(path) == PurePosixPath(expected)


@pytest.mark.parametrize("path", ["", ".", "/etc/passwd", "../x", "a/../../x", "a/..", "a\x00b"])
def test_validate_relpath_refuses(path: str) -> None:
    with pytest.raises(SandboxError):
        validate_relpath(path)


def test_build_command_is_deliberate(base_dir: Path) -> None:
    cfg = SandboxConfig(jail=JailSettings(base_dir=str(base_dir), workspace_tmpfs="never"))
    limits = SandboxLimits(
        wall_time_s=2.5, cpu_time_s=3, memory_mb=100, max_processes=7, max_file_size_mb=2
    )
    with Workspace(cfg.jail, limits) as ws:
        cmd = build_command(
            "/x/nsjail",
            ["/bin/echo", "hi"],
            limits=limits,
            config=cfg,
            workspace=ws,
            env={"A": "1"},
            binds=[Bind("/opt/tool", "/opt/tool")],
        )
        flags = dict(itertools.pairwise(cmd))
        assert cmd[0] == "/x/nsjail" and cmd[-3:] == ["--", "/bin/echo", "hi"]
        # No namespace is ever switched off, and nothing loosens the jail.
        assert not [a for a in cmd if a.startswith("--disable_")]
        for loose in ("--keep_caps", "--keep_env", "--rw", "--chroot", "--use_pasta"):
            assert loose not in cmd
        assert flags["--mode"] == "o"
        assert flags["--time_limit"] == "4"  # ceil(2.5) + 1: a backstop behind our timer
        assert flags["--rlimit_as"] == "100" and flags["--rlimit_cpu"] == "3"
        assert flags["--rlimit_nproc"] == "7" and flags["--rlimit_fsize"] == "2"
        assert flags["--user"].startswith("1000:") and flags["--group"].startswith("1000:")
        assert flags["--user"] != "1000:0:1"
        assert flags["--cwd"] == "/work"
        assert flags["--seccomp_string"] == SECCOMP_POLICY
        assert flags["--log"] == str(ws.log_path)
        binds_rw = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--bindmount"]
        assert binds_rw == [f"{ws.work}:/work"]  # the only writable bind
        binds_ro = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--bindmount_ro"]
        assert "/dev/null" in binds_ro  # a device still writable, its host inode not
        mounts = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--mount"]
        assert mounts == [f"none:/tmp:tmpfs:size={16 * 1024 * 1024},nr_inodes=4096"]
        assert "/opt/tool:/opt/tool" in binds_ro and f"{ws.ro}:/keel" in binds_ro
        assert "/proc" not in binds_ro and not any(b.startswith("/proc:") for b in binds_ro)
        envs = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--env"]
        assert envs == ["A=1"]


def test_workspace_write_and_collect(base_dir: Path) -> None:
    cfg = JailSettings(base_dir=str(base_dir), workspace_tmpfs="never")
    with Workspace(cfg, SandboxLimits()) as ws:
        ws.write_files({"a/b.txt": "text", "c.bin": b"\x00\x01"})
        (ws.work / "link").symlink_to("/etc/hostname")
        (ws.work / "dirlink").symlink_to("/etc")
        files, refused = ws.collect(
            [PurePosixPath(p) for p in ("a/b.txt", "c.bin", "link", "dirlink/hostname", "zz")],
            max_bytes=3,
        )
        assert files == {"c.bin": b"\x00\x01"}
        assert refused["a/b.txt"] == "larger than 3 bytes"
        assert "symlink" in refused["link"] and "symlink" in refused["dirlink/hostname"]
        assert refused["zz"] == "missing"
        root = ws.root
    assert not root.exists()


def test_workspace_budget_and_conflicts(base_dir: Path) -> None:
    cfg = JailSettings(base_dir=str(base_dir), workspace_tmpfs="never")
    with Workspace(cfg, SandboxLimits(workspace_size_mb=1)) as ws:
        with pytest.raises(SandboxError, match="workspace_size_mb"):
            ws.write_files({"big": b"x" * (2 * 1024 * 1024)})
        with pytest.raises(SandboxError):
            ws.write_files({"f": "x", "f/g": "y"})


def test_stale_run_dirs_are_swept(base_dir: Path) -> None:
    # A finished child's pid: nothing runs under it now (reuse within the test is unlikely).
    dead_pid = subprocess.Popen(["true"])
    dead_pid.wait()
    stale = base_dir / f"run-{dead_pid.pid}-abc"
    (stale / "work").mkdir(parents=True)
    live = base_dir / f"run-{os.getpid()}-abc"
    live.mkdir()
    _sweep_stale(base_dir)
    assert not stale.exists() and live.exists()


def test_sweeping_never_closes_the_shared_base(base_dir: Path) -> None:
    """Two processes may sweep one stale run directory at once: the one that finds it
    gone must leave the base alone. The base's o+x is what every other process's jail
    mount setup walks through (CI stop 48 failed a jail on exactly this: the sweep's
    error handler had made the base 0700)."""
    base_dir.chmod(0o711)
    _rmtree(base_dir / "run-1-already-gone")
    assert base_dir.stat().st_mode & 0o777 == 0o711
    stale = base_dir / "run-2-locked"
    (stale / "work" / "deep").mkdir(parents=True)
    (stale / "work" / "deep" / "f").write_text("x")
    (stale / "work" / "deep").chmod(0)
    (stale / "work").chmod(0)
    _rmtree(stale)
    assert not stale.exists()
    assert base_dir.stat().st_mode & 0o777 == 0o711


def test_base_dir_owned_by_someone_else_is_refused(base_dir: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the directory away")
    bad = base_dir / f"keel-sandbox-{os.geteuid()}"
    bad.mkdir()
    os.chown(bad, 12345, 12345)
    with pytest.raises(SandboxUnavailable, match="refusing"):
        Workspace(JailSettings(base_dir=str(base_dir)), SandboxLimits())


LOG_EXIT = """[I][2026] Executing '/bin/sh' for '[STANDALONE MODE]'
[I][2026] pid=7 ([STANDALONE MODE]) exited with status: 3, (PIDs left: 0)
"""
LOG_TIME = """[I][2026] pid=7 run time >= time limit (1 >= 1) ([STANDALONE MODE]). Killing it
[I][2026] pid=7 ([STANDALONE MODE]) terminated with signal: SIGKILL (9), (PIDs left: 0)
"""
LOG_FAIL = """[E][2026][1] newProc():232 execve('/nope') failed: No such file or directory
[F][2026][1] runChild():506 Launching child process failed
[E][2026][6] standaloneMode():274 Couldn't launch the child process
[I][2026] pid=8 ([STANDALONE MODE]) terminated with signal: SIGKILL (9), (PIDs left: 0)
"""


def test_read_log(tmp_path: Path) -> None:
    p = tmp_path / "log"
    p.write_text(LOG_EXIT)
    r = _read_log(p)
    assert (r.exit_code, r.signal, r.ran, r.launch_failed) == (3, None, True, False)
    p.write_text(LOG_TIME)
    r = _read_log(p)
    assert r.signal == 9 and r.time_limit_hit and not r.launch_failed
    p.write_text(LOG_FAIL)
    r = _read_log(p)
    assert r.launch_failed and r.execve_failed and "[F]" in r.problems
    r = _read_log(tmp_path / "absent")
    assert not r.ran and not r.launch_failed


@pytest.mark.parametrize(
    ("killed_for", "oom", "nsjail_time_limit", "sig", "expected"),
    [
        (None, False, False, None, None),  # exited by itself
        ("output", False, False, 9, "output"),
        ("timeout", False, False, 9, "wall"),
        ("timeout", True, False, 9, "wall"),  # our timer fired first: the wall limit
        (None, True, False, 9, "memory"),
        (None, False, True, 9, "wall"),  # nsjail's backstop, by its log line
        (None, False, False, 9, "cpu"),  # a SIGKILL of pid 1 nobody above sent
        (None, False, False, 24, "cpu"),  # SIGXCPU
        (None, False, False, 11, None),  # the program's own crash is no limit
        (None, False, False, 15, None),
    ],
)
def test_limit_reached_says_who_stopped_the_run(
    killed_for: str | None,
    oom: bool,
    nsjail_time_limit: bool,
    sig: int | None,
    expected: str | None,
) -> None:
    assert _limit_reached(killed_for, oom, nsjail_time_limit, sig) == expected


def test_find_nsjail_explicit_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "nsjail"
    fake.write_text("#!/bin/sh\n")
    monkeypatch.setenv("KEEL_NSJAIL_PATH", str(fake))
    # KEEL_NSJAIL_PATH reaches the sandbox as the worker passes it: Settings -> config_for.
    cfg = config_for(None, Settings().nsjail_path)
    with pytest.raises(SandboxUnavailable):  # exists but is not executable
        find_nsjail(cfg)
    fake.chmod(0o755)
    assert find_nsjail(cfg) == str(fake)
    monkeypatch.delenv("KEEL_NSJAIL_PATH")
    assert Settings().nsjail_path is None
    assert find_nsjail(SandboxConfig(nsjail_path=str(fake))) == str(fake)
    assert os.access(find_nsjail(SandboxConfig()), os.X_OK)


def test_config_file_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = load_config(Path(__file__).resolve().parents[3] / "configs" / "sandbox.yaml")
    assert shipped.limits == SandboxLimits()  # the YAML and the model agree on defaults
    f = tmp_path / "s.yaml"
    f.write_text("limits:\n  wall_time_s: 3\n  memory_mb: 64\njail:\n  seccomp: false\n")
    cfg = load_config(f)
    assert cfg.limits.wall_time_s == 3 and cfg.limits.memory_mb == 64 and not cfg.jail.seccomp
    monkeypatch.setenv("KEEL_SANDBOX_CONFIG", str(f))
    assert config_for(Settings().sandbox_config).limits.memory_mb == 64
    monkeypatch.setenv("KEEL_SANDBOX_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(FileNotFoundError):
        config_for(Settings().sandbox_config)
    f.write_text("limits:\n  wall_time_seconds: 3\n")
    with pytest.raises(ValidationError):
        load_config(f)


def test_limits_validated() -> None:
    with pytest.raises(ValidationError):
        SandboxLimits(wall_time_s=0)
    with pytest.raises(ValidationError):
        SandboxLimits(memory_mb=1)


def test_result_bytes_roundtrip_json() -> None:
    r = SandboxResult(exit_code=0, files={"a": b"\xff\x00"})
    again = SandboxResult.model_validate_json(r.model_dump_json())
    assert again.files == {"a": b"\xff\x00"} and again.ok
    assert not SandboxResult(exit_code=0, timed_out=True).ok


def test_unified_diff_marks_missing_newline() -> None:
    d = unified_diff({"a.py": "x = 1"}, {"a.py": "x = 2"})
    assert d == (
        "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n\\ No newline at end of file\n"
        "+x = 2\n\\ No newline at end of file\n"
    )
    assert unified_diff({"a": "same\n"}, {"a": "same\n"}) == ""


def test_astgrep_action_forms() -> None:
    AstGrepAction(pattern="a", rewrite="b", language="python")
    AstGrepAction(rule="id: x")
    with pytest.raises(ValidationError):
        AstGrepAction(pattern="a", rewrite="b")
    with pytest.raises(ValidationError):
        AstGrepAction(rule="id: x", pattern="a")


@pytest.mark.parametrize("name", ["1x", "a-b", "class", "__x", ""])
def test_block_names_checked(name: str) -> None:
    with pytest.raises(ValueError):
        _check_name(name, "input")


def _run_with(result: object) -> SandboxResult:
    return SandboxResult(exit_code=0, files={RESULT_FILE: json.dumps(result).encode()})


def test_block_result_is_treated_as_untrusted() -> None:
    # Undeclared outputs in the (jail-written) result are dropped.
    r = _interpret(_run_with({"ok": True, "outputs": {"y": 1, "extra": 2}}), ["y"])
    assert r.ok and r.outputs == {"y": 1}
    # A result claiming success without a declared output is refused.
    r = _interpret(_run_with({"ok": True, "outputs": {}}), ["y"])
    assert not r.ok and r.error is not None and r.error.type == "InvalidResult"
    r = _interpret(SandboxResult(exit_code=0, files={RESULT_FILE: b"not json"}), ["y"])
    assert r.error is not None and r.error.type == "InvalidResult"
    r = _interpret(SandboxResult(exit_code=None, timed_out=True, killed_by_signal=9), ["y"])
    assert r.error is not None and r.error.type == "Timeout"
    r = _interpret(SandboxResult(exit_code=1, stderr="boom"), ["y"])
    assert r.error is not None and r.error.type == "NoResult" and "boom" in r.error.traceback


# --- cgroups (against a fake /sys/fs/cgroup tree: the layout, not the kernel) ----------


def _fake_v1(root: Path) -> None:
    for h in ("memory", "pids"):
        (root / h).mkdir(parents=True)
        (root / h / "cgroup.procs").write_text("")


def test_cgroup_v1_run_holds_the_limits(tmp_path: Path) -> None:
    _fake_v1(tmp_path)
    setup = cgroup_setup(JailSettings(cgroups="always"), root=tmp_path)
    assert setup is not None and setup.version == 1
    limits = SandboxLimits(memory_mb=100, max_processes=7)
    rc = setup.for_run("run-1-abc", limits)
    mem_parent, pids_parent = setup.run_parents
    # Under this process's own cgroup: the jails stay inside the worker's limits.
    assert mem_parent.name == "keel-sandbox" and mem_parent.is_relative_to(tmp_path / "memory")
    run_mem = mem_parent / "run-1-abc"
    assert (run_mem / "memory.limit_in_bytes").read_text() == str(100 * 1024 * 1024)
    assert (pids_parent / "run-1-abc" / "pids.max").read_text() == "7"
    flags = dict(itertools.pairwise(rc.nsjail_args()))
    assert flags["--cgroup_mem_parent"] == f"{setup.memory_parent}/run-1-abc"
    assert flags["--cgroup_pids_parent"] == f"{setup.pids_parent}/run-1-abc"
    assert flags["--cgroup_mem_mount"] == str(tmp_path / "memory")
    # nsjail's child gets 1 MiB more, so the run cgroup's limit (and its counters) bind.
    assert flags["--cgroup_mem_max"] == str(101 * 1024 * 1024)
    assert flags["--cgroup_pids_max"] == "7"
    (run_mem / "memory.max_usage_in_bytes").write_text(f"{99 * 1024 * 1024}\n")
    assert not rc.memory_limit_hit()
    (run_mem / "memory.max_usage_in_bytes").write_text(f"{100 * 1024 * 1024}\n")
    assert rc.memory_limit_hit()


def test_cgroup_v2_enables_controllers(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpu memory pids io\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu\n")
    parent = tmp_path / "keel-sandbox"
    (parent / "run-2-x").mkdir(parents=True)
    (parent / "cgroup.subtree_control").write_text("memory pids\n")
    (parent / "run-2-x" / "cgroup.subtree_control").write_text("\n")
    setup = cgroup_setup(JailSettings(cgroups="always"), root=tmp_path)
    assert setup is not None and setup.version == 2
    # A plain file stands in for the kernel's: the write is what matters.
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"
    rc = setup.for_run("run-2-x", SandboxLimits(memory_mb=64, max_processes=5))
    flags = dict(itertools.pairwise(rc.nsjail_args()))
    assert "--use_cgroupv2" in rc.nsjail_args()
    assert flags["--cgroupv2_mount"] == str(parent / "run-2-x")
    assert (parent / "run-2-x" / "memory.max").read_text() == str(64 * 1024 * 1024)
    assert (parent / "run-2-x" / "memory.swap.max").read_text() == "0"
    assert (parent / "run-2-x" / "cgroup.subtree_control").read_text() == "+memory +pids"


def test_cgroups_missing_fail_closed_or_warn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(SandboxUnavailable, match=r"jail\.cgroups: never"):
        cgroup_setup(JailSettings(cgroups="always"), root=tmp_path)
    assert cgroup_setup(JailSettings(cgroups="never"), root=tmp_path) is None
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    with pytest.raises(SandboxUnavailable):
        cgroup_setup(JailSettings(cgroups="auto"), root=tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with caplog.at_level("WARNING"):
        assert cgroup_setup(JailSettings(cgroups="auto"), root=tmp_path) is None
    assert "without cgroup limits" in caplog.text


def test_stale_run_cgroups_swept(tmp_path: Path) -> None:
    _fake_v1(tmp_path)
    dead = 2**22 + 17  # above pid_max's default ceiling: no such process
    setup = cgroup_setup(JailSettings(cgroups="always"), root=tmp_path)
    assert setup is not None
    for parent in setup.run_parents:
        for name in (f"run-{dead}-x", f"NSJAIL.{dead}", f"run-{os.getpid()}-y", "other"):
            (parent / name).mkdir(parents=True)
    sweep_stale(setup)
    for parent in setup.run_parents:
        left = sorted(p.name for p in parent.iterdir())
        assert left == ["other", f"run-{os.getpid()}-y"]
