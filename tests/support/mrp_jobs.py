"""Running an ``MRPJob`` from a test: a fresh run id unless the input names one."""

from __future__ import annotations

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
