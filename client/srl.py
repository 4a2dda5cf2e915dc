"""Client side of ``SRLCollection``, shared by the ``srl`` CLI and ``/srl/collections``.

A collection's tasks go into the artifact store first (one JSONL file, validated here so
a bad line is refused before anything starts); the workflow gets the digest. A view of a
collection joins Temporal (status, the ``progress`` query, the result) with the step
rows in SQL (``store/srl_steps.py``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowHandle

from client.temporal import RunStatus, describe_or_none, start_by_type, status_name
from keel.srl.steps import (
    CollectionInput,
    CollectionProgress,
    CollectionResult,
    CollectionTotals,
    parse_tasks,
)
from store.artifacts import ArtifactStore
from store.srl_steps import count_steps, get_identity

COLLECTION_TYPE = "SRLCollection"
COLLECTION_PREFIX = "srl/"


def collection_workflow_id(collection: str) -> str:
    """``srl/<collection>``; its episodes are ``srl/<collection>/<task_id>``."""
    return f"{COLLECTION_PREFIX}{collection}"


def upload_tasks(artifacts: ArtifactStore, data: bytes) -> tuple[str, int]:
    """Validate a JSONL task file and store it: ``(digest, number of tasks)``.

    Raises ``keel.srl.steps.TasksInvalid`` naming the first bad line.
    """
    tasks = parse_tasks(data)
    return artifacts.put_bytes(data), len(tasks)


class CollectionMismatch(ValueError):
    """A run naming another source, model or sampling than the collection's recorded steps
    (the message names both)."""


def check_identity(sessions: sessionmaker[Session], inp: CollectionInput) -> None:
    """Refuse, before starting, a run the collection's recorded identity would refuse
    (``srl.window`` checks again: this is the early answer, not the guard)."""
    stored = get_identity(sessions, inp.collection)
    if stored is None:
        return
    mismatch = stored.mismatch(inp.identity())
    if mismatch is not None:
        raise CollectionMismatch(mismatch)


async def start_collection(
    client: Client,
    inp: CollectionInput,
    *,
    task_queue: str,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle[Any, CollectionResult]:
    """Start ``SRLCollection`` by type name; a running collection with that id is refused
    (``WorkflowAlreadyStartedError``), a finished one may be run again: it reuses every
    step recorded (no model call) and collects the rest. A run naming another source,
    model or sampling fails in its first activity (``SrlCollectionMismatch``); callers
    with the database call :func:`check_identity` first for an early answer."""
    return await start_by_type(
        client,
        COLLECTION_TYPE,
        inp,
        workflow_id=collection_workflow_id(inp.collection),
        task_queue=task_queue,
        result_type=CollectionResult,
        memo=memo,
        static_summary=f"SRL collection {inp.collection} ({inp.source})",
    )


class CollectionView(BaseModel):
    """One collection as the CLI and API show it."""

    collection: str
    workflow_id: str
    status: RunStatus
    task_count: int | None = None
    done: int | None = None
    totals: CollectionTotals | None = None
    recorded: dict[str, int]


async def collection_view(
    client: Client, sessions: sessionmaker[Session], collection: str
) -> CollectionView | None:
    """The collection's status, progress (running) or result (completed), and its rows;
    None when Temporal has no such collection."""
    wid = collection_workflow_id(collection)
    desc = await describe_or_none(client, wid, COLLECTION_TYPE)
    if desc is None:
        return None
    status = status_name(desc)
    handle = client.get_workflow_handle(wid, result_type=CollectionResult)
    progress: CollectionProgress | None = None
    result: CollectionResult | None = None
    if status == "running":
        with contextlib.suppress(Exception):  # no worker yet: the rows still answer
            progress = await handle.query("progress", result_type=CollectionProgress)
    elif status == "completed":
        result = await handle.result()
    counts = count_steps(sessions, collection)
    return CollectionView(
        collection=collection,
        workflow_id=wid,
        status=status,
        task_count=result.task_count if result else (progress.task_count if progress else None),
        done=(result.task_count if result else (progress.done if progress else None)),
        totals=result.totals if result else (progress.totals if progress else None),
        recorded=counts,
    )
