"""``services.up``: when a new ``keel up`` may not start beside a recorded one
(``start_refused``) and ``keel status``'s document (``up_status``), moved from cli/ (issue 41)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from services.up import start_refused


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_running_supervisor_refuses() -> None:
    why = start_refused({"supervisor": os.getpid(), "services": {}})
    assert why == (
        f"Keel is already running (keel up pid {os.getpid()}); "
        "see `keel status`, or stop it with `keel down`."
    )


def test_services_left_by_a_killed_keel_up_refuse() -> None:
    dead = _dead_pid()
    recorded = {
        "supervisor": dead,
        "services": {"worker": {"pid": os.getpid()}, "api": {"pid": dead}},
    }
    assert start_refused(recorded) == (
        f"a keel up that was killed left services running (worker pid {os.getpid()}); "
        "stop them with `keel down`."
    )


def test_a_stale_record_does_not_refuse() -> None:
    dead = _dead_pid()
    assert start_refused({"supervisor": dead, "services": {"api": {"pid": dead}}}) is None


def test_up_status_phases(tmp_path) -> None:
    """``keel status``'s document: nothing recorded, up, starting, killed."""
    from keel.settings import Settings
    from services.up import starting_file, state_file, up_status, write_state

    settings = Settings(data_dir=tmp_path)
    assert up_status(settings) is None
    dead = _dead_pid()
    # Written by this process: the supervisor is alive.
    write_state(starting_file(settings), {"worker": {"pid": os.getpid(), "task_queue": "q"}})
    doc = up_status(settings)
    assert doc == {
        "state": "starting",
        "supervisor": os.getpid(),
        "services": {"worker": {"pid": os.getpid(), "task_queue": "q", "running": True}},
    }
    write_state(state_file(settings), {"api": {"pid": dead, "address": "http://x"}})
    doc = up_status(settings)
    assert doc is not None and doc["state"] == "up"
    assert doc["services"] == {"api": {"pid": dead, "address": "http://x", "running": False}}
    state_file(settings).unlink()
    starting_file(settings).write_text(
        json.dumps({"supervisor": dead, "services": {"api": {"pid": dead}}})
    )
    doc = up_status(settings)
    assert doc is not None and doc["state"] == "killed"


def test_what_a_killed_keel_up_spawned_but_did_not_record_is_stopped(tmp_path) -> None:
    """A SIGKILL between a service's spawn and its record (a clean-clone run left the API
    running that way, its port bound after ``keel down``): the process carries the
    ``keel up``'s id in its environment, so ``keel up`` refuses and ``keel down`` stops it."""
    from keel.settings import Settings
    from services.processes import pid_alive
    from services.up import UP_ID_ENV, starting_file, stop_recorded

    settings = Settings(data_dir=tmp_path)
    dead = _dead_pid()
    env = {**os.environ, UP_ID_ENV: f"{dead}-abc"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen(  # another keel up's: left alone
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**env, UP_ID_ENV: "1-x"}
    )
    try:
        recorded = {"supervisor": dead, "up_id": f"{dead}-abc", "services": {}}
        starting_file(settings).parent.mkdir(parents=True)
        starting_file(settings).write_text(json.dumps(recorded))
        assert start_refused(recorded) == (
            f"a keel up that was killed left services running (pid {child.pid} "
            "(unrecorded)); stop them with `keel down`."
        )
        assert stop_recorded(settings, timeout=5) == [f"pid {child.pid} (unrecorded)"]
        assert child.wait(timeout=10) is not None and not pid_alive(child.pid)
        assert other.poll() is None
        # A record without an id (an older keel up's) finds nothing more.
        assert start_refused({"supervisor": dead, "services": {}}) is None
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()
