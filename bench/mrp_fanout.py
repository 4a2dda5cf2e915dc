"""MRP fan-out: a 1,000-shard job through Keel against the same operator on raw Ray.

    uv run python bench/mrp_fanout.py [--shards 1000] [--workers 2] [--window 100] [--repeat 2]

One run of this script starts a Temporal dev server and an in-process Keel worker, then
for each repeat:

- **Keel**: the ``MRPJob`` workflow (compile, map windows on the ``ray`` backend with the
  store and the SQL run records, reduce, produce, finalise) over ``--shards`` inline items,
  one per shard, with the shipped ``word-count`` operator; timed from start to result.
  Every repeat uses new items (a new job id), so no shard comes from a checkpoint.
- **raw Ray**: the same operator (loaded and invoked through the same SDK call,
  ``invoke_map``, schema checks included) as one Ray task per shard on the same local
  Ray cluster, the items passed in, the outputs returned: no Temporal, no store, no SQL.

Both use one local Ray cluster (``num_cpus`` = ``--workers``), raw Ray first (the
worker's Ray backend keeps one actor per Ray CPU once it has run); a warm-up of each
comes first. Prints shards/s of both (end to end, and Keel's map phase alone),
the overhead ratio, and the workflow history events per 1,000 shards; then where Keel's
time went (phases, and per-shard latencies inside Ray from the shard records).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from activities.fanout import ray_init, ray_shutdown
from activities.mrp.operators import OperatorHandle, load_mrp_config
from bench.stats import p90
from client.temporal import connect
from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from services.processes import TemporalDevServer, free_port
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from workers.main import build_worker
from workflows.mrp import MRPJob

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
]


def job_yaml(job_id: str, shards: int, workers: int) -> str:
    items = [
        f"{i} " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8)) for i in range(shards)
    ]
    return (
        'dsl_version: "0.1"\n'
        f"job_id: {job_id}\n"
        f"inputs:\n  items: {json.dumps(items)}\n  by: item\n"
        "map:\n  operator: word-count@1.0.0\n"
        "reduce:\n  operator: numeric-sum@1.0.0\n"
        f"produce:\n  operator: json-writer@1.0.0\n  sink: {{kind: json, destination: {job_id}.json}}\n"
        f'policy:\n  max_workers: {workers}\n  budget_units: "{shards * 2 + 10}"\n'
    )


def raw_map(
    handle: OperatorHandle, items: list[JsonValue], params: dict[str, JsonValue], seed: int
) -> JsonValue:
    """One shard on raw Ray: the operator through the SDK, nothing stored."""
    from activities.mrp.operators import invoke_map
    from keel.mrp.sdk import OperatorContext

    ctx = OperatorContext(params=params, seed=seed, operator=handle.spec.ref)
    return invoke_map(handle.spec, handle.load(), items, ctx)


def run_raw(yaml_text: str, num_cpus: int, settings: Settings | None = None) -> tuple[float, int]:
    """Compile the job (for the same shards and seeds), run its map on raw Ray (the MRP
    config of ``settings``, default the shipped one)."""
    import ray

    config = load_mrp_config(settings or Settings())
    compiled = config.compile_job(yaml_text)
    handle = config.handle(compiled.ir.operators["map"].ref)
    params = dict(compiled.ir.operators["map"].params)
    remote = ray.remote(num_cpus=1, max_retries=0)(raw_map)
    shards = [
        (list(compiled.shard_inputs[t.input_digest].items or []), t.seed)
        for t in compiled.ir.map_tasks
    ]
    t0 = time.perf_counter()
    outputs = ray.get([remote.remote(handle, items, params, seed) for items, seed in shards])
    elapsed = time.perf_counter() - t0
    assert len(outputs) == len(shards) and all(isinstance(o, dict) for o in outputs)
    return elapsed, len(shards)


async def run_keel(
    client: Any, settings: Settings, yaml_text: str, job_id: str, window: int
) -> tuple[float, MRPJobResult, int]:
    run_id = uuid.uuid4().hex[:12]
    wid = workflow_id_for(job_id, run_id)
    t0 = time.perf_counter()
    handle = await client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=yaml_text, source=f"{job_id}.yaml", run_id=run_id,
                    backend="ray", window_size=window),
        id=wid,
        task_queue=settings.task_queue,
    )  # fmt: skip
    result: MRPJobResult = await handle.result()
    elapsed = time.perf_counter() - t0
    events = 0
    async for _ in handle.fetch_history_events():
        events += 1
    return elapsed, result, events


def cpu_by_process() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and every descendant, by name
    (this process is "worker+driver"; Ray actors are "ray::ShardRunner")."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, str, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        fields = rest.split()
        name = head.split("(", 1)[1]
        if argv and argv[0].startswith(b"ray::"):
            name = argv[0].decode(errors="replace")
        elif b"temporal" in argv[0]:
            name = "temporal dev server"
        stats[int(entry)] = (int(fields[1]), name, (int(fields[11]) + int(fields[12])) / tick)
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _, _) in stats.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    out: dict[str, float] = {}
    for pid in mine:
        if pid in stats:
            name = "worker+driver" if pid == os.getpid() else stats[pid][1]
            out[name] = out.get(name, 0.0) + stats[pid][2]
    return out


async def main(shards: int, workers: int, window: int, repeat: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-mrp-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}",
        )  # fmt: skip
        client = await connect(settings)
        config = load_mrp_config(settings)
        num_cpus = min(config.caps.max_workers, workers)
        keel_rows: list[tuple[float, float, int, MRPJobResult]] = []
        raw_rows: list[float] = []
        texts = [job_yaml(f"fanout-{r}-{uuid.uuid4().hex[:6]}", shards, workers)
                 for r in range(repeat)]  # fmt: skip
        # Raw Ray first: the worker's Ray backend keeps actors that hold every Ray CPU
        # once it has run, so raw tasks would wait behind them. Same cluster for both.
        ray_init(num_cpus)
        await asyncio.to_thread(run_raw, job_yaml("warm-raw", 20, workers), num_cpus)
        for text in texts:
            raw_elapsed, n = await asyncio.to_thread(run_raw, text, num_cpus)
            assert n == shards
            raw_rows.append(raw_elapsed)
        async with build_worker(client, settings):
            await run_keel(
                client, settings, job_yaml("warm-keel", 20, workers), "warm-keel", window
            )
            cpu_before = cpu_by_process()
            for text in texts:
                job_id = text.split("job_id: ", 1)[1].split("\n", 1)[0]
                elapsed, result, events = await run_keel(client, settings, text, job_id, window)
                assert result.status == "succeeded", result
                assert result.counters.run == shards, result.counters
                keel_rows.append((elapsed, result.phase_timings.get("map", 0.0), events, result))
            cpu_after = cpu_by_process()
        sessions = get_sessionmaker(settings.resolved_database_url)
        last = keel_rows[-1][3]
        latencies = [s.latency_ms for s in list_shards(sessions, last.run_id)]

        keel_e2e = statistics.median(r[0] for r in keel_rows)
        keel_map = statistics.median(r[1] for r in keel_rows)
        raw = statistics.median(raw_rows)
        median_events = statistics.median(r[2] for r in keel_rows)
        print(
            f"shards: {shards} (one item each, word-count), Ray num_cpus {num_cpus}, "
            f"window {window}, repeats {repeat}, medians; dev server (SQLite), this machine"
        )
        print(f"{'':<34}{'seconds':>9}{'shards/s':>10}")
        print(f"{'raw Ray (no Temporal, no store)':<34}{raw:>9.2f}{shards / raw:>10.1f}")
        print(f"{'Keel MRPJob, end to end':<34}{keel_e2e:>9.2f}{shards / keel_e2e:>10.1f}")
        print(f"{'Keel MRPJob, map phase':<34}{keel_map:>9.2f}{shards / keel_map:>10.1f}")
        print(f"overhead ratio (Keel end to end / raw Ray): {keel_e2e / raw:.2f}x")
        print(f"overhead ratio (Keel map phase / raw Ray):  {keel_map / raw:.2f}x")
        print(
            f"workflow history events: {median_events:.0f} for {shards} shards = "
            f"{median_events * 1000 / shards:.0f} per 1,000 shards"
        )
        timings = ", ".join(f"{k} {v:.2f}s" for k, v in last.phase_timings.items())
        print(f"last Keel run phases: {timings}")
        spent = {k: cpu_after.get(k, 0.0) - cpu_before.get(k, 0.0) for k in cpu_after}
        busy = sorted(((v, k) for k, v in spent.items() if v >= 0.05), reverse=True)
        wall = sum(r[0] for r in keel_rows)
        print(
            f"CPU seconds during the Keel runs ({wall:.1f} s wall): "
            + ", ".join(f"{k} {v:.1f}" for v, k in busy)
        )
        print(
            f"per-shard attempt latency (Ray task incl. store read/write), ms: "
            f"p50 {statistics.median(latencies):.1f}, p90 {p90(latencies):.1f}, "
            f"max {max(latencies):.1f}"
        )
    finally:
        ray_shutdown()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2, help="policy.max_workers (and Ray CPUs)")
    parser.add_argument("--window", type=int, default=100, help="shards per map window")
    parser.add_argument("--repeat", type=int, default=2)
    a = parser.parse_args()
    asyncio.run(main(a.shards, a.workers, a.window, a.repeat))
