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
