"""KEEL_RAY_ADDRESS on a real two-node Ray cluster (loopback): a worker joins it instead
of starting its own Ray, the job's shards run on both nodes with the code Ray shipped
(runtime_env working_dir), the digests equal a threads run's, and a node SIGKILLed
mid-map costs only its shards in flight.

The job is held at two points with the slow operator's ``hold`` file (a shard that has
slept waits while it exists), so the test does not depend on the machine's speed: until
a shard runs on each node (the second node starts its actor later: it unpacks the shipped
code first), and again when the second node is killed with a shard of its own in flight.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from activities import fanout
from activities.mrp.backends import RayBackend, get_backend
from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from tests.support.faults import wait_gone, wait_until
from tests.support.mrp_jobs import items_job_yaml, run_job
from tests.support.mrp_operators.slow.agent import count as slow_count
from tests.support.ray_cluster import RayCluster, is_loopback, listening, start_cluster
from workers.main import build_worker
from workflows.mrp import MRPJob

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_for_module")]


@pytest.fixture
def ray_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[RayCluster]:
    fanout.ray_shutdown()  # this process's local Ray, if an earlier test left one
    cluster = start_cluster()
    monkeypatch.setenv("KEEL_RAY_ADDRESS", cluster.address)
    try:
        yield cluster
    finally:
        fanout.ray_shutdown()  # disconnect only
        cluster.stop()


def job_yaml(job_id: str, state: Path, n: int) -> str:
    # A held shard waits inside its attempt: the shard timeout leaves room for the holds.
    params: dict[str, object] = {"sleep_s": 0.2, "state_dir": str(state)}
    policy = {"max_workers": 2, "max_shard_retries": 3, "shard_timeout_s": 240}
    return items_job_yaml(job_id, "slow@1.0.0", params, n, **policy, budget_units="1000")


def node_ids() -> dict[str, str]:
    """{"head" | "second": node id} from the cluster this process joined."""
    import ray

    out: dict[str, str] = {}
    for node in ray.nodes():
        for name in ("head", "second"):
            if name in node.get("Resources", {}):
                out[name] = node["NodeID"]
    return out


async def test_joined_cluster_runs_shards_on_both_nodes_and_survives_a_node_kill(
    client: Client, mrp_settings: Settings, tmp_path: Path, ray_cluster: RayCluster
) -> None:
    import ray

    n = 12
    job_id = f"ray-cluster-{uuid.uuid4().hex[:6]}"
    shards = [f"shard-{i:06d}" for i in range(n)]
    # The same job on threads first: the digests a joined cluster must reproduce.
    async with build_worker(client, mrp_settings):
        local = await run_job(
            client,
            mrp_settings,
            job_id,
            MRPJobInput(job_yaml=job_yaml(job_id, tmp_path / "local", n), backend="threads"),
        )
    assert local.status == "succeeded"

    state = tmp_path / "ray"
    state.mkdir()
    hold = state / "hold"
    hold.touch()  # every shard waits once it has slept, until released
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    started = lambda: {s for s in shards if slow_count(state, s, "runs") > 0}  # noqa: E731
    async with build_worker(client, mrp_settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=job_yaml(job_id, state, n), backend="ray", run_id=run_id),
            id=workflow_id_for(job_id, run_id),
            task_queue=mrp_settings.task_queue,
        )
        backend = get_backend("ray", 2)
        assert isinstance(backend, RayBackend)

        def reported() -> set[str]:
            return {s for s in shards if s in backend.shard_nodes}

        # Joined, not started: this process has no Ray node of its own.
        await wait_until(lambda: ray.is_initialized(), timeout_s=120, what="Ray to connect")
        assert fanout.ray_joined() and not fanout._ray_state["owned"]
        nodes = node_ids()
        assert set(nodes) == {"head", "second"}
        # Two actors of one CPU each on two one-CPU nodes: two shards running at once
        # means one on each node. Then let them finish.
        await wait_until(lambda: len(started()) >= 2, timeout_s=240, what="a shard on each node")
        hold.unlink()
        await wait_until(
            lambda: {backend.shard_nodes.get(s) for s in reported()} >= set(nodes.values()),
            timeout_s=120,
            what="a shard to finish on each node",
        )
        # Hold again until each node has a shard in flight (started, not reported), then
        # kill the second node: what it had in flight is all the kill may cost.
        hold.touch()
        await wait_until(
            lambda: len(started() - reported()) >= 2 or len(reported()) == n,
            timeout_s=120,
            what="a shard in flight on each node",
        )
        done_before, started_before = reported(), started()
        in_flight = started_before - done_before
        assert len(done_before) < n, "the map ended before the node could be killed"
        # Every server of the cluster, and this process's Ray client, listens on loopback.
        pids = ray_cluster.nodes["head"].tree() | ray_cluster.nodes["second"].tree()
        bound = listening(pids | {os.getpid()})
        assert bound and all(is_loopback(host) for host, _ in bound), bound
        killed = ray_cluster.nodes["second"].kill()
        await wait_gone(killed, timeout_s=30, what="the second Ray node to exit")
        hold.unlink()
        result: MRPJobResult = await asyncio.wait_for(handle.result(), timeout=240)

    assert result.status == "succeeded"
    assert result.output_digests == local.output_digests
    where = {s: backend.shard_nodes[s] for s in shards}
    assert set(where.values()) <= set(nodes.values())
    assert nodes["second"] in {where[s] for s in done_before}
    # After the kill, the head ran everything left.
    assert {where[s] for s in set(shards) - started_before} <= {nodes["head"]}
    # Each shard ran to the end at least once; the node's death cost only its shards in
    # flight: operator invocations beyond one per shard are at most those.
    assert all(slow_count(state, s, "done") >= 1 for s in shards)
    runs = {s: slow_count(state, s, "runs") for s in shards}
    assert sum(runs.values()) - n <= len(in_flight), (runs, in_flight)
    assert all(runs[s] == 1 for s in done_before), runs
    rows = list_shards(get_sessionmaker(mrp_settings.resolved_database_url), result.run_id)
    assert len(rows) == n and all(r.output_digest for r in rows)
    # The shards ran Keel's code as Ray shipped it (the job's working_dir on each node),
    # operators included, not the repository this test runs from.
    shipped = [
        p
        for p in ray_cluster.temp_root.glob("*/session_*/runtime_resources/working_dir_files/*")
        if p.is_dir()
    ]
    # Each node got its own copy: "h" (head) and "s" (second) are the nodes' temp dirs.
    assert {p.relative_to(ray_cluster.temp_root).parts[0] for p in shipped} == {"h", "s"}
    for copy in shipped:
        assert (copy / "activities" / "mrp" / "backends.py").is_file()
        assert (copy / "tests" / "support" / "mrp_operators" / "slow" / "operator.yaml").is_file()
        assert not (copy / ".venv").exists()
    # Keel never stops a cluster it joined: the head still answers after Keel disconnects.
    fanout.ray_shutdown()
    assert ray_cluster.nodes["head"].proc.poll() is None
    print(
        "shard -> node:",
        {s: ("head" if v == nodes["head"] else "second") for s, v in where.items()},
    )
