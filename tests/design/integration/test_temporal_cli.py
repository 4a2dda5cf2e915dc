"""``temporal workflow start --type DesignPipeline`` with plain JSON (the temporal CLI
binary), the questions answered with ``temporal workflow update execute``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

from temporalio.client import Client

from keel.design.steps import DesignResult
from keel.settings import Settings
from services.processes import find_binary
from workers.main import build_worker


async def temporal(*args: str, address: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI off the event loop: the worker runs on this loop, and an update waits
    for the worker to answer it."""
    return await asyncio.to_thread(
        subprocess.run,
        [find_binary("temporal"), *args, "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_start_and_answer_with_plain_json(
    client: Client, settings: Settings, temporal_address: str
) -> None:
    project = f"cli-{uuid.uuid4().hex[:8]}"
    wid = f"design/{project}/ds1"
    payload = {
        "project": project,
        "decision_set": "ds1",
        "requester": "alice",
        "intake": {"cloud": "aws", "workload_types": ["batch"], "data_classification": "internal"},
        "require_approval": False,
        "generate": False,
    }
    async with build_worker(client, settings):
        started = await temporal(
            "workflow", "start", "--type", "DesignPipeline", "--task-queue", settings.task_queue,
            "--workflow-id", wid, "--input", json.dumps(payload), address=temporal_address,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        handle = client.get_workflow_handle(wid, result_type=DesignResult)
        for _ in range(200):
            if (await handle.query("status"))["phase"] == "waiting_for_answers":
                break
            await asyncio.sleep(0.1)
        answers = {"answers": {"regions": ["us-east-1"], "budget_band": "medium"}}
        answered = await temporal(
            "workflow", "update", "execute", "--workflow-id", wid, "--name", "answers",
            "--input", json.dumps(answers), address=temporal_address,
        )  # fmt: skip
        assert answered.returncode == 0, answered.stderr
        assert "score" in answered.stdout  # the reply: the status after the answers
        result = await handle.result()
    assert result.status == "completed"
    assert result.constraints.regions == ["us-east-1"]
    assert result.policy is not None and result.policy.overall != "fail"
