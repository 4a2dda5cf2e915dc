"""Self-check: ``python -m sandbox`` runs a few jails and prints what they could and could not do.

Exit status 0 when every check passed, 1 otherwise, 2 when no jail could start at all.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from functools import lru_cache

from sandbox.astgrep import AstGrepAction, apply_astgrep_async
from sandbox.cgroups import cgroup_setup
from sandbox.errors import SandboxUnavailable
from sandbox.jail import ensure_available, find_nsjail, run_async
from sandbox.models import SandboxConfig, SandboxLimits, config_for
from sandbox.python_block import python_runtime, run_python_block_async

Check = Callable[[], Awaitable[str]]


@lru_cache(maxsize=1)
def _config() -> SandboxConfig:
    """The config the checks run with. This doctor is an entry point of a package that
    imports nothing of Keel's, so it reads the two settings by their ``KEEL_*`` names itself
    (``keel.settings.Settings`` has them as ``sandbox_config`` and ``nsjail_path``)."""
    return config_for(os.environ.get("KEEL_SANDBOX_CONFIG"), os.environ.get("KEEL_NSJAIL_PATH"))


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")


def _fail(msg: str) -> None:
    raise AssertionError(msg)


async def _network() -> str:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)
        srv.setblocking(False)
        port = srv.getsockname()[1]
        code = (
            "import socket\n"
            "out = []\n"
            f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
            "    try:\n"
            "        socket.create_connection(addr, timeout=2).close(); out.append('open')\n"
            "    except OSError as e:\n"
            "        out.append(type(e).__name__)\n"
            "try:\n"
            "    socket.getaddrinfo('example.com', 80); out.append('dns')\n"
            "except OSError as e:\n"
            "    out.append(type(e).__name__)\n"
        )
        res = await run_python_block_async(code, outputs=["out"], config=_config())
        try:
            srv.accept()
            _fail("the host's listening socket got a connection from the jail")
        except BlockingIOError:
            pass
    if not res.ok or "open" in res.outputs["out"] or "dns" in res.outputs["out"]:
        _fail(f"network reachable: {res.outputs or res.error}")
    return f"loopback server, 1.1.1.1 and DNS unreachable ({res.outputs['out']})"


async def _proc() -> str:
    r = await run_async(["/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'"], config=_config())
    count = int(r.stdout.strip() or 0)
    if count > 5:
        _fail(f"{count} pids visible in /proc")
    return f"{count} pid(s) visible in the jail's /proc"


async def _readonly() -> str:
    # A plain command, not ":": a failed redirection on a special builtin ends sh.
    r = await run_async(
        [
            "/bin/sh",
            "-c",
            "for p in /x /usr/x /etc/x /keel/x; do echo x 2>/dev/null > $p && echo $p; done;"
            " echo x > /work/ok && echo workspace-ok",
        ],
        config=_config(),
    )
    if r.stdout.split() != ["workspace-ok"]:
        _fail(f"unexpected writes (or workspace not writable): {r.stdout.split()}")
    return "/, /usr, /etc, /keel read-only; /work writable"


async def _limits() -> str:
    small = SandboxLimits(wall_time_s=3, cpu_time_s=1, memory_mb=128, max_processes=8)
    mem = await run_python_block_async(
        "try:\n    b = bytearray(512 * 1024 * 1024); r = 'allocated'\n"
        "except MemoryError:\n    r = 'MemoryError'\n",
        outputs=["r"],
        limits=small,
        config=_config(),
    )
    if mem.outputs.get("r") != "MemoryError":
        _fail(f"memory limit not enforced: {mem.outputs or mem.error}")
    cpu = await run_async(["/bin/sh", "-c", "while :; do :; done"], limits=small, config=_config())
    if cpu.limit != "cpu":
        _fail(f"CPU loop was not stopped at the CPU limit (stopped by: {cpu.limit})")
    return (
        "512 MiB allocation refused at 128 MiB; busy loop killed at the 1 s CPU limit "
        f"after {cpu.duration_ms} ms"
    )


async def _astgrep() -> str:
    res = await apply_astgrep_async(
        AstGrepAction(pattern="old($A)", rewrite="new($A)", language="python"),
        {"a.py": "x = old(1)\n"},
        config=_config(),
    )
    if res.changed_files != {"a.py": "x = new(1)\n"}:
        _fail(f"ast-grep rewrite wrong: {res.error or res.changed_files}")
    return "rewrite applied in the jail"


async def main() -> int:
    """Run the checks and print a report."""
    cfg = _config()
    try:
        _say(f"nsjail:      {find_nsjail(cfg)}")
        await ensure_available(cfg)
    except SandboxUnavailable as exc:
        _say(f"UNAVAILABLE: {exc}")
        return 2
    rt = python_runtime(cfg)
    _say(f"python:      {rt.executable} (binds: {[b.src for b in rt.binds] or 'none'})")
    _say(f"host euid:   {os.geteuid()}; workspace tmpfs: {cfg.jail.workspace_tmpfs}")
    cg = cgroup_setup(cfg.jail)
    _say(
        f"cgroups:     v{cg.version}, run cgroups under {[str(p) for p in cg.run_parents]}"
        if cg
        else f"cgroups:     none (jail.cgroups={cfg.jail.cgroups}): per-process limits only"
    )
    checks: list[tuple[str, Check]] = [
        ("network", _network),
        ("host /proc", _proc),
        ("read-only", _readonly),
        ("limits", _limits),
        ("ast-grep", _astgrep),
    ]
    failed = 0
    for name, check in checks:
        try:
            detail = await check()
            _say(f"ok    {name:<11} {detail}")
        except (AssertionError, SandboxUnavailable) as exc:
            failed += 1
            _say(f"FAIL  {name:<11} {exc}")
    _say("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
