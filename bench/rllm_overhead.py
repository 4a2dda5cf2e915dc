"""An ``.rllm`` run against the floor: one activity calling the same model server.

    uv run python bench/rllm_overhead.py [--runs 50] [--app examples/summary.rllm]

Everything runs on this machine in one process and one run: a Temporal dev server
(SQLite WAL), a scripted OpenAI-compatible HTTP server answering at once with a valid
answer, and one worker that runs both workflows. Measured, interleaved run by run:

* floor: ``FloorLLM`` (bench/floor.py), a workflow whose one activity makes the same
  LiteLLM call to the same server, started and awaited the same way;
* keel: the ``RllmApp`` workflow on the app (no uses, no blocks) end to end from the
  client (start -> result): load, input check, render, ``rllm.generate`` (gateway call +
  schema check), stats record;
* for reference, a direct ``litellm.completion`` to the server, with no Temporal at all.

Prints p50 and p90 of each, where the last Keel run's time went (from its history), and
ends with ``ratio <RllmApp p50 / floor p50>``. The model answers at once here, so the
ratio is the worst case: against a real model taking seconds it shrinks toward 1.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from temporalio.worker import Worker  # noqa: E402

from activities.llm import load_litellm  # noqa: E402
from bench.floor import FloorCall, FloorLLM, floor_complete  # noqa: E402
from bench.stats import p90  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.rllm.contracts import render_prompt, template_variables, validate_input  # noqa: E402
from keel.rllm.run import RllmRunInput, RllmRunResult  # noqa: E402
from keel.settings import Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from store.files import bundle_files  # noqa: E402
from store.files import load_rllm_app as load_app  # noqa: E402
from tests.support.scripted_openai import (  # noqa: E402
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from workers.main import WORKFLOWS, build_activities  # noqa: E402

TEXT = (
    "Temporal keeps workflow state durable in its event history. Workers poll task queues "
    "and run workflow and activity code. A crashed worker loses nothing: another one "
    "replays the history and carries on."
)


def p50(values: list[float]) -> float:
    return statistics.median(values)


def answer_for(schema: dict[str, object]) -> str:
    """A valid answer for the summary/keywords examples (what a good model would say)."""
    props = schema.get("properties", {})
    assert isinstance(props, dict)
    out: dict[str, object] = {}
    for name, prop in props.items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        out[name] = {"string": "Workers replay history.", "integer": 1, "array": ["temporal"]}.get(
            str(kind), "x"
        )
    return json.dumps(out)


async def history_steps(client: Any, workflow_id: str) -> list[tuple[str, float]]:
    """Where one run's time went, from its history: each activity (scheduled -> completed)
    and each workflow task (scheduled -> completed), in order."""
    from temporalio.api.enums.v1 import EventType

    history = await client.get_workflow_handle(workflow_id).fetch_history()
    t = {e.event_id: e.event_time.ToDatetime() for e in history.events}
    steps: list[tuple[str, float]] = []
    names: dict[int, str] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sched = e.activity_task_completed_event_attributes.scheduled_event_id
            ms = (t[e.event_id] - t[sched]).total_seconds() * 1000
            steps.append((f"activity {names[sched]}", ms))
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            sched = e.workflow_task_completed_event_attributes.scheduled_event_id
            steps.append(("workflow task", (t[e.event_id] - t[sched]).total_seconds() * 1000))
    first, last = history.events[0], history.events[-1]
    total = (t[last.event_id] - t[first.event_id]).total_seconds() * 1000
    steps.append(("server: started -> completed", total))
    return steps


async def main(runs: int, app_path: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-rllm-"))
    resolved = load_app(app_path)
    program = resolved.root
    answer = answer_for(program.llm_output_schema())
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    with ScriptedOpenAIServer(default=ScriptedReply(content=answer)) as model:
        cfg = write_models_config(tmp / "models.yaml", model.base_url)
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}", models_config=cfg,
        )  # fmt: skip
        try:
            # -- direct LiteLLM, for reference -----------------------------------------
            litellm = load_litellm()
            inputs = validate_input(program, {"text": TEXT})
            prompt = render_prompt(program, template_variables(program, inputs))
            params = {k: v for k, v in program.llm_params.items() if k != "seed"}
            direct: list[float] = []
            for i in range(runs + 3):
                t0 = time.perf_counter()
                litellm.completion(
                    model="openai/scripted",
                    api_base=model.base_url,
                    api_key="no-key",
                    messages=[{"role": "user", "content": prompt}],
                    response_format={"type": "json_object"},
                    num_retries=0,
                    **params,
                )
                if i >= 3:
                    direct.append((time.perf_counter() - t0) * 1000)

            # -- the floor and RllmApp, interleaved, one worker ------------------------
            client = await connect(settings)
            files = bundle_files(app_path)
            floor: list[float] = []
            wall: list[float] = []
            model_ms: list[float] = []
            overhead: list[float] = []
            worker = Worker(
                client,
                task_queue=settings.task_queue,
                workflows=[*WORKFLOWS, FloorLLM],
                activities=[*build_activities(settings), floor_complete],
                activity_executor=ThreadPoolExecutor(max_workers=8),
            )
            async with worker:
                for i in range(runs + 3):  # the first three warm up imports and caches
                    t0 = time.perf_counter()
                    await client.execute_workflow(
                        FloorLLM.run,
                        FloorCall(api_base=model.base_url, prompt=prompt),
                        id=f"floor/{uuid.uuid4()}",
                        task_queue=settings.task_queue,
                    )
                    t1 = time.perf_counter()
                    last_id = f"rllm/{program.name}/{uuid.uuid4()}"
                    result: RllmRunResult = await client.execute_workflow(
                        "RllmApp",
                        RllmRunInput(path=app_path.name, files=files, input={"text": TEXT}),
                        id=last_id,
                        task_queue=settings.task_queue,
                        result_type=RllmRunResult,
                    )
                    t2 = time.perf_counter()
                    if result.retries:
                        raise RuntimeError(f"unexpected retry: {result.attempts}")
                    if i >= 3:
                        floor.append((t1 - t0) * 1000)
                        ms = (t2 - t1) * 1000
                        wall.append(ms)
                        model_ms.append(result.llm_latency_ms)
                        overhead.append(ms - result.llm_latency_ms)
                steps = await history_steps(client, last_id)
        finally:
            server.stop()

    print(f"app {program.name} ({app_path}), {runs} runs each after 3 warm-up runs, this machine")
    print("model: scripted OpenAI-compatible HTTP server on loopback, instant valid answer")
    print(f"{'':<48}{'p50 ms':>9}{'p90 ms':>9}")
    rows = (
        ("direct litellm.completion (no Temporal)", direct),
        ("floor: FloorLLM, one activity, same call", floor),
        ("RllmApp workflow, wall (client start->result)", wall),
        ("  of which model time (gateway-measured)", model_ms),
        ("  Keel overhead = wall - model time", overhead),
    )
    for name, values in rows:
        print(f"{name:<48}{p50(values):>9.1f}{p90(values):>9.1f}")
    print("where the last RllmApp run's time went (from its history, ms):")
    for name, ms in steps:
        print(f"  {name:<46}{ms:>9.1f}")
    print(f"ratio {p50(wall) / p50(floor):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--app", type=Path, default=ROOT / "examples" / "summary.rllm")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.app))
