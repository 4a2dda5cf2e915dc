"""Two ``keel worker`` processes on one task queue share an MRP job; one is SIGKILLed
mid-map and the other finishes it: no shard lost, none recomputed once recorded. Rows
(shard records) and operator invocations (the slow operator's own counts) are counted."""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus

from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from tests.support.faults import sigkill, wait_until, worker_env
from tests.support.mrp_jobs import items_job_yaml
from tests.support.mrp_operators import TEST_CONFIG
from tests.support.mrp_operators.slow.agent import count as slow_count
from workflows.mrp import MRPJob


def job_yaml(job_id: str, state: Path, n: int) -> str:
    params: dict[str, object] = {"sleep_s": 0.5, "state_dir": str(state)}
    return items_job_yaml(job_id, "slow@1.0.0", params, n, max_workers=4, budget_units="1000")


def start_worker(
    settings: Settings, log: Path, spawned: list[ManagedProcess | TemporalDevServer]
) -> ManagedProcess:
    env = worker_env(settings) | {"KEEL_MRP_CONFIG": str(TEST_CONFIG)}
    worker = ManagedProcess(
        "keel worker", [sys.executable, "-m", "cli.keel", "worker"], log_path=log, env=env
    )
    spawned.append(worker)
    worker.start()
    return worker


@pytest.mark.slow
async def test_two_workers_share_a_job_and_one_killed_loses_and_doubles_nothing(
    client: Client,
    mrp_settings: Settings,
    tmp_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
) -> None:
    settings = mrp_settings
    logs = [tmp_path / "worker-a.log", tmp_path / "worker-b.log"]
    workers = [start_worker(settings, log, spawned) for log in logs]
    for w, log in zip(workers, logs, strict=True):
        await wait_until(
            lambda w=w, log=log: (
                not w.running() or "worker ready" in log.read_text(errors="replace")
            ),
            timeout_s=120,
            what="both workers to poll",
        )
        assert w.running(), log.read_text()
    identity = {w.pid: f"{w.pid}@" for w in workers}

    n = 24
    job_id = f"two-workers-{uuid.uuid4().hex[:6]}"
    state = tmp_path / "slow"
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    # Held from the start until both workers are seen polling: the job (24 half-second
    # shards) can end before that on a loaded machine (clean-clone run 11).
    state.mkdir(parents=True)
    (state / "hold").touch()
    handle = await client.start_workflow(
        MRPJob.run,
        # Two-shard windows on threads: many activities for the two workers to share.
        MRPJobInput(
            job_yaml=job_yaml(job_id, state, n), backend="threads", window_size=2, run_id=run_id
        ),
        id=workflow_id_for(job_id, run_id),
        task_queue=settings.task_queue,
    )

    # Both poll the queue's activity tasks (a worker shows among the pollers once its
    # first poll reaches the server: wait for it, with a bound).
    async def polling() -> set[str]:
        desc = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=settings.task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        return {p.identity.split("@")[0] for p in desc.pollers}

    pids = {str(w.pid) for w in workers}
    for _ in range(120):
        if pids <= await polling():
            break
        await asyncio.sleep(0.5)
    assert pids <= await polling(), await polling()
    (state / "hold").unlink()

    async def running_on() -> set[int]:
        desc = await handle.describe()
        ids = {
            a.last_worker_identity
            for a in desc.raw_description.pending_activities
            if a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
        }
        return {pid for pid, prefix in identity.items() if any(i.startswith(prefix) for i in ids)}

    done = lambda: sum(slow_count(state, f"shard-{i:06d}") for i in range(n))  # noqa: E731

    async def four_done() -> bool:
        if done() >= 4:
            return True
        # A job that ended (a refused operator, say) fails the test now, not at the timeout.
        closed = (await handle.describe()).status != WorkflowExecutionStatus.RUNNING
        assert not closed, await handle.result()
        return False

    await wait_until(four_done, timeout_s=120, what="4 shards to finish", interval_s=0.2)
    # Hold the job mid-map (shards in flight wait before they finish), so a map window
    # is surely running when a worker is killed, however loaded the machine is.
    (state / "hold").touch()
    busy: set[int] = set()

    async def some_running() -> bool:
        nonlocal busy
        busy = await running_on()
        return bool(busy)

    await wait_until(some_running, timeout_s=60, what="a map window running on a worker")
    # Kill a worker while it runs a map window of this job; the job goes on once released.
    victim = next(w for w in workers if w.pid in busy)
    survivor = next(w for w in workers if w is not victim)
    await sigkill(victim)

    sm = get_sessionmaker(settings.resolved_database_url)
    shards = [f"shard-{i:06d}" for i in range(n)]
    recorded = {s.shard_id for s in list_shards(sm, run_id) if s.output_digest}
    started = {s for s in shards if slow_count(state, s, "runs") > 0}
    in_flight = started - recorded
    assert 0 < len(recorded) < n
    (state / "hold").unlink()

    result: MRPJobResult = await asyncio.wait_for(handle.result(), timeout=240)
    assert survivor.running()
    assert result.status == "succeeded" and result.counters.failed == 0
    assert result.counters.run + result.counters.skipped == n
    # Rows: one per shard, each with its output; none recorded twice once it had one.
    rows = {s.shard_id: s for s in list_shards(sm, run_id)}
    assert sorted(rows) == shards and all(r.output_digest for r in rows.values())
    assert all(rows[s].executions == 1 for s in recorded), {s: rows[s].executions for s in recorded}
    # Operator invocations: every shard finished; recorded ones never ran again, and the
    # kill cost at most the shards in flight on the killed worker.
    runs = {s: slow_count(state, s, "runs") for s in shards}
    assert all(slow_count(state, s, "done") >= 1 for s in shards)
    assert all(runs[s] == 1 for s in recorded), runs
    assert sum(runs.values()) - n <= len(in_flight), (runs, in_flight)
    # Map windows ran on both: the victim's before the kill, the survivor's after.
    ran_on: set[str] = set()
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            ran_on.add(event.activity_task_started_event_attributes.identity.split("@")[0])
    assert {str(victim.pid), str(survivor.pid)} <= ran_on, ran_on
