"""``temporal workflow start --type MRPJob`` with plain JSON (the temporal CLI binary), a
real worker, the result read back with the same binary."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from temporalio.client import Client

from keel.mrp.run import MRPJobResult
from keel.settings import Settings
from services.processes import find_binary
from workers.main import build_worker

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "mrp"


def temporal(args: list[str], address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_binary("temporal"), *args, "--address", address],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


async def test_start_mrpjob_with_plain_json(
    client: Client, settings: Settings, temporal_address: str
) -> None:
    wid = "mrp/example-invoices/temporal-cli-1"
    payload = json.dumps(
        {
            "job_yaml": (EXAMPLES / "invoices.yaml").read_text(),
            "source": "invoices.yaml",
            "backend": "threads",
        }
    )
    async with build_worker(client, settings):
        started = temporal(
            ["workflow", "start", "--type", "MRPJob", "--task-queue", settings.task_queue,
             "--workflow-id", wid, "--input", payload],
            temporal_address,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        result = await client.get_workflow_handle(wid, result_type=MRPJobResult).result()
    assert result.status == "succeeded"
    # run_id defaults to the last segment of the workflow id.
    assert result.run_id == "temporal-cli-1" and result.job_id == "example-invoices"
    golden = json.loads((EXAMPLES / "golden.json").read_text())["invoices"]
    assert result.output_digests == golden
    # The binary reads the result back as plain JSON too.
    shown = temporal(
        ["workflow", "result", "--workflow-id", wid, "--output", "json"], temporal_address
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["result"]["status"] == "succeeded"
