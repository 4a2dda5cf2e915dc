"""History size of ``MRPJob``: events per run for trivial jobs of N shards, on a real dev server.

    uv run python bench/mrp_history.py [--shards 1000 10000] [--window 100] [--backend threads]

Each job maps ``word-count`` over N one-word items (one item per shard), reduces with
``numeric-sum`` and writes JSON. For each N it prints the history event count, the events
per 1,000 shards, the history size in bytes, the number of map windows and the wall time.
Everything runs here: its own dev server (loopback, free port, a temp dir), SQLite, a
local artifact store, the shipped operators and ``configs/mrp.yaml`` (max 10,000 shards).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.api.enums.v1 import EventType

from activities.fanout import ray_shutdown
from client.temporal import connect
from keel.mrp.run import MRPJobInput, workflow_id_for
from keel.settings import Settings
from services.processes import TemporalDevServer, free_port
from workers.main import build_worker
from workflows.mrp import MRPJob


def job(job_id: str, shards: int, max_workers: int = 8, operator: str = "word-count@1.0.0") -> str:
    items = json.dumps([f"w{i}" for i in range(shards)])
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {items}
  by: item
map:
  operator: {operator}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: {max_workers}
  budget_units: "1000000"
"""


async def main(sizes: list[int], window: int, backend: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-mrp-hist-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}", metrics_port=0,
        )  # fmt: skip
        client = await connect(settings)
        print(f"backend={backend} window={window}")
        print("shards  windows  events  events/1k shards  history bytes  wall s  status")
        async with build_worker(client, settings):
            for n in sizes:
                job_id = f"hist-{n}"
                run_id = uuid.uuid4().hex[:8]
                t0 = time.perf_counter()
                result = await client.execute_workflow(
                    MRPJob.run,
                    MRPJobInput(
                        job_yaml=job(job_id, n),
                        backend=backend,  # type: ignore[arg-type]
                        window_size=window,
                        run_id=run_id,
                    ),
                    id=workflow_id_for(job_id, run_id),
                    task_queue=settings.task_queue,
                )
                wall = time.perf_counter() - t0
                handle = client.get_workflow_handle(workflow_id_for(job_id, run_id))
                history = await handle.fetch_history()
                events = len(history.events)
                size = len(history.to_json())
                windows = sum(
                    1
                    for e in history.events
                    if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                    and e.activity_task_scheduled_event_attributes.activity_type.name
                    == "mrp.map_window"
                )
                print(
                    f"{n:6d}  {windows:7d}  {events:6d}  {events * 1000 / n:16.1f}  "
                    f"{size:13d}  {wall:6.1f}  {result.status}",
                    flush=True,
                )
                print(f"        phase seconds: {result.phase_timings}", flush=True)
    finally:
        ray_shutdown()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shards", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--window", type=int, default=100)
    parser.add_argument("--backend", choices=["threads", "ray"], default="threads")
    args = parser.parse_args()
    asyncio.run(main(args.shards, args.window, args.backend))
