"""Prometheus on the worker's runtime: Temporal's own metrics and Keel's LLM counters together."""

from __future__ import annotations

import asyncio
import urllib.request
import uuid

from temporalio.service import RPCError

from client.temporal import connect
from keel.demo import DemoInput
from keel.gates import GateDecision, gate_workflow_id
from keel.settings import Settings
from services.processes import free_port
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker
from workers.telemetry import make_runtime
from workflows.demo import KeelDemo
from workflows.gate import ApprovalGate


async def test_metrics_endpoint_serves_temporal_and_keel_metrics(settings: Settings, tmp_path):
    port = free_port()
    with ScriptedOpenAIServer([ScriptedReply(content="Keel keeps work durable.")]) as llm:
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        s = settings.model_copy(
            update={"metrics_port": port, "models_config": tmp_path / "models.yaml"}
        )
        runtime = make_runtime(s)
        assert runtime is not None
        client = await connect(s, runtime=runtime)
        async with build_worker(client, s):
            wid = f"metrics/{uuid.uuid4()}"
            handle = await client.start_workflow(
                KeelDemo.run, DemoInput(), id=wid, task_queue=s.task_queue
            )
            gate = client.get_workflow_handle(gate_workflow_id(wid, "publish"))
            for _ in range(200):
                try:
                    await gate.execute_update(
                        ApprovalGate.decide, GateDecision(decision="approve", actor="dev-approver")
                    )
                    break
                except RPCError:  # the gate is not open yet
                    await asyncio.sleep(0.1)
            result = await handle.result()
    assert result.published
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "keel_llm_calls" in text and "keel_llm_tokens" in text
    assert "temporal_workflow_completed" in text or "temporal_request" in text
