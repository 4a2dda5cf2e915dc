"""The floor with one local activity in its first workflow task, against the floor.

    uv run python bench/local_activity_dispatch.py [--runs 50] [--pause-ms 10]

One dev server (SQLite WAL), one scripted OpenAI-compatible server and one worker run in
this process. Interleaved run by run, each started and awaited from the client:

* floor: ``FloorLLM`` (bench/floor.py), one activity making one LiteLLM call;
* ``FloorLocalFirst``: the same workflow with a local activity that sleeps ``--pause-ms``
  before the activity, in the first workflow task, where ``RllmApp`` runs ``rllm.load``.

Without a delay of its own, the local activity would add about ``--pause-ms`` (and one
more workflow activation) to a run. On the dev server's default queue read limit it added
about 50 ms, whatever the pause: each task waited for the next 50 ms mark of the history
service's reads, and the activity's answer came just after one (docs/rllm-runtime.md, "The
50 ms grid"). With the limit Keel's dev server sets, it adds about 16 ms for a 10 ms pause
(2026-11-26: 56.9 against 40.6 ms p50, dispatch waits 2-3 ms). This bench shows what a
server and machine do. Prints p50 and p90 of each, how long each dispatch waited
(scheduled to started, p50), and ends with ``ratio <FloorLocalFirst p50 / floor p50>``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.llm import load_litellm_async  # noqa: E402
from bench.floor import (  # noqa: E402
    FloorCall,
    FloorLLM,
    FloorLocalFirst,
    FloorPausedCall,
    floor_complete,
    floor_pause,
)
from bench.stats import p90  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.settings import Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply  # noqa: E402


async def dispatch_waits(client: Any, workflow_id: str) -> list[float]:
    """Each workflow task's wait from scheduled to started, in order (ms)."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled: dict[int, Any] = {}
    waits = []
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled[e.event_id] = e.event_time.ToDatetime()
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            start = scheduled[e.workflow_task_started_event_attributes.scheduled_event_id]
            waits.append((e.event_time.ToDatetime() - start).total_seconds() * 1000)
    return waits


async def main(runs: int, pause_ms: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-la-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        with ScriptedOpenAIServer(default=ScriptedReply(content='{"ok": true}')) as model:
            settings = Settings(
                env="test", data_dir=tmp / "keel", temporal_address=server.address,
                task_queue=f"bench-{uuid.uuid4()}",
            )  # fmt: skip
            client = await connect(settings)
            await load_litellm_async()
            call = FloorCall(api_base=model.base_url, prompt="Say ok.")
            shapes: dict[str, tuple[Any, Any]] = {
                "floor: FloorLLM, one activity": (FloorLLM.run, call),
                f"FloorLocalFirst, {pause_ms} ms local activity first": (
                    FloorLocalFirst.run,
                    FloorPausedCall(call=call, pause_ms=pause_ms),
                ),
            }
            wall: dict[str, list[float]] = {name: [] for name in shapes}
            waits: dict[str, list[list[float]]] = {name: [] for name in shapes}
            worker = Worker(
                client,
                task_queue=settings.task_queue,
                workflows=[FloorLLM, FloorLocalFirst],
                activities=[floor_complete, floor_pause],
                activity_executor=ThreadPoolExecutor(max_workers=4),
            )
            async with worker:
                for i in range(runs + 3):  # the first three warm up imports and caches
                    for name, (run, arg) in shapes.items():
                        workflow_id = f"bench-la/{uuid.uuid4()}"
                        t0 = time.perf_counter()
                        await client.execute_workflow(
                            run, arg, id=workflow_id, task_queue=settings.task_queue
                        )
                        if i >= 3:
                            wall[name].append((time.perf_counter() - t0) * 1000)
                            waits[name].append(await dispatch_waits(client, workflow_id))
    finally:
        server.stop()
    print(f"{runs} runs each, interleaved, one worker, dev server (SQLite WAL), this machine")
    print(f"{'':<44}{'p50 ms':>9}{'p90 ms':>9}   dispatch waits p50 ms")
    for name, values in wall.items():
        firsts = statistics.median(w[0] for w in waits[name])
        seconds = statistics.median(w[1] for w in waits[name])
        print(
            f"{name:<44}{statistics.median(values):>9.1f}{p90(values):>9.1f}"
            f"   first task {firsts:.1f}, after the activity {seconds:.1f}"
        )
    floor, local = (statistics.median(v) for v in wall.values())
    print(f"ratio {local / floor:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--pause-ms", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.pause_ms))
