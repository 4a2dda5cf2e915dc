"""MRPJob under faults, on the real dev server: flaky shards, a shard over its retry cap, the
budget kill switch, and a worker SIGKILLed mid-map (real Ray in a worker subprocess).

The test operators (tests/support/mrp_operators: flaky, slow, expensive) count their
attempts in files under ``params.state_dir``, so the tests read what really ran.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import sys
import uuid
from decimal import Decimal
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError, CancelledError

from keel.mrp import steps
from keel.mrp.run import ERROR_SHARD, MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.mrp_runs import get_manifest, get_run, list_shards
from tests.support.faults import cmdline, descendants, wait_gone, wait_until, worker_env
from tests.support.mrp_jobs import items_job_yaml, run_job
from tests.support.mrp_operators.flaky.agent import attempts as flaky_attempts
from tests.support.mrp_operators.slow.agent import count as slow_count
from workers.main import build_worker
from workflows.mrp import MRPJob

REPO = Path(__file__).resolve().parents[3]
TEST_CONFIG = REPO / "tests" / "support" / "mrp_operators" / "mrp.yaml"


pytestmark = pytest.mark.usefixtures("ray_for_module")


async def test_flaky_shard_is_retried_and_counted(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "flaky"
    params = {"state_dir": str(state), "fail_times": 2, "only_shards": ["shard-000001"]}
    yaml_text = items_job_yaml(
        "flaky-ok",
        "flaky@1.0.0",
        params,
        4,
        max_workers=2,
        max_shard_retries=3,
        budget_units="100",
    )
    async with build_worker(client, mrp_settings):
        result = await run_job(
            client, mrp_settings, "flaky-ok", MRPJobInput(job_yaml=yaml_text, backend="ray")
        )
    assert result.status == "succeeded"
    assert result.counters.retried == 2 and result.counters.run == 4
    assert result.counters.failed == 0
    assert flaky_attempts(state, "shard-000001") == 3
    assert [flaky_attempts(state, f"shard-{i:06d}") for i in (0, 2, 3)] == [1, 1, 1]
    shards = list_shards(get_sessionmaker(mrp_settings.resolved_database_url), result.run_id)
    assert [(s.shard_id, s.attempts, s.executions) for s in shards][1] == ("shard-000001", 3, 1)


async def test_shard_over_its_retry_cap_fails_the_job_naming_it(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "flaky"
    params = {"state_dir": str(state), "fail_times": 10, "only_shards": ["shard-000002"]}
    yaml_text = items_job_yaml(
        "flaky-cap",
        "flaky@1.0.0",
        params,
        4,
        max_workers=2,
        max_shard_retries=2,
        budget_units="100",
    )
    async with build_worker(client, mrp_settings):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client, mrp_settings, "flaky-cap", MRPJobInput(job_yaml=yaml_text, backend="ray")
            )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_SHARD
    assert "shard-000002" in cause.message and "retry cap 2" in cause.message
    assert flaky_attempts(state, "shard-000002") == 3  # first try + 2 retries, no more
    run_id = cause.details[-1]["run_id"]  # type: ignore[index]
    sm = get_sessionmaker(mrp_settings.resolved_database_url)
    run = get_run(sm, run_id)
    assert run is not None and run.status == "failed" and "shard-000002" in (run.error or "")
    manifest = get_manifest(sm, artifact_store_from_settings(mrp_settings), run_id)
    assert manifest is not None and manifest.partial and manifest.produced == []
    failed = [s for s in manifest.shards if s.state == "failed"]
    assert [(s.shard_id, s.attempts) for s in failed] == [("shard-000002", 3)]


async def test_budget_kill_switch_stops_the_run_without_a_sink(
    client: Client, mrp_settings: Settings
) -> None:
    # Estimated 100 units a shard (cost_weight); each shard really costs 100 + 100 metered,
    # so the run passes 1.2 x its estimate part way through the map phase.
    yaml_text = items_job_yaml(
        "budget-kill",
        "expensive@1.0.0",
        {"extra_units_per_item": "100"},
        10,
        max_workers=2,
        budget_units="100000",
    )
    async with build_worker(client, mrp_settings):
        result = await run_job(
            client,
            mrp_settings,
            "budget-kill",
            MRPJobInput(job_yaml=yaml_text, backend="threads", window_size=2),
        )
    assert result.status == "budget_exceeded"
    assert result.cost.tripped == "units" and result.cost.units > result.cost.limit_units
    assert result.cost.limit_units == result.cost.estimate_units * 12 / 10
    assert 0 < result.counters.run < 10 and result.counters.cancelled > 0
    assert result.produced == [] and "reduce" not in result.output_digests
    sm = get_sessionmaker(mrp_settings.resolved_database_url)
    manifest = get_manifest(sm, artifact_store_from_settings(mrp_settings), result.run_id)
    assert manifest is not None and manifest.partial and manifest.status == "budget_exceeded"
    assert manifest.reduce_digest is None and manifest.produced == []
    # No sink: nothing under the run's output root.
    out_root = mrp_settings.data_dir / "mrp" / "output" / "budget-kill" / result.run_id
    assert not out_root.exists()


async def test_kill_switch_cancels_windows_still_running(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    """Every shard fails twice before it succeeds, so each costs 3 units against an estimate
    of 1; with 4 one-shard windows in flight the kill switch trips at the sixth shard. The
    first shard is held (the flaky operator's ``hold``) until the run has ended, so one
    window is surely running when it trips: the workflow cancels it and waits until it has
    stopped. (Without the hold, on a loaded machine every window still in flight could be
    one launched in the same workflow task that tripped: cancelled before it was ever sent.)"""
    state = tmp_path / "flaky"
    state.mkdir()
    (state / "hold").touch()
    held = "shard-000000"
    params = {"state_dir": str(state), "fail_times": 2, "hold_shards": [held]}
    yaml_text = items_job_yaml(
        "budget-cancel",
        "flaky@1.0.0",
        params,
        12,
        max_workers=4,
        max_shard_retries=3,
        budget_units="100",
    )
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, mrp_settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=yaml_text, backend="threads", window_size=1, run_id=run_id),
            id=workflow_id_for("budget-cancel", run_id),
            task_queue=mrp_settings.task_queue,
        )
        try:
            result = await handle.result()
        finally:
            (state / "hold").unlink()
        # The held attempt's thread goes on once released; let it end before the worker.
        await wait_until(
            lambda: flaky_attempts(state, held) == 1, timeout_s=10, what="the held shard ends"
        )
    assert result.status == "budget_exceeded" and result.cost.tripped == "units"
    assert result.cost.limit_units == Decimal("16.8")  # 1.2 x (12 map + reduce + produce)
    assert result.counters.cancelled > 0 and result.produced == []
    # Each window the workflow asked to cancel ended before the workflow did: cancelled,
    # or completed when it finished its shard before the request reached it. The held
    # shard's window is among them, and it was cancelled: it never finished its shard.
    requested: set[int] = set()
    ended: dict[int, str] = {}
    held_window: int | None = None
    async for event in handle.fetch_history_events():
        t = event.event_type
        if t == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            inp = json.loads(attrs.input.payloads[0].data)
            if attrs.activity_type.name == steps.MAP_WINDOW.name and inp["start"] == 0:
                held_window = event.event_id  # the window of shard-000000 alone
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
            requested.add(event.activity_task_cancel_requested_event_attributes.scheduled_event_id)
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            ended[event.activity_task_canceled_event_attributes.scheduled_event_id] = "canceled"
        elif t == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            ended[event.activity_task_completed_event_attributes.scheduled_event_id] = "completed"
    assert held_window is not None and held_window in requested
    assert ended[held_window] == "canceled"
    assert requested <= set(ended)


async def test_cancelled_workflow_stops_its_windows_and_records_the_run(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "slow"
    yaml_text = items_job_yaml(
        "cancelled",
        "slow@1.0.0",
        {"sleep_s": 0.3, "state_dir": str(state)},
        40,
        max_workers=2,
        budget_units="1000",
    )
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    async with build_worker(client, mrp_settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=yaml_text, backend="threads", window_size=10, run_id=run_id),
            id=workflow_id_for("cancelled", run_id),
            task_queue=mrp_settings.task_queue,
        )
        await wait_until(
            lambda: sum(slow_count(state, f"shard-{i:06d}") for i in range(40)) >= 3,
            timeout_s=60,
            what="3 shards to finish",
        )
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as info:
            await handle.result()
    assert isinstance(info.value.cause, CancelledError)
    sm = get_sessionmaker(mrp_settings.resolved_database_url)
    run = get_run(sm, run_id)
    assert run is not None and run.status == "failed" and run.error == "workflow cancelled"
    manifest = get_manifest(sm, artifact_store_from_settings(mrp_settings), run_id)
    assert manifest is not None and manifest.partial and manifest.produced == []
    assert 0 < sum(s.state == "succeeded" for s in manifest.shards) < 40
    # The windows stopped: no shard starts after the run was recorded.
    started = sum(slow_count(state, f"shard-{i:06d}", "runs") for i in range(40))
    await asyncio.sleep(1.0)
    assert sum(slow_count(state, f"shard-{i:06d}", "runs") for i in range(40)) == started


async def test_shard_past_its_timeout_is_cancelled_on_ray(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    state = tmp_path / "slow"
    yaml_text = items_job_yaml(
        "timeout",
        "slow@1.0.0",
        {"sleep_s": 30, "state_dir": str(state)},
        1,
        max_workers=1,
        max_shard_retries=1,
        shard_timeout_s=2,
        budget_units="100",
    )
    async with build_worker(client, mrp_settings):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client, mrp_settings, "timeout", MRPJobInput(job_yaml=yaml_text, backend="ray")
            )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_SHARD
    assert "shard-000000" in cause.message and "shard timeout of 2s" in cause.message
    # Two attempts started (first try + 1 retry); the Ray worker of each was killed, so
    # neither finished its 30 s sleep.
    assert slow_count(state, "shard-000000", "runs") == 2
    assert slow_count(state, "shard-000000", "done") == 0


@pytest.mark.slow
async def test_worker_sigkill_mid_map_resumes_without_recompute(
    client: Client,
    mrp_settings: Settings,
    tmp_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
) -> None:
    """SIGKILL the worker (and its Ray cluster) while a window runs; a new worker finishes
    the job. Shards finished before the kill are skipped, never recomputed; the replay of
    the run recomputes every shard and reproduces every digest."""
    settings = mrp_settings
    state = tmp_path / "slow"
    n = 12
    yaml_text = items_job_yaml(
        "kill-mid-map",
        "slow@1.0.0",
        {"sleep_s": 0.4, "state_dir": str(state)},
        n,
        max_workers=2,
        budget_units="1000",
    )
    env = worker_env(settings) | {"KEEL_MRP_CONFIG": str(TEST_CONFIG)}
    log_path = tmp_path / "worker.log"
    worker = ManagedProcess(
        "keel worker", [sys.executable, "-m", "cli.keel", "worker"], log_path=log_path, env=env
    )
    spawned.append(worker)
    worker.start()
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    handle = await client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=yaml_text, backend="ray", window_size=n, run_id=run_id),
        id=workflow_id_for("kill-mid-map", run_id),
        task_queue=settings.task_queue,
    )
    done = lambda: sum(slow_count(state, f"shard-{i:06d}") for i in range(n))  # noqa: E731
    await wait_until(
        lambda: not worker.running() or done() >= 4,
        timeout_s=180,
        what="the worker to finish 4 shards",
    )
    assert worker.running(), f"worker exited early:\n{log_path.read_text()}"
    tree = descendants(worker.pid) | {worker.pid}
    cmdlines = [cmdline(p) for p in tree]
    assert any("raylet" in c for c in cmdlines), cmdlines
    # The Ray temp dir the killed worker cannot remove itself (/tmp/keel-ray-*).
    ray_dirs = {m for c in cmdlines for m in re.findall(r"/tmp/keel-ray-[A-Za-z0-9_]+", c)}
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.proc is not None and worker.proc.wait(timeout=10) == -signal.SIGKILL
    # The worker, its Ray cluster and Ray's workers are all gone.
    await wait_gone(tree, pgid=worker.pid, timeout_s=30, what="Ray processes to exit")
    for d in ray_dirs:
        shutil.rmtree(d, ignore_errors=True)
    sm = get_sessionmaker(settings.resolved_database_url)
    finished_before = {s.shard_id for s in list_shards(sm, run_id) if s.output_digest}
    assert 0 < len(finished_before) < n

    async with build_worker(client, settings, max_cached_workflows=0):
        result: MRPJobResult = await asyncio.wait_for(handle.result(), timeout=240)
    assert result.status == "succeeded"
    # The retried window skipped what the dead worker had finished.
    assert result.counters.skipped >= len(finished_before)
    assert result.counters.run + result.counters.skipped == n
    shards = {s.shard_id: s for s in list_shards(sm, run_id)}
    for shard_id in finished_before:
        assert shards[shard_id].executions == 1, shard_id
        assert slow_count(state, shard_id, "done") == 1, shard_id  # never ran again
    assert all(slow_count(state, f"shard-{i:06d}", "done") >= 1 for i in range(n))

    # A replay recomputes every shard and must reproduce the crashed run's digests.
    async with build_worker(client, settings):
        replay = await run_job(
            client, settings, "kill-mid-map", MRPJobInput(replay_of=run_id, backend="threads")
        )
    assert replay.replay_matched is True and replay.output_digests == result.output_digests
