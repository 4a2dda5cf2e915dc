"""Recent runs of every family over HTTP (``GET /runs``): ``.rllm`` runs, MRP jobs and SRL
collections, newest first, each with its status, its progress while it runs, and its page
in the Temporal Web UI.

One visibility query lists a page of them: the runs the caller may read (its owner, the
approvers its gates name; ``admin``: all), asked of Temporal by the ``KeelReaders`` search
attribute the API sets when it starts a run (``keel/access.py``), so a caller with five
runs among ten thousand waits for five rows, not a walk. ``next_page_token`` continues the
list. Runs started outside the API, or before ``KeelReaders`` existed, carry no readers,
so only ``admin`` sees them (``keel migrate-search-attributes`` sets them on open runs).
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
from api.errors import ERROR_RESPONSES, ApiError
from client.temporal import (
    BadPageToken,
    RunStatus,
    decode_page_token,
    encode_page_token,
    list_page,
    readers_clause,
)
from keel.access import ACCESS_MEMO, RunAccess, may_read, reader_terms
from keel.mrp.run import WORKFLOW_TYPE as MRP_TYPE
from keel.rllm.run import WORKFLOW_TYPE as RLLM_TYPE
from keel.srl.steps import COLLECTION_TYPE as SRL_TYPE
from services.up import ui_link

router = APIRouter(prefix="/runs", tags=["runs"], responses=ERROR_RESPONSES)

Family = Literal["rllm", "mrp", "srl"]

#: The workflow type of each family's top-level run (children and gates are not runs here).
FAMILY_TYPES: dict[Family, str] = {"rllm": RLLM_TYPE, "mrp": MRP_TYPE, "srl": SRL_TYPE}
_FAMILY_OF = {t: f for f, t in FAMILY_TYPES.items()}

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
    next_page_token: str | None = Field(
        default=None,
        description="Pass back as ?page_token= for the next page; None: this was the last",
    )


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
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> RunList:
    """Runs the caller may read, newest first, a page of at most ``limit`` from one
    Temporal visibility query; follow ``next_page_token`` for the rest."""
    types = [FAMILY_TYPES[f] for f in (family or list(FAMILY_TYPES))]
    # A run that continued as new goes on under the same id: only its newest run is a row.
    query = 'WorkflowType IN ({}) AND ExecutionStatus != "ContinuedAsNew"'.format(
        ", ".join(f'"{t}"' for t in types)
    )
    clause = readers_clause(reader_terms(caller.actor, caller.roles))
    if clause:
        query += f" AND {clause}"
    try:
        rows, next_token = await list_page(
            client, query, page_size=limit, page_token=decode_page_token(page_token)
        )
    except BadPageToken as err:
        raise ApiError(422, "validation_failed", str(err)) from None
    settings = request.app.state.settings
    runs: list[RunSummary] = []
    for wf in rows:
        # A defence: the memo is the record of who may read a run (the attribute its index).
        if not await _readable(wf, caller.actor, caller.roles):
            continue
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
    return RunList(runs=runs, next_page_token=encode_page_token(next_token))
