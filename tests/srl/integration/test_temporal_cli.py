"""``temporal workflow start --type SRLCollection`` with plain JSON (the temporal CLI
binary): the task file named by a path the worker reads, the result read back."""

from __future__ import annotations

import json
import subprocess
import uuid

from temporalio.client import Client

from keel.settings import Settings
from keel.srl.steps import CollectionResult
from services.processes import find_binary
from store.db import get_sessionmaker
from store.srl_steps import list_steps
from tests.srl.conftest import EXAMPLE_TASKS
from workers.main import build_worker


async def test_start_srlcollection_with_plain_json(
    client: Client, settings: Settings, temporal_address: str
) -> None:
    collection = f"cli-{uuid.uuid4().hex[:8]}"
    payload = json.dumps({"collection": collection, "tasks_file": str(EXAMPLE_TASKS)})
    async with build_worker(client, settings):
        started = subprocess.run(
            [find_binary("temporal"), "workflow", "start", "--type", "SRLCollection",
             "--task-queue", settings.task_queue, "--workflow-id", f"srl/{collection}",
             "--input", payload, "--address", temporal_address],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        handle = client.get_workflow_handle(f"srl/{collection}", result_type=CollectionResult)
        result = await handle.result()
    assert result.task_count == 6 and result.totals.verified_steps == 6
    assert result.tasks_digest.startswith("blake3:")
    rows = list_steps(get_sessionmaker(settings.resolved_database_url), collection)
    assert len(rows) == 6 and all(r.verified for r in rows)
