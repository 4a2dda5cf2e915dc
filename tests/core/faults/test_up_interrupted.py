"""``keel up`` cut short leaves nothing behind (issue 25, "Nothing left behind").

Each stop signal a user or a system sends (SIGTERM, SIGINT for Ctrl-C, SIGHUP for a
closed terminal) is sent at each stage of the start: just after the Temporal dev server,
the model server, the worker and the API are spawned (each stage is seen in the record
``keel up`` writes before it starts the next thing; the worker's and the API's spawns are
back to back, so the signal for "worker" may land a moment after the API's), and once
Keel is up. Every process
it started must be gone, every port it bound free, and no record left; a ``keel up``
killed with SIGKILL (which nothing can catch) leaves a record that ``keel down`` stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from services.model_server import unavailable_reason
from services.processes import pid_alive, port_open
from tests.core.integration.test_cli import KEEL, keel_env, run, stop_up

STAGES = ["temporal", "model", "worker", "api", "up"]
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP]


def _recorded(data: Path) -> tuple[str | None, dict]:
    """The stage the start has reached, and what it recorded."""
    for name in ("up.json", "starting.json"):
        try:
            state = json.loads((data / "run" / name).read_text())
        except (OSError, ValueError):
            continue
        services = state.get("services", {})
        if name == "up.json":
            return "up", services
        return (list(services)[-1] if services else None), services
    return None, {}


def _wait_for_stage(up: subprocess.Popen[str], data: Path, stage: str) -> dict:
    deadline = time.monotonic() + 120
    seen: dict = {}
    while time.monotonic() < deadline:
        reached, services = _recorded(data)
        seen.update(services)
        # The worker and the API are spawned back to back (no wait between them), so a
        # stage counts as reached once it is recorded, with or without the next one.
        if reached == "up" or stage in services:
            assert stage == "up" or reached != "up", f"keel up was up before {stage} was seen"
            return seen
        assert up.poll() is None, f"keel up exited before {stage}: {up.communicate()[1][-2000:]}"
        time.sleep(0.01)
    raise AssertionError(f"keel up never reached {stage}; recorded {seen}")


def _gone(pids: list[int], ports: list[int], timeout_s: float = 15) -> tuple[list[int], list[int]]:
    """Pids still alive and ports still bound after waiting up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in pids if pid_alive(p)]
        bound = [p for p in ports if port_open(p)]
        if not (alive or bound) or time.monotonic() > deadline:
            return alive, bound
        time.sleep(0.1)


def _ports(env: dict[str, str]) -> list[int]:
    keys = ("KEEL_DEV_SERVER_PORT", "KEEL_DEV_SERVER_UI_PORT", "KEEL_API_PORT")
    return [int(env[k]) for k in (*keys, "KEEL_MODEL_SERVER_PORT")]


@pytest.mark.slow
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_stop_signal_at_any_stage_of_the_start_leaves_nothing(tmp_path, stage, sig):
    if stage == "model" and unavailable_reason():
        pytest.skip(f"the embedded model is not installed: {unavailable_reason()}")
    data = tmp_path / "keel"
    env = keel_env(data)
    args = ["up"] if stage == "model" else ["up", "--no-model"]
    up = subprocess.Popen(
        [*KEEL, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        services = _wait_for_stage(up, data, stage)
        os.kill(up.pid, sig)
        _, err = up.communicate(timeout=90)
    finally:
        stop_up(up)
    pids = [int(s["pid"]) for s in services.values()]
    alive, bound = _gone(pids, _ports(env))
    assert not alive, f"left running after {sig.name} at {stage}: {alive}\n{err[-2000:]}"
    assert not bound, f"ports still bound after {sig.name} at {stage}: {bound}"
    assert not (data / "run" / "up.json").exists()
    assert not (data / "run" / "starting.json").exists()
    if stage == "up":
        assert up.returncode == 0, err[-2000:]
    else:
        assert up.returncode == 128 + sig, err[-2000:]
        assert "during start-up" in err
    # Nothing is left to block the next start.
    assert "not running" in run(["down", "--text"], env, timeout=60).stdout


@pytest.mark.slow
def test_keel_down_stops_what_a_killed_keel_up_left(tmp_path):
    data = tmp_path / "keel"
    env = keel_env(data)
    up = subprocess.Popen(
        [*KEEL, "up", "--no-model"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        services = _wait_for_stage(up, data, "worker")
        os.kill(up.pid, signal.SIGKILL)  # nothing can catch it: its children stay
        up.wait(timeout=30)
    finally:
        stop_up(up)
    services.update(_recorded(data)[1])
    pids = [int(s["pid"]) for s in services.values()]
    assert any(pid_alive(p) for p in pids), "the killed keel up's services should still run"
    again = run(["up", "--no-model"], env, timeout=60)
    assert again.returncode == 1 and "keel down" in again.stderr
    down = run(["down", "--text"], env, timeout=60)
    assert down.returncode == 0 and "Keel is down" in down.stdout
    alive, bound = _gone(pids, _ports(env))
    assert not alive and not bound, (alive, bound)
    assert not (data / "run" / "starting.json").exists()
