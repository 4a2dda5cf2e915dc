"""Issue 38 §6 on the embedded model (llama.cpp serving the shipped ``local`` entry): the
issue's paragraph states its cloud (by its region code), region, workload types, volume,
latency and budget, so the session reaches a plan or asks only about what the paragraph
does not state, whatever the small model reads (keel/design/intake_rules.py reads the
rest beside it and checks it)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client

from client import design as design_client
from client.design import start_design
from keel.design.intake_rules import read_rules
from keel.design.steps import DesignInput, DesignResult
from keel.settings import Settings
from services.model_server import LocalModelServer, unavailable_reason
from workers.main import build_worker

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unavailable_reason() is not None, reason=str(unavailable_reason())),
]

REPO = Path(__file__).resolve().parents[3]
PARAGRAPH = (
    "Nightly retraining of a churn model on 200 GB/day of event data in eu-west-1, GDPR, "
    "batch scoring plus a low-latency API under 100 ms, budget under $2k/month"
)
#: The fields the paragraph states, which the session must not ask about.
STATED = {"cloud", "regions", "workload_types", "throughput", "sla_latency_ms", "budget_band"}
#: Two calls of a small model on a shared CPU (the reply and, if it does not fit, the
#: re-ask), after the worker's first LiteLLM import.
OUTCOME_WAIT_S = 420.0


async def outcome(client: Client, project: str) -> DesignResult | list[str]:
    """The result once the pipeline finishes, or the fields it asks about once it asks."""
    handle = design_client.handle_of(client, project, "ds1")
    done = asyncio.ensure_future(handle.result())
    try:
        for _ in range(int(OUTCOME_WAIT_S / 0.5)):
            if done.done():
                return done.result()  # type: ignore[no-any-return]
            status = await design_client.status(client, project, "ds1")
            if status is not None and status.phase == "waiting_for_answers":
                await handle.terminate("asked: the test has what it needs")
                return [q.field for q in status.questions]
            await asyncio.sleep(0.5)
        raise AssertionError(f"no plan and no questions in {OUTCOME_WAIT_S} s")
    finally:
        done.cancel()


async def test_the_paragraph_reaches_a_plan_or_asks_only_what_it_does_not_state(
    client: Client, settings: Settings, tmp_path: Path, local_model_server: LocalModelServer
) -> None:
    raw: dict[str, Any] = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    raw["models"]["local"]["api_base"] = local_model_server.base_url
    (tmp_path / "models.yaml").write_text(yaml.safe_dump(raw))
    settings.models_config = tmp_path / "models.yaml"
    project = f"p-{uuid.uuid4().hex[:8]}"
    inp = DesignInput(
        project=project,
        decision_set="ds1",
        requester="alice",
        requirements=PARAGRAPH,
        model="local",
        require_approval=False,
        generate=False,
    )
    async with build_worker(client, settings):
        await start_design(client, inp, task_queue=settings.task_queue)
        got = await outcome(client, project)
    if isinstance(got, list):
        assert got and not set(got) & STATED, got
        return
    assert got.status == "completed" and got.plan is not None
    # What the text states is in the plan's constraints as the text states it.
    read = read_rules(PARAGRAPH).constraints
    c = got.constraints
    assert (c.cloud, c.regions, c.budget_band) == (read.cloud, read.regions, read.budget_band)
    assert c.sla_latency_ms == 100 and c.throughput is not None
    assert c.throughput.data_gb_per_day == 200.0
    assert set(read.workload_types) <= set(c.workload_types)
