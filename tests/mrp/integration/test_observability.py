"""MRPJob observability: OpenTelemetry spans per phase and per window, Prometheus metrics per
shard (latency, retries, failures) and per job (cost, budget used), on a real worker."""

from __future__ import annotations

import json
import urllib.request
import uuid
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from client.temporal import connect
from keel.mrp.run import MRPJobInput, workflow_id_for
from keel.settings import Settings
from services.processes import free_port
from workers.main import build_worker
from workers.telemetry import make_runtime
from workflows.mrp import MRPJob

TEST_CONFIG = (
    Path(__file__).resolve().parents[3] / "tests" / "support" / "mrp_operators" / "mrp.yaml"
)


def _exporter() -> InMemorySpanExporter:
    """An in-memory exporter on the process's tracer provider (installed once)."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return exporter


async def test_spans_per_phase_and_window_and_prometheus_metrics(
    settings: Settings, tmp_path: Path
) -> None:
    exporter = _exporter()
    port = free_port()
    s = settings.model_copy(update={"metrics_port": port, "mrp_config": TEST_CONFIG})
    runtime = make_runtime(s)
    assert runtime is not None
    client = await connect(s, runtime=runtime)
    state = tmp_path / "flaky"
    items = json.dumps([f"item-{i}" for i in range(6)])
    job = f"""
dsl_version: "0.1"
job_id: observed
inputs: {{items: {items}, by: item}}
map:
  operator: flaky@1.0.0
  params: {{state_dir: "{state}", fail_times: 1, only_shards: [shard-000004]}}
reduce: {{operator: numeric-sum@1.0.0}}
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/observed.json}}
policy: {{max_workers: 2, max_shard_retries: 2, budget_units: "100"}}
"""
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    async with build_worker(client, s):
        result = await client.execute_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=job, backend="threads", window_size=2, run_id=run_id),
            id=workflow_id_for("observed", run_id),
            task_queue=s.task_queue,
        )
    assert result.status == "succeeded" and result.counters.retried == 1

    spans = [
        sp
        for sp in exporter.get_finished_spans()
        if sp.attributes and sp.attributes.get("run_id") == run_id
    ]
    names = sorted(sp.name for sp in spans)
    assert names.count("mrp.map_window") == 3  # 6 shards in windows of 2
    for phase in ("mrp.compile", "mrp.reduce", "mrp.produce", "mrp.finalise"):
        assert names.count(phase) == 1, names
    windows = sorted(
        (sp.attributes["start"], sp.attributes["end"], sp.attributes["shards.run"])  # type: ignore[index]
        for sp in spans
        if sp.name == "mrp.map_window"
    )
    assert windows == [(0, 2, 2), (2, 4, 2), (4, 6, 2)]
    # Each activity span sits under the interceptor's RunActivity span, in one trace.
    by_id = {sp.context.span_id: sp for sp in exporter.get_finished_spans()}
    for sp in spans:
        assert sp.parent is not None and by_id[sp.parent.span_id].name.startswith("RunActivity:")
    assert len({sp.context.trace_id for sp in spans}) == 1

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    lines = [ln for ln in text.splitlines() if ln.startswith("keel_mrp_")]
    assert any(ln.startswith("keel_mrp_shard_latency_ms_bucket") for ln in lines), lines
    assert any(ln.startswith("keel_mrp_shard_retries") and ln.endswith(" 1") for ln in lines), lines
    assert any(ln.startswith("keel_mrp_shards{") and 'outcome="run"' in ln for ln in lines)
    assert any(ln.startswith("keel_mrp_job_cost_units") for ln in lines)
    assert any(ln.startswith("keel_mrp_budget_used_ratio") for ln in lines)
    assert any(ln.startswith("keel_mrp_jobs{") and 'status="succeeded"' in ln for ln in lines)
