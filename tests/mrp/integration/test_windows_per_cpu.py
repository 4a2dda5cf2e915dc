"""Windows in flight follow the CPUs compile reports (patch ``mrp-windows-per-cpu``).

The compile activity reports the backend's CPUs (``CompiledJob.backend_cpus``); here it is
made to report 64 so the workflow keeps every one of 8 windows of 2 shards in flight at
once (before the patch: 4). The history is replayed against today's code; with
``KEEL_RECORD_MRP_HISTORY=1`` it is also written to ``tests/mrp/histories`` (committed:
``test_mrp_histories_replay`` replays it).
"""

from __future__ import annotations

import pytest
from temporalio.client import Client

import activities.mrp.activities as mrp_activities
from keel.mrp.run import MRPJobInput, workflow_id_for
from keel.settings import Settings
from tests.mrp.histories import check_and_record, windows_before_first_done
from tests.support.mrp_jobs import items_job_yaml
from workers.main import build_worker
from workflows.mrp import PATCH_WINDOWS_PER_CPU, MRPJob


async def test_windows_in_flight_follow_the_reported_cpus(
    client: Client, mrp_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(mrp_activities, "backend_cpus", lambda name, max_workers: 64)
    yaml_text = items_job_yaml(
        "mrp-cpu-windows", "word-count@1.0.0", {}, 16, max_workers=16, budget_units="1000"
    )
    run_id = "rec-cpu-windows"
    async with build_worker(client, mrp_settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=yaml_text, backend="threads", window_size=2, run_id=run_id),
            id=workflow_id_for("mrp-cpu-windows", run_id),
            task_queue=mrp_settings.task_queue,
        )
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "succeeded", result
    assert result.counters.run == 16
    # Every window was scheduled before the first one finished: 8 in flight (was 4).
    assert windows_before_first_done(history) == 8
    await check_and_record("mrp_windows_per_cpu", history, PATCH_WINDOWS_PER_CPU)
