"""MRP at volume: a pure job of many shards on Ray, through a real ``keel worker``, against
the same map on raw Ray tasks in the same run; history sizes; a ``kill -9`` mid-map.

    uv run python bench/mrp_scale.py [--shards N] [--window 1000] [--workers 2]
                                     [--kill-shards 2000] [--kill-window 100]

Issue 26 §2 asks for 100,000 shards. On the 2-core machine that size does not fit the
10-minute bound of one run (raw Ray, a cold and a warm Keel job, the kill job), so the
default is scaled down to ``--shards 10000``. Timed small sizes (2 cores shared with a
test-suite run, ``nice -n 19``): 1,000 shards 2.9-4.7 min in all, 5,000 shards 4.1 min,
of which ~2-2.5 min do not depend on the size (dev server and Ray starts, the worker's
start, the kill job); the warm Keel jobs took 8-14 ms a shard there (a few ms on an idle
machine), so 10,000 shards take ~5-8 min loaded and 100,000 would take ~30-50 min.
(Those warm times were before the operator hosts stopped re-checking each shard's
operator schemas: 2,000 warm shards now take 1.2-1.5 ms a shard loaded, docs/mrp-runtime.md.)
Every Keel and raw Ray time grows linearly with the shard count (compile stores one
payload per shard, each window records its shards' rows, raw Ray runs one task per
shard): the 100,000-shard times are about 10x the printed ones and the ratios stay; run
``--shards 100000`` where the time is there to measure it directly. The history size does
not grow with shards but with windows: ~6 events per map window, ``shards / window``
windows (10 at the default size, 100 at 100,000 shards with the default window 1,000).

One run of this script, everything on loopback, in a temp dir, stopped by PID at the end:

1. **Floor (raw Ray)**: the job's map (``word-count`` on one one-word item per shard,
   the operator loaded and invoked through the same SDK call, ``invoke_map``, as
   ``bench/mrp_fanout.py`` does) as one Ray task per shard on a local Ray cluster of
   ``--workers`` CPUs in this process; a small warm-up first. Ray is then shut down.
2. **Keel**: a ``keel worker`` subprocess (backend ``ray``, the same CPU count, a bench
   MRP config whose shard cap admits the size) runs the ``MRPJob`` of the same shards
   twice, new job ids so nothing comes from a checkpoint: the first job after the worker
   started (**cold**: it starts the worker's Ray cluster and actors) and the next one
   (**warm**), each timed from start to result. Every history (each run and child)
   is counted with ``fetch_history_events``.
3. **kill -9 mid-map**: a job of ``--kill-shards`` shards of the test operator ``slow``
   (``tests/support/mrp_operators``: it counts each shard's starts and finishes in a
   state dir); once a fifth of them finished, the job is held mid-map, the worker's
   process group (it, its Ray cluster, Ray's workers) gets SIGKILL, and a new worker
   finishes the job. Prints the shards recorded before the kill and how many of them
   the operator ran again (the goal: 0), and the in-flight shards run twice.

The last line: ``floor <raw Ray s> s  keel <warm Keel s> s  ratio <Keel/raw>`` (goal <= 1.5).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from activities.fanout import ray_init, ray_shutdown
from bench.harness import bench_settings, dev_server
from bench.mrp_fanout import run_raw
from bench.mrp_history import job
from bench.volume import (
    history_line,
    history_sizes,
    keel_worker,
    kill9,
    stop_worker,
    wait_ready,
)
from client.temporal import connect
from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from services.processes import ManagedProcess
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from tests.support.mrp_jobs import items_job_yaml
from tests.support.mrp_operators import TEST_CONFIG
from tests.support.mrp_operators.slow.agent import count as slow_count
from workflows.mrp import MRPJob


def bench_config(path: Path, shards: int, workers: int) -> Path:
    """The test MRP config (shipped operators + ``slow``) with caps that admit ``shards``
    and ``workers``, its operator paths made absolute."""
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg["operator_paths"] = [str((TEST_CONFIG.parent / p).resolve()) for p in cfg["operator_paths"]]
    cfg["caps"]["max_shards"] = max(shards, cfg["caps"]["max_shards"])
    cfg["caps"]["max_workers"] = workers
    cfg["caps"]["max_budget_units"] = str(max(10 * shards, 1_000_000))
    path.write_text(yaml.safe_dump(cfg))
    return path


async def run_keel(
    client: Any, settings: Settings, text: str, job_id: str, window: int
) -> tuple[float, MRPJobResult, Any]:
    run_id = uuid.uuid4().hex[:12]
    wid = workflow_id_for(job_id, run_id)
    t0 = time.perf_counter()
    handle = await client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=text, run_id=run_id, backend="ray", window_size=window),
        id=wid,
        task_queue=settings.task_queue,
    )
    result: MRPJobResult = await handle.result()
    return time.perf_counter() - t0, result, handle


async def kill_part(
    client: Any, settings: Settings, tmp: Path, env: dict[str, str], n: int, window: int,
    workers: int, first: ManagedProcess,
) -> tuple[int, int, int, int, int, dict[str, int], ManagedProcess]:  # fmt: skip
    """The kill -9 job; returns (recorded before, recomputed of those, in flight, extra
    runs in all, executions > 1 among recorded rows, history sizes, the new worker)."""
    state = tmp / "slow"
    job_id = f"kill-{uuid.uuid4().hex[:6]}"
    run_id = uuid.uuid4().hex[:12]
    text = items_job_yaml(
        job_id, "slow@1.0.0", {"sleep_s": 0.002, "state_dir": str(state)}, n,
        max_workers=workers, budget_units=str(10 * n + 100),
    )  # fmt: skip
    wid = workflow_id_for(job_id, run_id)
    handle = await client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=text, run_id=run_id, backend="ray", window_size=window),
        id=wid,
        task_queue=settings.task_queue,
    )
    shards = [f"shard-{i:06d}" for i in range(n)]
    done = lambda: sum(slow_count(state, s) for s in shards)  # noqa: E731
    deadline = time.monotonic() + 300
    while done() < max(1, n // 5):
        if time.monotonic() > deadline or not first.running():
            raise SystemExit("the kill job did not reach a fifth of its shards")
        await asyncio.sleep(0.2)
    (state / "hold").touch()  # shards in flight now wait: a window surely runs at the kill
    await asyncio.sleep(0.5)
    await kill9(first)
    sm = get_sessionmaker(settings.resolved_database_url)
    recorded = {s.shard_id for s in list_shards(sm, run_id) if s.output_digest}
    in_flight = {s for s in shards if slow_count(state, s, "runs") > 0} - recorded
    (state / "hold").unlink()
    log = tmp / "worker-2.log"
    second = keel_worker(settings, log, env)
    await wait_ready(second, log)
    result: MRPJobResult = await asyncio.wait_for(handle.result(), timeout=600)
    assert result.status == "succeeded", result
    assert result.counters.run + result.counters.skipped == n, result.counters
    runs = {s: slow_count(state, s, "runs") for s in shards}
    assert all(slow_count(state, s) >= 1 for s in shards), "a shard never finished"
    rows = {s.shard_id: s for s in list_shards(sm, run_id)}
    assert sorted(rows) == shards and all(r.output_digest for r in rows.values())
    again = sum(1 for s in recorded if runs[s] > 1)
    doubled_rows = sum(1 for s in recorded if rows[s].executions != 1)
    sizes = await history_sizes(client, wid, handle.first_execution_run_id)
    return (len(recorded), again, len(in_flight), sum(runs.values()) - n, doubled_rows,
            sizes, second)  # fmt: skip


async def main(shards: int, window: int, workers: int, kill_shards: int, kill_window: int) -> None:
    with dev_server("keel-bench-mrp-scale-") as (server, tmp):
        workers_started: list[ManagedProcess] = []
        try:
            config = bench_config(tmp / "mrp.yaml", max(shards, kill_shards), workers)
            settings = bench_settings(server, tmp, metrics_port=0, mrp_config=config)
            env = {
                "KEEL_MRP_CONFIG": str(config),
                "KEEL_MODELS_CONFIG": str(settings.models_config),
            }
            client = await connect(settings)
            texts = {
                k: (jid := f"scale-{k}-{uuid.uuid4().hex[:6]}", job(jid, shards, workers))
                for k in ("cold", "warm")
            }

            # 1. The floor: raw Ray tasks in this process, then Ray is shut down.
            t0 = time.perf_counter()
            ray_init(workers)
            await asyncio.to_thread(run_raw, job("warm-raw", 20, workers), workers, settings)
            raw, n = await asyncio.to_thread(run_raw, texts["warm"][1], workers, settings)
            assert n == shards
            ray_shutdown()
            raw_part = time.perf_counter() - t0

            # 2. Keel: a worker process; its first job (cold), then a second (warm).
            log = tmp / "worker-1.log"
            first = keel_worker(settings, log, env)
            workers_started.append(first)
            await wait_ready(first, log)
            timed: dict[str, tuple[float, MRPJobResult]] = {}
            sizes: dict[str, int] = {}
            for kind, (job_id, text) in texts.items():
                elapsed, result, handle = await run_keel(client, settings, text, job_id, window)
                assert result.status == "succeeded", result
                assert result.counters.run == shards, result.counters
                timed[kind] = (elapsed, result)
                sizes |= await history_sizes(client, handle.id, handle.first_execution_run_id)

            # 3. kill -9 mid-map, a new worker finishes.
            t1 = time.perf_counter()
            recorded, again, in_flight, extra, doubled, kill_sizes, second = await kill_part(
                client, settings, tmp, env, kill_shards, kill_window, workers, first
            )
            workers_started.append(second)
            kill_wall = time.perf_counter() - t1
            sizes |= kill_sizes

            warm = timed["warm"][0]
            print(
                f"shards: {shards} (one one-word item each, word-count), window {window}, "
                f"Ray CPUs {workers}; dev server (SQLite), a keel worker process, this machine"
            )
            print(f"{'':<40}{'seconds':>9}{'shards/s':>10}{'ratio':>8}")
            print(f"{'raw Ray tasks (floor)':<40}{raw:>9.2f}{shards / raw:>10.1f}{1:>8.2f}")
            for kind, (elapsed, result) in timed.items():
                m = result.phase_timings.get("map", 0.0)
                print(f"{f'Keel {kind}, end to end':<40}{elapsed:>9.2f}{shards / elapsed:>10.1f}"
                      f"{elapsed / raw:>8.2f}")  # fmt: skip
                print(f"{f'Keel {kind}, map phase':<40}{m:>9.2f}{shards / m:>10.1f}{m / raw:>8.2f}")
                phases = ", ".join(f"{k} {v:.2f}" for k, v in result.phase_timings.items())
                print(f"  {kind} phases (s): {phases}")
            print(history_line(sizes))
            print(
                f"kill -9 mid-map ({kill_shards} slow shards, window {kill_window}, "
                f"{kill_wall:.1f} s): {recorded} shards recorded before the kill, "
                f"{again} of them recomputed, {doubled} with executions != 1; {in_flight} in "
                f"flight at the kill, {extra} operator runs beyond one per shard"
            )
            print(f"(raw Ray part incl. Ray start {raw_part:.1f} s)")
            print(f"floor {raw:.2f} s  keel {warm:.2f} s  ratio {warm / raw:.2f}")
        finally:
            for w in workers_started:
                stop_worker(w)
            ray_shutdown()
    # After the dev server stopped; a run that failed keeps its folder (the worker logs).
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, default=10_000)
    parser.add_argument("--window", type=int, default=1000, help="shards per map window")
    parser.add_argument("--workers", type=int, default=2, help="Ray CPUs and policy.max_workers")
    parser.add_argument("--kill-shards", type=int, default=2000)
    parser.add_argument("--kill-window", type=int, default=100)
    a = parser.parse_args()
    asyncio.run(main(a.shards, a.window, a.workers, a.kill_shards, a.kill_window))
