"""KEEL_RAY_ADDRESS on a real two-node Ray cluster (loopback): a `keel worker` joins it
instead of starting its own Ray, the job's shards run on both nodes with the code Ray
shipped (runtime_env working_dir), the digests equal a threads run's, and a node SIGKILLed
mid-map costs only its shards in flight.

The worker is a process of its own, as in production, with the cluster's auth mode
(``RAY_AUTH_MODE=disabled``, as the nodes have): a local Ray started in this test process
by an earlier test sets ``RAY_AUTH_MODE=token`` in its environment, and a worker that
inherited it joined the cluster but never got an actor started. The slow operator
names the node of each run by the path its code was loaded from (each node's copy of the
shipped code), and the job is held with its ``hold`` file (a shard that has slept waits
while it exists), so the test does not depend on the machine's speed: until a shard runs
on each node (the second node starts its actor later: it unpacks the shipped code
first), and again when the second node is killed with a shard of its own in flight.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from tests.support.faults import descendants, wait_gone, wait_until, worker_env
from tests.support.mrp_jobs import items_job_yaml, run_job
from tests.support.mrp_operators import TEST_CONFIG
from tests.support.mrp_operators.slow.agent import count as slow_count
from tests.support.mrp_operators.slow.agent import where as slow_where
from tests.support.ray_cluster import (
    RAY_ENV,
    RayCluster,
    is_loopback,
    listening,
    running_cluster,
)
from workers.main import build_worker
from workflows.mrp import MRPJob

# The cluster's start may take three tries of up to 2 x 150 s on a loaded host (see
# tests/support/ray_cluster.py; a crashed node is given up at once), and pytest-timeout
# counts the fixture's setup.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture
def ray_cluster() -> Iterator[RayCluster]:
    """The two-node cluster; one that does not come up fails the test, never skips it
    (tests/mrp/unit/test_ray_cluster_fixture.py)."""
    with running_cluster() as cluster:
        yield cluster


def job_yaml(job_id: str, state: Path, n: int) -> str:
    # A held shard waits inside its attempt: the shard timeout leaves room for the holds.
    params: dict[str, object] = {"sleep_s": 0.2, "state_dir": str(state)}
    policy = {"max_workers": 2, "max_shard_retries": 3, "shard_timeout_s": 240}
    return items_job_yaml(job_id, "slow@1.0.0", params, n, **policy, budget_units="1000")


async def test_joined_cluster_runs_shards_on_both_nodes_and_survives_a_node_kill(
    client: Client,
    mrp_settings: Settings,
    tmp_path: Path,
    ray_cluster: RayCluster,
    spawned: list[ManagedProcess | TemporalDevServer],
) -> None:
    n = 12
    job_id = f"ray-cluster-{uuid.uuid4().hex[:6]}"
    shards = [f"shard-{i:06d}" for i in range(n)]
    # The same job on threads first (no Ray): the digests a joined cluster must reproduce.
    async with build_worker(client, mrp_settings):
        local = await run_job(
            client,
            mrp_settings,
            job_id,
            MRPJobInput(job_yaml=job_yaml(job_id, tmp_path / "local", n), backend="threads"),
        )
    assert local.status == "succeeded"

    log = tmp_path / "worker.log"
    env = worker_env(mrp_settings) | {
        "KEEL_MRP_CONFIG": str(TEST_CONFIG),
        "KEEL_RAY_ADDRESS": ray_cluster.address,
        "RAY_AUTH_MODE": RAY_ENV["RAY_AUTH_MODE"],  # the cluster's (see the docstring)
    }
    worker = ManagedProcess(
        "keel worker", [sys.executable, "-m", "cli.keel", "worker"], log_path=log, env=env
    )
    spawned.append(worker)
    worker.start()
    await wait_until(
        lambda: not worker.running() or "worker ready" in log.read_text(errors="replace"),
        timeout_s=120,
        what="the worker to poll",
    )
    assert worker.running(), log.read_text()

    state = tmp_path / "ray"
    state.mkdir()
    hold = state / "hold"
    hold.touch()  # every shard waits once it has slept, until released
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    handle = await client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=job_yaml(job_id, state, n), backend="ray", run_id=run_id),
        id=workflow_id_for(job_id, run_id),
        task_queue=mrp_settings.task_queue,
    )
    sm = get_sessionmaker(mrp_settings.resolved_database_url)
    temp_root = ray_cluster.temp_root

    def node(path: str) -> str:
        """ "h" (head) or "s" (second): the node temp dir the code was loaded from."""
        return Path(path).relative_to(temp_root).parts[0]

    def started() -> set[str]:
        return {s for s in shards if slow_count(state, s, "runs") > 0}

    def recorded() -> set[str]:
        return {r.shard_id for r in list_shards(sm, run_id) if r.output_digest}

    def nodes_of(done: set[str]) -> set[str]:
        return {node(slow_where(state, s)[-1]) for s in done}

    # Two actors of one CPU each on two one-CPU nodes: two shards running at once means
    # one on each node. Then let them finish and be recorded.
    await wait_until(lambda: len(started()) >= 2, timeout_s=240, what="a shard on each node")
    assert {node(p) for s in started() for p in slow_where(state, s)} == {"h", "s"}
    hold.unlink()
    await wait_until(
        lambda: nodes_of(recorded()) == {"h", "s"},
        timeout_s=120,
        what="a shard recorded from each node",
    )
    # Hold again until each node has a shard in flight (started, not recorded), then kill
    # the second node: what was in flight is all the kill may cost.
    hold.touch()
    await wait_until(
        lambda: len(started() - recorded()) >= 2 or len(recorded()) == n,
        timeout_s=120,
        what="a shard in flight on each node",
    )
    done_before, started_before = recorded(), started()
    in_flight = started_before - done_before
    assert len(done_before) < n, "the map ended before the node could be killed"
    # Every server of the cluster, and the worker's own Ray client, listens on loopback.
    nodes = ray_cluster.nodes
    pids = nodes["head"].tree() | nodes["second"].tree() | descendants(worker.pid) | {worker.pid}
    bound = listening(pids)
    assert bound and all(is_loopback(host) for host, _ in bound), bound
    killed = nodes["second"].kill()
    await wait_gone(killed, timeout_s=30, what="the second Ray node to exit")
    hold.unlink()
    result: MRPJobResult = await asyncio.wait_for(handle.result(), timeout=240)

    assert result.status == "succeeded"
    assert result.output_digests == local.output_digests
    assert "s" in nodes_of(done_before)
    # After the kill, the head ran everything left.
    assert nodes_of(set(shards) - started_before) <= {"h"}
    # Each shard ran to the end at least once; the node's death cost only its shards in
    # flight: operator invocations beyond one per shard are at most those.
    assert all(slow_count(state, s, "done") >= 1 for s in shards)
    runs = {s: slow_count(state, s, "runs") for s in shards}
    assert sum(runs.values()) - n <= len(in_flight), (runs, in_flight)
    assert all(runs[s] == 1 for s in done_before), runs
    rows = list_shards(sm, result.run_id)
    assert len(rows) == n and all(r.output_digest for r in rows)
    # The shards ran Keel's code as Ray shipped it (the job's working_dir on each node),
    # operators included, not the repository this test runs from.
    shipped = [
        p for p in temp_root.glob("*/session_*/runtime_resources/working_dir_files/*") if p.is_dir()
    ]
    assert {node(str(p)) for p in shipped} == {"h", "s"}
    for copy in shipped:
        assert (copy / "activities" / "mrp" / "backends.py").is_file()
        assert (copy / "tests" / "support" / "mrp_operators" / "slow" / "operator.yaml").is_file()
        assert not (copy / ".venv").exists()
    # Keel never stops a cluster it joined: the head still runs after the worker stops.
    worker.stop()
    assert nodes["head"].proc.poll() is None
    print("shard -> node:", {s: [node(p) for p in slow_where(state, s)] for s in shards})
