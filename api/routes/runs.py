"""Recent runs of every family over HTTP (``GET /runs``): the runs of each family that
``keel/families.py`` lists in runs (``.rllm`` runs, MRP jobs, SRL collections, design
pipelines, and any family registered later), newest first, each with its status, its
progress while it runs, and its page in the Temporal Web UI.

One visibility query lists a page of them: the runs the caller may read (its owner, the
approvers its gates name; ``admin``: all), asked of Temporal by the ``KeelReaders`` search
attribute the API sets when it starts a run (``keel/access.py``), so a caller with five
runs among ten thousand waits for five rows, not a walk. ``next_page_token`` continues the
list. Runs started outside the API, or before ``KeelReaders`` existed, carry no readers,
so only ``admin`` sees them (``keel migrate-search-attributes`` sets them on open runs).

A running run's progress is its progress memo (``keel/progress.py``), which the workflow
upserts at its step boundaries and the visibility row already carries: the list asks no
worker anything, so a page of 100 running runs costs the one visibility query, and a busy
or absent worker costs it nothing. A run from before the memo (or a family that keeps
none: ``progress="none"``) shows no progress.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, Field
from temporalio.client import WorkflowExecution

from api.deps import CallerDep, ClientDep
from api.errors import ERROR_RESPONSES, ApiError
from client.memos import access_memo_of, memo_of
from client.temporal import (
    BadPageToken,
    RunStatus,
    decode_page_token,
    encode_page_token,
    list_page,
    readers_clause,
    status_name,
)
from keel.access import may_read, reader_terms
from keel.families import FamilySpec, family_of_type, run_families
from keel.progress import PROGRESS_MEMO, RunProgress
from services.up import ui_link

router = APIRouter(prefix="/runs", tags=["runs"], responses=ERROR_RESPONSES)


class RunSummary(BaseModel):
    workflow_id: str
    family: str = Field(description="The run's family (keel/families.py: rllm, mrp, ...)")
    label: str = Field(description="How the console names a run of its family")
    workflow_type: str
    status: RunStatus
    started_at: datetime | None
    closed_at: datetime | None
    progress: str | None = Field(
        default=None,
        description="Where a running run is (its progress memo), else None",
    )
    ui_url: str = Field(description="The run's page in the Temporal Web UI")


class RunList(BaseModel):
    runs: list[RunSummary]
    next_page_token: str | None = Field(
        default=None,
        description="Pass back as ?page_token= for the next page; None: this was the last",
    )


def runs_query(families: list[FamilySpec]) -> str:
    """The visibility query of ``families``' runs (without the caller's readers clause)."""
    types = [t for f in families for t in f.workflow_types]
    # A run that continued as new goes on under the same id: only its newest run is a row.
    return 'WorkflowType IN ({}) AND ExecutionStatus != "ContinuedAsNew"'.format(
        ", ".join(f'"{t}"' for t in types)
    )


async def progress_of(wf: WorkflowExecution, family: FamilySpec) -> str | None:
    """A running run's progress line from its visibility row's memo (no query)."""
    if family.progress != "memo":
        return None
    progress = await memo_of(wf, PROGRESS_MEMO, RunProgress)  # another shape: None
    return progress.line() if progress is not None else None


@router.get("", response_model=RunList)
async def list_runs(
    request: Request,
    client: ClientDep,
    caller: CallerDep,
    family: Annotated[
        list[str] | None, Query(description="Only these families (rllm, mrp, srl, design, ...)")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    page_token: Annotated[str | None, Query(max_length=4096)] = None,
) -> RunList:
    """Runs the caller may read, newest first, a page of at most ``limit`` from one
    Temporal visibility query; follow ``next_page_token`` for the rest."""
    listed = {f.name: f for f in run_families()}
    unknown = sorted(set(family or ()) - set(listed))
    if unknown:
        raise ApiError(
            422,
            "validation_failed",
            f"unknown families {unknown}: families are {sorted(listed)}",
        )
    chosen = [listed[f] for f in listed if not family or f in family]
    query = runs_query(chosen)
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
        if not may_read(await access_memo_of(wf), caller.actor, caller.roles):
            continue
        spec = family_of_type(wf.workflow_type)
        if spec is None:  # a family unregistered since the query: not a run here
            continue
        status = status_name(wf)
        runs.append(
            RunSummary(
                workflow_id=wf.id,
                family=spec.name,
                label=spec.label,
                workflow_type=wf.workflow_type,
                status=status,
                started_at=wf.start_time,
                closed_at=wf.close_time,
                progress=await progress_of(wf, spec) if status == "running" else None,
                ui_url=ui_link(settings, wf.id),
            )
        )
    return RunList(runs=runs, next_page_token=encode_page_token(next_token))
