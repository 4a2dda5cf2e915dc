"""A killed worker leaves nothing it started running: the jail (nsjail and the jailed
program) and the design validators' host tools run in sessions of their own, outside the
worker's process group, and are tethered to it (sandbox/tether.py).

Each case starts a process that runs a long ``sleep`` the way the worker does (in the
jail, or as a host tool), SIGKILLs that process alone (not its group: the OOM killer's
way), and checks that every process it had started is gone within a bound. Before the
tether, nsjail lived on to its time limit and the host tool to its end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox.tether import tether_unavailable
from tests.support.faults import REPO_ROOT, cmdline, descendants, wait_gone

JAILED = """
import sys
from sandbox import SandboxLimits, run
print("started", flush=True)
run(["/bin/sleep", "120"], limits=SandboxLimits(wall_time_s=300, cpu_time_s=300))
"""

HOST_TOOL = """
import asyncio, sys
from pathlib import Path
from activities.design.validators import _host
print("started", flush=True)
asyncio.run(_host(["/bin/sleep", "120"], Path("."), timeout_s=300))
"""


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


#: What both scripts run. The test kills the parent once a process whose command line
#: starts with it runs: not nsjail's or setpriv's, which name it as arguments while they
#: still set up. A fresh process first runs a probe jail (sandbox.jail.ensure_available),
#: which an "nsjail" marker also matched (it failed so once under load, 2026-11-28); and a
#: kill while nsjail or setpriv is still starting the command is not the case tested here
#: (the command may then outlive them; clean clone 24 of 2026-11-28 showed it).
COMMAND = "/bin/sleep 120"


@pytest.mark.parametrize("script", [JAILED, HOST_TOOL], ids=["jailed", "host-tool"])
async def test_what_a_killed_worker_started_dies_with_it(tmp_path: Path, script: str) -> None:
    assert tether_unavailable() is None, tether_unavailable()
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while not any(cmdline(p).startswith(COMMAND) for p in descendants(parent.pid)):
            assert parent.poll() is None, parent.stdout.read() if parent.stdout else ""
            assert time.monotonic() < deadline, f"no {COMMAND!r} under the parent"
            time.sleep(0.05)
        started = descendants(parent.pid)
        # Outside the parent's process group: killing the group alone would miss them.
        groups = {p: (_pgid(p), cmdline(p)) for p in started}
        assert any(g not in (None, parent.pid) for g, _ in groups.values()), (
            f"parent {parent.pid}, exited {parent.poll()}; its descendants (pgid, cmdline): "
            f"{groups}"
        )
        os.kill(parent.pid, signal.SIGKILL)
        assert parent.wait(timeout=10) == -signal.SIGKILL
        await wait_gone(started, timeout_s=15, what=f"what the killed parent started ({COMMAND})")
    finally:
        if parent.poll() is None:
            os.killpg(parent.pid, signal.SIGKILL)
            parent.wait()
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)  # a leak this test found: not left behind
