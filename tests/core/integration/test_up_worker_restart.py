"""``keel up`` as a user runs it: it names the console, ``keel status`` lists its services,
a second ``keel up`` is refused, a killed worker is restarted while Temporal and the API
stay up (issue 15 §5), a gate then completes through the API, and ``keel down`` stops
every service it started. One ``keel up`` for all of it: each start costs about 20 s."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from keel.settings import DEV_APPROVER_TOKEN, DEV_REQUESTER_TOKEN
from services.processes import pid_alive
from services.supervise import RESTART_FIRST_S, RESTART_MAX_S, Restarts
from tests.core.integration.test_cli import KEEL, keel_env, run, stop_up
from tests.support.faults import wait_gone_sync

log = logging.getLogger(__name__)


def _state(data_dir: Path) -> dict:
    return json.loads((data_dir / "run" / "up.json").read_text())


async def _polling_pids(address: str, task_queue: str) -> set[int]:
    """Pids of the workers polling ``task_queue`` for workflow tasks (identity ``pid@host``)."""
    client = await Client.connect(address)
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace="default",
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return {
        int(p.identity.split("@")[0]) for p in resp.pollers if p.identity.split("@")[0].isdigit()
    }


def test_restart_backoff_doubles_to_a_cap_and_resets_after_a_healthy_run():
    r = Restarts(last_start=0.0)
    delays = []
    for i in range(7):
        delays.append(r.schedule(float(i)))
        r.started(float(i))
    assert delays == [1, 2, 4, 8, 16, 30, 30]
    assert r.count == 7
    assert r.schedule(1000.0) == RESTART_FIRST_S  # it had run for a long while
    assert RESTART_MAX_S == 30


@pytest.mark.slow
def test_up_status_twin_worker_restart_gate_and_down(tmp_path):
    data = tmp_path / "keel"
    env = keel_env(data)
    up = subprocess.Popen(
        [*KEEL, "up", "--no-model"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (data / "run" / "up.json").exists():
            assert up.poll() is None, up.stderr.read() if up.stderr else ""
            assert time.monotonic() < deadline, "keel up did not come up"
            time.sleep(0.2)
        # keel up names the console beside the Web UI, and the API serves it there.
        assert up.stdout is not None
        printed: list[str] = []
        while not printed or not printed[-1].strip().startswith(("Console", "Stop with")):
            assert len(printed) < 30, printed
            printed.append(up.stdout.readline())
        console = printed[-1].split()[1]
        assert console == f"http://127.0.0.1:{env['KEEL_API_PORT']}/ui", printed
        page = httpx.get(console, timeout=10)
        assert page.status_code == 200 and "<title>Keel console</title>" in page.text
        status = run(["status", "--text"], env)
        assert status.returncode == 0, status.stderr
        for name in ("temporal", "worker", "api"):
            assert name in status.stdout
        assert "DEAD" not in status.stdout
        twin = run(["up", "--no-model"], env)
        assert twin.returncode == 1 and "already running" in twin.stderr
        first_pids = [int(line.split()[2]) for line in status.stdout.splitlines()[1:]]

        t_up = time.monotonic()
        before = _state(data)["services"]
        os.kill(int(before["worker"]["pid"]), signal.SIGKILL)

        deadline = time.monotonic() + 30
        while True:
            time.sleep(0.2)  # before the check: keel up may be stopping, up.json going away
            assert up.poll() is None, "keel up stopped when its worker died"
            after = _state(data)["services"]
            if after["worker"]["pid"] != before["worker"]["pid"]:
                break
            assert time.monotonic() < deadline, "the worker was not restarted"
        assert pid_alive(int(after["worker"]["pid"]))
        # The new worker needs a few seconds to import and connect before it polls.
        address, queue = after["temporal"]["address"], after["worker"]["task_queue"]
        while int(after["worker"]["pid"]) not in asyncio.run(_polling_pids(address, queue)):
            assert time.monotonic() < deadline + 60, "the restarted worker never polled"
            time.sleep(0.5)
        for name in ("temporal", "api"):
            assert after[name]["pid"] == before[name]["pid"] and pid_alive(int(after[name]["pid"]))

        t_polling = time.monotonic()
        api = after["api"]["address"]
        requester = {"Authorization": f"Bearer {DEV_REQUESTER_TOKEN}"}
        approver = {"Authorization": f"Bearer {DEV_APPROVER_TOKEN}"}
        with httpx.Client(base_url=api, timeout=30) as http:
            opened = http.post(
                "/gates", json={"name": "after-crash", "approvers": ["dev-approver"]},
                headers=requester,
            )  # fmt: skip
            assert opened.status_code == 201, opened.text
            gid = opened.json()["gate_id"]
            decided = http.post(f"/gates/{gid}/approve", json={}, headers=approver)
            assert decided.status_code == 200, decided.text
            assert decided.json()["status"] == "approved"
            for _ in range(100):
                final = http.get(f"/gates/{gid}", headers=approver).json()
                if final["status"] == "approved" and final["decided_by"] == "dev-approver":
                    break
                time.sleep(0.1)
            assert final["status"] == "approved" and final["decided_by"] == "dev-approver"
        log.info(
            "kill to polling %.1f s, gate opened and approved %.1f s",
            t_polling - t_up, time.monotonic() - t_polling,
        )  # fmt: skip
        assert up.poll() is None, "keel up is still supervising"
        status = run(["status", "--text"], env)
        assert status.returncode == 0 and "DEAD" not in status.stdout, status.stdout
        down = run(["down", "--text"], env)
        assert down.returncode == 0 and "down" in down.stdout
        up.wait(timeout=60)
        stderr = up.stderr.read() if up.stderr else ""
        assert "restarting it in 1s" in stderr and "worker restarted" in stderr, stderr
        wait_gone_sync(
            [*first_pids, int(after["worker"]["pid"])],
            what="every service keel up started, the restarted worker too, to be gone",
        )
        assert run(["status"], env).returncode == 3
    finally:
        stop_up(up)
