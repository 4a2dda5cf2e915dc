"""Design pipeline: orchestration overhead and time to artifact.

    uv run python bench/design_pipeline.py [--runs 2]

One dev server and one in-process worker run here (loopback, stopped by PID at the end).

1. Overhead: ``--runs`` pipelines with free-text intake on the scripted OpenAI server
   (the reply is the batch-training golden snapshot), template codegen, the validators
   and no gate. For each: the wall time from start to result, and the sum of its node
   times from the history: every activity's started → completed, and every workflow
   task's started → completed (the pure nodes run there). Prints both, their difference
   and ``ratio wall/nodes``, the orchestration overhead as a ratio (1.00 = none).
2. Time to artifact: ``--runs`` pipelines on the default (embedded) models config with
   the guided intake form, so no model is called: start → ``archive_digest`` in the
   result (codegen, validators, persist with its git commit included).

Prints medians; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client, WorkflowHandle  # noqa: E402

from client.design import decide, start_design, status  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.design.steps import DesignInput, DesignResult  # noqa: E402
from keel.settings import Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from tests.design.unit.design_data import golden_cases  # noqa: E402
from tests.support.scripted_openai import (  # noqa: E402
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from workers.main import build_worker  # noqa: E402

BATCH = golden_cases()["batch_training"]


async def node_times(handle: WorkflowHandle[Any, Any]) -> tuple[dict[str, float], float]:
    """Seconds per activity type (started → completed, every attempt that completed) and
    the workflow tasks' total (started → completed)."""
    names: dict[int, str] = {}
    started: dict[int, Any] = {}
    activities: dict[str, float] = defaultdict(float)
    workflow_s = 0.0
    async for e in handle.fetch_history_events():
        t = e.event_time.ToDatetime()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type in (
            EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
            EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        ):
            started[e.event_id] = t
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            a = e.activity_task_completed_event_attributes
            activities[names[a.scheduled_event_id]] += (
                t - started[a.started_event_id]
            ).total_seconds()
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            w = e.workflow_task_completed_event_attributes
            workflow_s += (t - started[w.started_event_id]).total_seconds()
    return dict(activities), workflow_s


async def one_run(
    client: Client, settings: Settings, **kw: Any
) -> tuple[float, DesignResult, WorkflowHandle[Any, Any]]:
    inp = DesignInput(
        project=f"bench-{uuid.uuid4().hex[:8]}",
        decision_set="ds1",
        requester="bench",
        require_approval=False,
        **kw,
    )
    t0 = time.perf_counter()
    handle = await start_design(client, inp, task_queue=settings.task_queue)
    waiting = asyncio.ensure_future(handle.result())
    approved: set[int] = set()
    while not waiting.done():
        # require_approval=False, but a policy failure or a cost rise forces the gate
        # (docs/design.md §23.5): approve it as a reviewer would, and say so.
        await asyncio.wait({waiting}, timeout=0.25)
        now = None if waiting.done() else await status(client, inp.project, inp.decision_set)
        if now is not None and now.gate_id and now.plan_round not in approved:
            await decide(client, inp.project, inp.decision_set, now.plan_round, "approve",
                         actor="bench-reviewer")  # fmt: skip
            approved.add(now.plan_round)
            print(f"  (gate {now.gate_id} forced by policy: approved by bench-reviewer)")
    result: DesignResult = waiting.result()
    return time.perf_counter() - t0, result, handle


async def overhead_part(address: str, tmp: Path, runs: int) -> None:
    reply = json.dumps({"constraints": BATCH["constraints"], "ambiguous": {}})
    with ScriptedOpenAIServer(default=ScriptedReply(content=reply)) as llm:
        settings = Settings(
            env="test",
            data_dir=tmp / "keel-overhead",
            temporal_address=address,
            task_queue=f"bench-design-{uuid.uuid4().hex[:8]}",
            metrics_port=0,
            models_config=write_models_config(tmp / "models.yaml", llm.base_url),
        )
        client = await connect(settings)
        walls, sums, ratios = [], [], []
        async with build_worker(client, settings):
            for i in range(runs):
                wall, result, handle = await one_run(client, settings, requirements=BATCH["text"])
                acts, wf = await node_times(handle)
                nodes = sum(acts.values()) + wf
                walls.append(wall)
                sums.append(nodes)
                ratios.append(wall / nodes)
                per = ", ".join(f"{k} {v:.2f}" for k, v in sorted(acts.items()))
                print(
                    f"run {i + 1}: {result.status}, validators {sorted(set(result.validation.values()))}; "
                    f"wall {wall:.2f} s, nodes {nodes:.2f} s (activities: {per}; "
                    f"workflow tasks {wf:.3f} s)"
                )
    w, n = statistics.median(walls), statistics.median(sums)
    print(
        f"overhead: wall p50 {w:.2f} s, sum of node times p50 {n:.2f} s, difference {w - n:.2f} s"
    )
    print(f"ratio wall/nodes {statistics.median(ratios):.3f}")


async def artifact_part(address: str, tmp: Path, runs: int) -> None:
    settings = Settings(
        env="test",
        data_dir=tmp / "keel-artifact",
        temporal_address=address,
        task_queue=f"bench-design-{uuid.uuid4().hex[:8]}",
        metrics_port=0,
    )
    client = await connect(settings)
    times = []
    async with build_worker(client, settings):
        for i in range(runs):
            wall, result, _ = await one_run(client, settings, intake=BATCH["constraints"])
            if not result.archive_digest:
                raise SystemExit(f"run {i + 1} gave no archive: {result.status}")
            times.append(wall)
            print(
                f"run {i + 1}: {result.file_count} files, archive {result.archive_digest[:19]}…, "
                f"commit {(result.git_commit or '-')[:10]} in {wall:.2f} s"
            )
    print(
        f"time to artifact (guided intake, template codegen) p50 {statistics.median(times):.2f} s"
    )


async def main_async(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="keel-bench-design-") as tmp_s:
        tmp = Path(tmp_s)
        server = TemporalDevServer(
            db_file=tmp / "temporal.db",
            log_path=tmp / "temporal.log",
            port=free_port(),
            ui_port=None,
        )
        server.start()
        try:
            await overhead_part(server.address, tmp, runs)
            await artifact_part(server.address, tmp, runs)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} cores")
    asyncio.run(main_async(args.runs))


if __name__ == "__main__":
    main()
