"""Running an ``MRPJob`` from a test: a fresh run id unless the input names one."""

from __future__ import annotations

import json
import uuid

from temporalio.client import Client

from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from workflows.mrp import MRPJob


async def run_job(
    client: Client, settings: Settings, job_id: str, inp: MRPJobInput, *, prefix: str = "r-"
) -> MRPJobResult:
    """Execute ``inp`` on ``settings.task_queue`` and wait for its result."""
    run_id = inp.run_id or f"{prefix}{uuid.uuid4().hex[:10]}"
    result: MRPJobResult = await client.execute_workflow(
        MRPJob.run,
        inp.model_copy(update={"run_id": run_id}),
        id=workflow_id_for(job_id, run_id),
        task_queue=settings.task_queue,
    )
    return result


def items_job_yaml(
    job_id: str,
    operator: str,
    params: dict[str, object],
    n: int,
    *,
    listed: list[object] | None = None,
    **policy: object,
) -> str:
    """A job over ``n`` inline items (``item-<i>``, or ``listed``) mapped by ``operator``
    with ``params``, summed and written to ``out/<job_id>.json``; ``policy`` keys as given."""
    items = json.dumps(listed)[1:-1] if listed is not None else ""
    items = items or ", ".join(json.dumps(f"item-{i}") for i in range(n))
    lines = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in policy.items())
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: [{items}]
  by: item
map:
  operator: {operator}
  params: {json.dumps(params)}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:{lines}
"""
