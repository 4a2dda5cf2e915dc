"""Recent runs of every family over HTTP (``GET /runs``): ``.rllm`` runs, MRP jobs and SRL
collections, newest first, each with its status, its progress while it runs, and its page
in the Temporal Web UI.

One visibility query lists them; a row is shown to the callers who may read that run
(its owner, the approvers its gates name, ``admin``: the access memo, ``keel/access.py``),
as the family's own read routes do. Runs started outside the API carry no memo, so only
``admin`` sees them. The scan is bounded: a caller who may read few of many runs gets
the ones among the newest :data:`MAX_SCAN` rows, never a walk of the whole namespace.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from api.deps import CallerDep, ClientDep
from api.errors import ERROR_RESPONSES
from client.temporal import RunStatus
from keel.access import ACCESS_MEMO, RunAccess, may_read
from keel.mrp.run import WORKFLOW_TYPE as MRP_TYPE
from keel.rllm.run import WORKFLOW_TYPE as RLLM_TYPE
from keel.srl.steps import COLLECTION_TYPE as SRL_TYPE
from services.up import ui_link

router = APIRouter(prefix="/runs", tags=["runs"], responses=ERROR_RESPONSES)

Family = Literal["rllm", "mrp", "srl"]

#: The workflow type of each family's top-level run (children and gates are not runs here).
FAMILY_TYPES: dict[Family, str] = {"rllm": RLLM_TYPE, "mrp": MRP_TYPE, "srl": SRL_TYPE}
_FAMILY_OF = {t: f for f, t in FAMILY_TYPES.items()}

#: The most visibility rows one request reads, whatever the caller may see of them.
MAX_SCAN = 1000

# A progress query answers only while a worker runs; a missing worker must not stall the list.
PROGRESS_RPC_TIMEOUT = timedelta(seconds=2)

_STATUS: dict[WorkflowExecutionStatus, RunStatus] = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "canceled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
}


class RunSummary(BaseModel):
    workflow_id: str
    family: Family
    workflow_type: str
    status: RunStatus
    started_at: datetime | None
    closed_at: datetime | None
    progress: str | None = Field(
        default=None, description="Where a running run is (its progress query), else None"
    )
    ui_url: str = Field(description="The run's page in the Temporal Web UI")


class RunList(BaseModel):
    runs: list[RunSummary]


def _progress_text(family: Family, value: Any) -> str | None:
    """One line from a family's progress query result."""
    if family == "rllm":
        return f"step {value}" if isinstance(value, str) else None
    if not isinstance(value, dict):
        return None
    if family == "mrp":
        phase = value.get("phase", "?")
        total = value.get("windows_total") or 0
        if total:
            return f"{phase}: {value.get('windows_done', 0)}/{total} windows"
        return str(phase)
    count = value.get("task_count")
    return f"{value.get('done', 0)}/{count if count is not None else '?'} tasks"


async def _progress(client: Client, run: RunSummary) -> str | None:
    query = "step" if run.family == "rllm" else "progress"
    handle = client.get_workflow_handle(run.workflow_id)
    with contextlib.suppress(Exception):  # no worker, or an older run: no progress shown
        value = await handle.query(query, rpc_timeout=PROGRESS_RPC_TIMEOUT)
        return _progress_text(run.family, value)
    return None


async def _readable(wf: WorkflowExecution, actor: str, roles: frozenset[str]) -> bool:
    try:
        access = await wf.memo_value(ACCESS_MEMO, None, type_hint=RunAccess)
    except (ValueError, TypeError):
        access = None
    return may_read(access, actor, roles)


@router.get("", response_model=RunList)
async def list_runs(
    request: Request,
    client: ClientDep,
    caller: CallerDep,
    family: Annotated[list[Family] | None, Query(description="Only these families")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> RunList:
    """Recent runs the caller may read, newest first, from Temporal's visibility store."""
    types = [FAMILY_TYPES[f] for f in (family or list(FAMILY_TYPES))]
    query = "WorkflowType IN ({})".format(", ".join(f'"{t}"' for t in types))
    settings = request.app.state.settings
    runs: list[RunSummary] = []
    seen: set[str] = set()
    async for wf in client.list_workflows(query, limit=MAX_SCAN):
        if len(runs) >= limit:
            break
        # A run that continued as new goes on under the same id: one row, its newest run.
        if wf.status == WorkflowExecutionStatus.CONTINUED_AS_NEW or wf.id in seen:
            continue
        if not await _readable(wf, caller.actor, caller.roles):
            continue
        seen.add(wf.id)
        status = _STATUS.get(wf.status, "running") if wf.status is not None else "running"
        runs.append(
            RunSummary(
                workflow_id=wf.id,
                family=_FAMILY_OF[wf.workflow_type],
                workflow_type=wf.workflow_type,
                status=status,
                started_at=wf.start_time,
                closed_at=wf.close_time,
                ui_url=ui_link(settings, wf.id),
            )
        )
    running = [r for r in runs if r.status == "running"]
    for run, text in zip(
        running, await asyncio.gather(*(_progress(client, r) for r in running)), strict=True
    ):
        run.progress = text
    return RunList(runs=runs)
