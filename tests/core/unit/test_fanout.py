"""activities.fanout on a real local Ray cluster, with an actor class that knows nothing of
MRP: pooled actors answer, gather keeps order, a deadline raises, a discarded actor's
process is gone and the pool starts a new one."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from activities import fanout
from tests.support.fanout_actors import Echo
from tests.support.faults import cmdline, descendants


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    # A Ray of this process left up by another module would hold its CPUs
    # with idle shard actors: start this module's pools on a Ray of their own.
    fanout.ray_shutdown()
    yield
    fanout.ray_shutdown()


@pytest.mark.full_tier
async def test_pool_gather_timeout_and_discard(ray_cluster: None) -> None:
    pool = fanout.ActorPool(Echo, 2)
    a, b = await pool.acquire(), await pool.acquire()
    got = await fanout.gather(
        [a.handle.echo.remote(i) for i in range(3)] + [b.handle.echo.remote(9)]
    )
    assert [v for v, _ in got] == [0, 1, 2, 9]
    pids = {pid for _, pid in got}
    assert len(pids) == 2  # two actors, two processes

    with pytest.raises(TimeoutError):
        await fanout.gather([a.handle.echo.remote(1, nap_s=30.0)], timeout_s=0.5)
    slow_pid = got[0][1]
    pool.discard(a)
    pool.release(b)
    # The pool replaces the killed actor: a new process, and the survivor is reused.
    c, d = await pool.acquire(), await pool.acquire()
    fresh = await fanout.gather([c.handle.echo.remote(1), d.handle.echo.remote(2)])
    fresh_pids = {pid for _, pid in fresh}
    assert slow_pid not in fresh_pids
    assert got[3][1] in fresh_pids


async def test_ray_workers_defer_the_iri_grammar_and_still_check_iris(ray_cluster: None) -> None:
    """activities/ray_site/sitecustomize.py runs first in the cluster's workers: the
    grammar that ``import ray`` would build is a stand-in until the first ``iri`` check,
    which is then made by the real grammar."""
    import ray

    from tests.support.fanout_actors import iri_checks

    fanout.ray_init(1)
    deferred, verdicts = await asyncio.to_thread(ray.get, ray.remote(iri_checks).remote())
    assert deferred is True
    assert verdicts == [True, False]


async def test_local_raylet_gives_its_agents_time_to_start(ray_cluster: None) -> None:
    """The raylet of the local Ray waits :data:`fanout.AGENT_WAIT_MS` for its runtime-env
    agent, not Ray's 30 s (tests/support/ray_cluster.py shows a raylet leaving at 30 s
    when the agents start slowly, and staying with the longer wait)."""
    fanout.ray_init(1)
    temp_dir = fanout._ray_state["temp_dir"]  # this Ray's, whatever else runs here
    raylets = [
        pid
        for pid in descendants(os.getpid())
        if (cmd := cmdline(pid)).split(" ", 1)[0].endswith("/raylet") and temp_dir in cmd
    ]
    assert len(raylets) == 1, raylets
    environ = Path(f"/proc/{raylets[0]}/environ").read_bytes().split(b"\0")
    assert f"RAY_agent_register_timeout_ms={fanout.AGENT_WAIT_MS}".encode() in environ
    # ... and only the Ray it started: this process's own environment is as it was.
    assert "RAY_agent_register_timeout_ms" not in os.environ
