"""A Ray run keeps one window more in flight than its workers need (patch
``mrp-window-ahead``): the next window is scheduled and set up while the others run, so
no actor waits for it between windows.

A job of 16 shards in windows of 2 with 2 workers kept 2 windows in flight (one worker
each); with the patch a third is scheduled before the first finishes, and its shards still
run on the same 2 actors. The history is replayed against today's code; with
``KEEL_RECORD_MRP_HISTORY=1`` it is also written to ``tests/mrp/histories`` (committed:
``test_mrp_histories_replay`` replays it).
"""

from __future__ import annotations

from temporalio.client import Client

from keel.mrp.run import MRPJobInput, workflow_id_for
from keel.settings import Settings
from tests.mrp.histories import check_and_record, windows_before_first_done
from tests.support.mrp_jobs import items_job_yaml
from workers.main import build_worker
from workflows.mrp import PATCH_WINDOW_AHEAD, MRPJob


async def test_a_ray_run_keeps_one_window_ahead(client: Client, mrp_settings: Settings) -> None:
    yaml_text = items_job_yaml(
        "mrp-window-ahead", "word-count@1.0.0", {}, 16, max_workers=2, budget_units="1000"
    )
    run_id = "rec-window-ahead"
    async with build_worker(client, mrp_settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=yaml_text, backend="ray", window_size=2, run_id=run_id),
            id=workflow_id_for("mrp-window-ahead", run_id),
            task_queue=mrp_settings.task_queue,
        )
        result = await handle.result()
        history = await handle.fetch_history()
    assert result.status == "succeeded", result
    assert (result.counters.run, result.counters.total) == (16, 16)
    # Three windows were scheduled before the first one finished (was 2).
    assert windows_before_first_done(history) == 3
    await check_and_record("mrp_window_ahead", history, PATCH_WINDOW_AHEAD)
