"""SRL collections over HTTP: start one (``POST /srl/collections``), read it
(``GET /srl/collections/{collection}``).

The body carries the tasks inline (at most ``MAX_API_TASKS``; a bigger set goes into the
artifact store first, e.g. with ``srl collect``, and is named by ``tasks_digest``).
Starting needs the ``requester`` role; a collection is read back by the caller who
started it and ``admin`` (to anyone else its id is a 404). A running collection with the
same id is a 409, and so is a run naming another source, model or sampling than the
collection's recorded steps (a finished collection run again reuses them); with an
``Idempotency-Key`` a repeated request answers the same.
"""

from __future__ import annotations

from typing import Any

from anyio import to_thread
from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator
from temporalio.exceptions import WorkflowAlreadyStartedError

from api.deps import (
    ArtifactsDep,
    CallerDep,
    ClientDep,
    SessionsDep,
)
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.shared import RequesterPost, readable_or_404
from client.srl import (
    CollectionMismatch,
    CollectionView,
    check_identity,
    collection_view,
    collection_workflow_id,
    start_collection,
    stored_task_count,
    tasks_jsonl,
    upload_tasks,
)
from keel.access import ACCESS_MEMO, access_for
from keel.ids import ID_PATTERN
from keel.srl.steps import (
    CollectionInput,
    CollectionOptions,
    SrlTask,
    TasksInvalid,
)
from store.artifacts import ArtifactNotFound, ArtifactStore

router = APIRouter(prefix="/srl", tags=["srl"], responses=ERROR_RESPONSES)

MAX_API_TASKS = 1000


class StartCollectionBody(CollectionOptions):
    """Start a collection over inline ``tasks`` or a task file already stored
    (``tasks_digest``); exactly one of them. The options are the workflow's own
    (``CollectionOptions``), so a body the API accepts is a valid input.

    ``batch`` (0..1000, default 0) > 0 runs the episodes that many at a time in
    ``srl.episodes`` activities instead of a child workflow each: faster at volume, but
    an answer a worker received and had not yet recorded is asked again after that
    worker is lost (a child keeps it in its history)."""

    collection: str = Field(pattern=ID_PATTERN, description="The collection id", examples=["demo"])
    tasks: list[SrlTask] | None = Field(None, min_length=1, max_length=MAX_API_TASKS)
    tasks_digest: str | None = Field(None, pattern=r"^blake3:[0-9a-f]{64}$")

    @model_validator(mode="after")
    def _one_source(self) -> StartCollectionBody:
        if (self.tasks is None) == (self.tasks_digest is None):
            raise ValueError("give exactly one of tasks and tasks_digest")
        return self


class StartedCollection(BaseModel):
    collection: str
    workflow_id: str
    task_count: int
    status: str = "running"


def _stored_tasks(store: ArtifactStore, body: StartCollectionBody) -> tuple[str, int]:
    """The task file's digest and task count; 404/422 when it is missing or invalid."""
    try:
        if body.tasks is not None:
            return upload_tasks(store, tasks_jsonl(body.tasks), body.source)
        assert body.tasks_digest is not None
        return body.tasks_digest, stored_task_count(store, body.tasks_digest, body.source)
    except ArtifactNotFound:
        raise ApiError(404, "not_found", f"no task file {body.tasks_digest}") from None
    except TasksInvalid as e:
        raise ApiError(422, "validation_failed", str(e)) from None


@router.post("/collections", status_code=202, response_model=StartedCollection)
async def start(
    body: StartCollectionBody, client: ClientDep, artifacts: ArtifactsDep, post: RequesterPost
) -> Any:
    """Start an SRLCollection; 202 with the workflow id to follow it by."""

    async def run() -> tuple[int, Any]:
        digest, count = await to_thread.run_sync(_stored_tasks, artifacts, body)
        inp = CollectionInput(
            collection=body.collection,
            tasks_digest=digest,
            task_count=count,
            **body.model_dump(include=set(CollectionOptions.model_fields)),
        )
        try:
            await to_thread.run_sync(check_identity, post.sessions, inp)
        except CollectionMismatch as e:
            raise ApiError(409, "conflict", str(e)) from None
        try:
            await start_collection(
                client,
                inp,
                task_queue=post.settings.task_queue,
                memo={ACCESS_MEMO: access_for(post.caller.actor)},
            )
        except WorkflowAlreadyStartedError:
            raise ApiError(409, "conflict", f"collection {body.collection!r} is running") from None
        wid = collection_workflow_id(body.collection)
        return 202, StartedCollection(
            collection=body.collection, workflow_id=wid, task_count=count
        ).model_dump()

    return await post.answer_once(body, run)


@router.get("/collections/{collection}", response_model=CollectionView)
async def get_collection(
    collection: str, client: ClientDep, sessions: SessionsDep, caller: CallerDep
) -> CollectionView:
    """A collection's status, progress or totals, and the steps recorded in SQL."""
    return await readable_or_404(
        client, caller, collection_workflow_id(collection), f"no SRL collection {collection!r}",
        lambda: collection_view(client, sessions, collection),
    )  # fmt: skip
