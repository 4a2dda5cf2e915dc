"""Process trees stopped by identity: ``services.processes.stop_pid`` (``keel down``, every
ManagedProcess) and the local Ray's leftovers (``activities.fanout._reap``) find processes
with psutil and signal each only while it is still the process found."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import psutil

from activities import fanout
from services.processes import stop_pid

#: Ignores SIGTERM (and so do the sleeps it starts), and starts a sleep in a session of
#: its own, outside its process group.
STUBBORN = 'trap "" TERM; setsid sleep 301 & sleep 302 & wait'


def _started(argv: list[str]) -> tuple[subprocess.Popen[bytes], psutil.Process]:
    """``argv`` in a session of its own, once both sleeps it starts run: a child forked
    but not yet exec'd still has the shell's command line (a loaded clean-clone run found
    the ``sleep 302`` fork so, naming the marker)."""
    proc = subprocess.Popen(argv, start_new_session=True)
    deadline = time.monotonic() + 10
    while True:
        children = psutil.Process(proc.pid).children()
        lines = [p.cmdline() for p in children]
        below = [p for p, line in zip(children, lines, strict=True) if "301" in line]
        if below and any("302" in line for line in lines):
            return proc, below[0]
        assert time.monotonic() < deadline, "the stubborn script did not start its sleep"
        time.sleep(0.02)


def test_stop_pid_kills_the_tree_that_outlasts_sigterm() -> None:
    proc, outside = _started(["/bin/sh", "-c", STUBBORN])
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    assert os.getsid(outside.pid) != os.getsid(proc.pid)
    try:
        started = time.monotonic()
        stop_pid(proc.pid, timeout_s=0.5)
        assert time.monotonic() - started < 5
        _, left = psutil.wait_procs(tree, timeout=5)
        assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], left
    finally:
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


def test_stop_pid_of_a_process_already_gone_returns() -> None:
    proc = subprocess.Popen(["/bin/true"], start_new_session=True)
    proc.wait()
    started = time.monotonic()
    stop_pid(proc.pid, timeout_s=5)
    assert time.monotonic() - started < 1


def test_ray_leftovers_are_found_by_their_temp_dir_killed_and_reaped() -> None:
    marker = f"/tmp/keel-ray-test-{time.time_ns()}"
    proc, _ = _started(["/bin/sh", "-c", STUBBORN, marker])
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    try:
        # Only the shell names the directory: its sleeps do not.
        assert {p.pid for p in fanout._started_in(marker)} == {proc.pid}
        started = time.monotonic()
        fanout._reap(fanout._started_in(marker), timeout_s=0.2)
        assert time.monotonic() - started < 5
        assert not psutil.pid_exists(proc.pid)  # killed, and reaped here: no zombie left
    finally:
        for p in tree:
            with contextlib.suppress(psutil.Error):
                p.kill()


#: A service that stops its own child in its own way on SIGTERM (as the worker stops its
#: Ray node): the child notes any SIGTERM it gets itself, and leaves on SIGUSR1.
ORDERLY = """
import os, signal, subprocess, sys, time
log = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def term(*_):
    open(sys.argv[1], "a").write("child: SIGTERM\\\\n")
def usr1(*_):
    open(sys.argv[1], "a").write("child: stopped by its parent\\\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
signal.signal(signal.SIGUSR1, usr1)
open(sys.argv[1], "a").write("child: ready\\\\n")
while True:
    time.sleep(0.05)
''', log])
def stop(*_):
    time.sleep(0.3)  # the child's own SIGTERM, if the group got one, lands first
    child.send_signal(signal.SIGUSR1)
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.05)
"""


def test_stop_pid_lets_the_leader_stop_its_own_children(tmp_path) -> None:
    """The SIGTERM goes to the service alone; its group gets one only if it is left."""
    log = tmp_path / "log"
    proc = subprocess.Popen([sys.executable, "-c", ORDERLY, str(log)], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while "child: ready" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        stop_pid(proc.pid, timeout_s=10)
        assert log.read_text().splitlines() == ["child: ready", "child: stopped by its parent"]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
