"""Keel's overhead per ``.rllm`` run, excluding model time, against a direct LiteLLM call.

    uv run python bench/rllm_overhead.py [--runs 30] [--app examples/summary.rllm]

Everything runs on this machine in one process and one run: a Temporal dev server
(SQLite WAL), a scripted OpenAI-compatible HTTP server answering at once with a valid
answer, and one Keel worker. Measured:

* direct: ``litellm.completion`` to the scripted server with the app's rendered prompt
  and parameters (LiteLLM's own retries off), N times;
* keel: the ``RllmApp`` workflow end to end from the client (start -> result), N times:
  load activity, input check, render, ``rllm.generate`` (gateway call + schema check),
  stats record. Overhead per run = wall time minus the model time the gateway measured
  (``llm_latency_ms``, which is the same HTTP call the direct baseline times);
* the CLI's cold start: ``runllm validate`` and ``runllm run`` (against this server and
  worker) as subprocesses, wall time, next to ``python -c pass``.

Prints p50s and the ratio overhead / direct call; the model time here is an instant
scripted answer, so the ratio is the worst case: against a real model taking seconds it
shrinks in proportion.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from activities.llm import load_litellm  # noqa: E402
from keel.rllm.contracts import render_prompt, template_variables, validate_input  # noqa: E402
from keel.rllm.deps import load_app  # noqa: E402
from keel.rllm.run import RllmRunInput, RllmRunResult, bundle_files  # noqa: E402
from keel.settings import Settings  # noqa: E402
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply  # noqa: E402
from workers.client import connect  # noqa: E402
from workers.main import build_worker  # noqa: E402
from workers.services import TemporalDevServer, free_port  # noqa: E402

TEXT = (
    "Temporal keeps workflow state durable in its event history. Workers poll task queues "
    "and run workflow and activity code. A crashed worker loses nothing: another one "
    "replays the history and carries on."
)


def p50(values: list[float]) -> float:
    return statistics.median(values)


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 2 else max(values)


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


def subprocess_ms(argv: list[str], env: dict[str, str], runs: int) -> tuple[list[float], str]:
    times: list[float] = []
    out = ""
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        times.append((time.perf_counter() - t0) * 1000)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited {proc.returncode}: {proc.stdout}{proc.stderr}"
            )
        out = proc.stdout
    return times, out


async def main(runs: int, app_path: Path, cli_runs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-rllm-"))
    resolved = load_app(app_path)
    program = resolved.root
    answer = answer_for(program.llm_output_schema())
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    with ScriptedOpenAIServer(default=ScriptedReply(content=answer)) as model:
        cfg = tmp / "models.yaml"
        cfg.write_text(
            "default: local\nmodels:\n  local:\n    litellm_model: openai/scripted\n"
            f"    api_base: {model.base_url}\n    input_cost_per_token: 0.0\n"
            "    output_cost_per_token: 0.0\n"
        )
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}", models_config=cfg,
        )  # fmt: skip
        try:
            # -- direct LiteLLM baseline ------------------------------------------------
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

            # -- the RllmApp workflow ----------------------------------------------------
            client = await connect(settings)
            files = bundle_files(app_path)
            wall: list[float] = []
            model_ms: list[float] = []
            overhead: list[float] = []
            async with build_worker(client, settings):
                for i in range(runs + 3):
                    t0 = time.perf_counter()
                    last_id = f"rllm/{program.name}/{uuid.uuid4()}"
                    result: RllmRunResult = await client.execute_workflow(
                        "RllmApp",
                        RllmRunInput(path=app_path.name, files=files, input={"text": TEXT}),
                        id=last_id,
                        task_queue=settings.task_queue,
                        result_type=RllmRunResult,
                    )
                    ms = (time.perf_counter() - t0) * 1000
                    if result.retries:
                        raise RuntimeError(f"unexpected retry: {result.attempts}")
                    if i >= 3:
                        wall.append(ms)
                        model_ms.append(result.llm_latency_ms)
                        overhead.append(ms - result.llm_latency_ms)

                steps = await history_steps(client, last_id)

                # -- CLI cold start ------------------------------------------------------
                env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
                env.update(
                    KEEL_ENV="test", KEEL_TEMPORAL_ADDRESS=server.address,
                    KEEL_TASK_QUEUE=settings.task_queue, KEEL_DATA_DIR=str(settings.data_dir),
                    KEEL_MODELS_CONFIG=str(cfg),
                )  # fmt: skip
                runllm = [sys.executable, "-m", "cli.runllm"]
                python_ms, _ = await asyncio.to_thread(
                    subprocess_ms, [sys.executable, "-c", "pass"], env, cli_runs
                )
                validate_ms, _ = await asyncio.to_thread(
                    subprocess_ms, [*runllm, "validate", str(app_path)], env, cli_runs
                )
                run_ms, out = await asyncio.to_thread(
                    subprocess_ms, [*runllm, "run", str(app_path), "-i", TEXT], env, cli_runs
                )
                assert json.loads(out)["output"], out
        finally:
            server.stop()

    d = p50(direct)
    print(f"app {program.name} ({app_path}), {runs} runs each after 3 warm-up runs, this machine")
    print("model: scripted OpenAI-compatible HTTP server on loopback, instant valid answer")
    print(f"{'':<44}{'p50 ms':>9}{'p90 ms':>9}")
    rows = (
        ("direct litellm.completion (baseline)", direct),
        ("RllmApp workflow, wall (client start->result)", wall),
        ("  of which model time (gateway-measured)", model_ms),
        ("  Keel overhead = wall - model time", overhead),
    )
    for name, values in rows:
        print(f"{name:<44}{p50(values):>9.1f}{p90(values):>9.1f}")
    print(f"overhead per run / direct call (p50s): {p50(overhead) / d:.1f}x")
    print(f"workflow wall / direct call (p50s):    {p50(wall) / d:.1f}x")
    print("where the last run's time went (from its history, ms):")
    for name, ms in steps:
        print(f"  {name:<42}{ms:>9.1f}")
    print(f"CLI cold start, {cli_runs} runs each (subprocess wall time):")
    for name, values in (
        ("python -c pass", python_ms),
        ("runllm validate", validate_ms),
        ("runllm run (server + worker already up)", run_ms),
    ):
        print(f"  {name:<42}{p50(values):>9.1f}{p90(values):>9.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--cli-runs", type=int, default=5)
    parser.add_argument("--app", type=Path, default=ROOT / "examples" / "summary.rllm")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.app, args.cli_runs))
