"""Client side of ``SRLCollection``, shared by the ``srl`` CLI and ``/srl/collections``.

A collection's tasks go into the artifact store first (one JSONL file, validated here so
a bad line is refused before anything starts); the workflow gets the digest. A view of a
collection joins Temporal (status, the ``progress`` query, the result) with the step
rows in SQL (``store/srl_steps.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from client.temporal import RunStatus, describe_or_none, start_by_type, status_name
from client.waiting import LocalServicesLike, wait_watching, watch_services
from keel.digest import canonical_json
from keel.llm import ModelsConfigError, ModelSpec, UnknownModelError
from keel.srl.expert import Expert, ExpertStep, expert_steps
from keel.srl.steps import (
    COLLECTION_TYPE,
    CollectionInput,
    CollectionProgress,
    CollectionResult,
    CollectionTotals,
    SrlTask,
    TasksInvalid,
    check_source,
    parse_tasks,
)
from keel.srl.trajectory import StepRecord
from store.artifacts import ArtifactNotFound, ArtifactStore
from store.files import load_models_config
from store.srl_steps import count_steps, get_identity, list_steps

COLLECTION_PREFIX = "srl/"


def collection_workflow_id(collection: str) -> str:
    """``srl/<collection>``; its episodes are ``srl/<collection>/<task_id>``."""
    return f"{COLLECTION_PREFIX}{collection}"


def upload_tasks(
    artifacts: ArtifactStore, data: bytes, source: str | None = None, limit: int | None = None
) -> tuple[str, int]:
    """Validate a JSONL task file (for ``source``, when given: a gold replay needs expert
    actions) and store it: ``(digest, number of tasks)``; with ``limit``, only its first
    ``limit`` lines are validated and stored.

    Raises ``keel.srl.steps.TasksInvalid`` naming the first bad line, or the tasks a gold
    replay cannot replay.
    """
    if limit is not None:
        data = b"".join(data.splitlines(keepends=True)[:limit])
    count = _checked_count(data, source)
    return artifacts.put_bytes(data), count


def stored_task_count(artifacts: ArtifactStore, digest: str, source: str | None = None) -> int:
    """Validate the task file already stored under ``digest`` as :func:`upload_tasks` does a
    new one: its number of tasks.

    Raises ``store.artifacts.ArtifactNotFound`` when no file has that digest, and
    ``keel.srl.steps.TasksInvalid`` as :func:`upload_tasks` does.
    """
    return _checked_count(artifacts.get_bytes(digest), source)


def _checked_count(data: bytes, source: str | None) -> int:
    tasks = parse_tasks(data)
    if source is not None:
        check_source(tasks, source)
    return len(tasks)


def tasks_jsonl(tasks: Sequence[SrlTask]) -> bytes:
    """``tasks`` as a JSONL task file (canonical JSON, one task a line)."""
    return b"".join(canonical_json(t) + b"\n" for t in tasks)


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


def collection_tasks(
    sessions: sessionmaker[Session], artifacts: ArtifactStore, collection: str
) -> dict[str, SrlTask]:
    """The tasks of the collection's task file (the first run's, as its identity records
    it), by id; empty when the collection has no identity or the file is gone (an export
    then derives a gold replay's think text from the record alone)."""
    identity = get_identity(sessions, collection)
    if identity is None or not identity.tasks_digest:
        return {}
    try:
        tasks = parse_tasks(artifacts.get_bytes(identity.tasks_digest))
    except (ArtifactNotFound, TasksInvalid):  # gone, or refused by this version's checks
        return {}
    return {t.task_id: t for t in tasks}


class ExpertExport(BaseModel):
    """What ``srl expert`` wrote: the tasks given an expert trajectory, and the rest."""

    collection: str
    source: str
    model: str
    tasks_digest: str
    experts: int
    expert_steps: int
    without: list[str]


class ExpertSetError(ValueError):
    """A collection that cannot give an expert set (the message says why)."""


def expert_task_file(
    sessions: sessionmaker[Session], artifacts: ArtifactStore, collection: str
) -> tuple[bytes, ExpertExport]:
    """The collection's task file with each verified task's expert trajectory filled in
    (``SrlTask.expert``), and what was written.

    A task's expert is its verified episode with the fewest file-changing steps (the
    lowest sample on a tie; :func:`keel.srl.expert.expert_steps`). Tasks without a
    verified episode are left out and named in :attr:`ExpertExport.without`.

    Raises:
        ExpertSetError: no such collection, its task file is gone, or no task verified.
    """
    identity = get_identity(sessions, collection)
    if identity is None:
        raise ExpertSetError(f"no collection {collection!r} has recorded steps")
    try:
        tasks = parse_tasks(artifacts.get_bytes(identity.tasks_digest))
    except ArtifactNotFound:
        raise ExpertSetError(
            f"collection {collection!r}: its task file {identity.tasks_digest} is not in the "
            "artifact store"
        ) from None
    episodes = _episodes(sessions, collection)
    lines: list[str] = []
    without: list[str] = []
    total_steps = 0
    for task in tasks:
        steps = _expert_of(task, episodes, artifacts)
        if steps is None:
            without.append(task.task_id)
            continue
        total_steps += len(steps)
        expert = Expert(
            steps=steps, collection=collection, source=identity.source, model=identity.model
        )
        lines.append(task.model_copy(update={"expert": expert}).model_dump_json() + "\n")
    if not lines:
        raise ExpertSetError(
            f"collection {collection!r}: no task has a verified episode "
            f"({len(without)} tasks without one)"
        )
    data = "".join(lines).encode("utf-8")
    parse_tasks(data)  # what is written is a task file `srl collect` takes
    return data, ExpertExport(
        collection=collection,
        source=identity.source,
        model=identity.model,
        tasks_digest=identity.tasks_digest,
        experts=len(lines),
        expert_steps=total_steps,
        without=without,
    )


def _episodes(
    sessions: sessionmaker[Session], collection: str
) -> dict[tuple[str, int], list[StepRecord]]:
    """The collection's recorded steps by episode, ``(task_id, sample)``."""
    episodes: dict[tuple[str, int], list[StepRecord]] = {}
    for row in list_steps(sessions, collection):
        episodes.setdefault((row.task_id, row.sample), []).append(
            StepRecord.model_validate_json(row.record_json)
        )
    return episodes


def _expert_of(
    task: SrlTask,
    episodes: dict[tuple[str, int], list[StepRecord]],
    artifacts: ArtifactStore,
) -> list[ExpertStep] | None:
    """``task``'s expert steps: of its episodes that end verified at ``task.post``, the one
    with the fewest steps (the lowest sample on a tie); None when none does."""
    candidates = []
    for (task_id, sample), records in sorted(episodes.items()):
        if task_id != task.task_id:
            continue
        digests = {r.text_digest for r in records if r.text_digest is not None}
        texts = {d: artifacts.get_bytes(d).decode("utf-8") for d in digests}
        steps = expert_steps(records, texts)
        if steps is not None and steps[-1].text_after == task.post:
            candidates.append((len(steps), sample, steps))
    if not candidates:
        return None
    return min(candidates, key=lambda c: (c[0], c[1]))[2]


def token_model_spec(models_config: str | Path, model: str | None) -> ModelSpec | None:
    """Whose tokenizer counts tokens (``srl data process --model``): ``model``'s spec, or
    the models config's default model's; None (the heuristic) when no model is named and
    the config has no usable default.

    Raises:
        keel.llm.ModelsConfigError, keel.llm.UnknownModelError: the config or the named
            ``model`` cannot be resolved (only when ``model`` is given).
    """
    try:
        _, spec = load_models_config(models_config).resolve(model or "")
    except (ModelsConfigError, UnknownModelError):
        if model:
            raise
        return None
    return spec


# -- a collection started from this machine (``srl collect``) ---------------------------

Tick = Callable[[], Awaitable[None]]


class CollectionFailed(RuntimeError):
    """The collection's workflow failed: ``collection <id> failed: <cause>``."""


async def collection_progress(client: Client, workflow_id: str) -> CollectionProgress:
    """A running collection's ``progress`` query."""
    handle = client.get_workflow_handle(workflow_id)
    return await handle.query("progress", result_type=CollectionProgress)


async def collect_and_wait(
    services: LocalServicesLike,
    sessions: sessionmaker[Session],
    inp: CollectionInput,
    *,
    task_queue: str,
    wait: bool,
    keep: bool,
    on_started: Callable[[str], None],
    on_dead: Callable[[str], BaseException],
    progress: Callable[[Client, str], tuple[Tick, Callable[[], None]] | None] | None = None,
) -> tuple[CollectionResult, float] | None:
    """Start the collection (after :func:`check_identity`; ``services``: the server and a
    worker on demand) and, with ``wait``, its result and the seconds from its start to
    its result (None without ``wait``). ``on_started(workflow_id)`` once started;
    ``on_dead(why)`` is raised when a service ``services`` started dies;
    ``progress(client, workflow_id)`` (called once the wait begins) gives a tick run
    beside the wait and what to call when the wait ends. ``services`` are stopped at the
    end, left running with ``keep``.

    Raises:
        CollectionMismatch: the collection id was recorded with another source, model or
            sampling.
        CollectionFailed: its workflow failed.
    """
    check_identity(sessions, inp)
    try:
        client = await services.connect()
        handle = await start_collection(client, inp, task_queue=task_queue)
        started = time.monotonic()
        on_started(handle.id)
        await services.ensure_worker(handle.id, "srl-worker.log")
        if not wait:
            return None
        shown = progress(client, handle.id) if progress is not None else None
        tick, done = shown if shown is not None else (None, None)
        try:
            result = await wait_watching(
                handle.result(),
                watch_services(services, on_dead=on_dead, tick=tick, interval_s=1.0),
            )
            return result, time.monotonic() - started
        except WorkflowFailureError as err:
            raise CollectionFailed(
                f"collection {inp.collection} failed: {err.cause or err}"
            ) from None
        finally:
            if done is not None:
                done()
    finally:
        await asyncio.to_thread(services.stop, keep)


async def collection_view_here(
    services: LocalServicesLike,
    sessions: Callable[[], sessionmaker[Session]],
    collection: str,
) -> CollectionView | None:
    """:func:`collection_view` through the server ``services`` finds running (the
    database opened by ``sessions()`` once connected): a read never starts Keel (it used
    to, and left it running); None for an unknown collection."""
    try:
        client = await services.connect(start=False)
        return await collection_view(client, sessions(), collection)
    finally:
        await asyncio.to_thread(services.stop, True)
