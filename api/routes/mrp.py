"""MRP jobs over HTTP: start one (``POST /mrp/jobs``), read it (``GET /mrp/jobs/{run_id}``).

A job runs as the ``MRPJob`` workflow on the API's task queue. The body carries the job
YAML (``job_yaml``) or names a job file on the server (``path``) inside one of the folders
``KEEL_MRP_JOB_ROOTS`` lists; ``inputs.files`` resolve beside that file, or under
``base_dir`` (also inside a root) for inline YAML. Inline YAML with ``files`` and no
``base_dir`` is refused (403): the worker never resolves a caller's globs in its own
working directory (the compile activity refuses it too, for runs started elsewhere). The YAML is parsed before the run
starts, so a document that is not a valid job is a 422 naming the key and line; policy
and operator checks happen in the run's compile step (``GET`` then shows it failed, with
the rule). Opening runs needs the ``requester`` role, as opening gates does. A run is read
back by the caller who started it, the approvers its approval gate names (any approver
when it names none) and ``admin``; to anyone else its id is a 404.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from anyio import to_thread
from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from temporalio.exceptions import WorkflowAlreadyStartedError

from api.deps import (
    ArtifactsDep,
    CallerDep,
    ClientDep,
    SessionsDep,
    may_read_run,
)
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.shared import RequesterPost
from client.mrp import FilesNeedBaseDir, MrpJobView, job_input, job_view, start_job
from keel.access import ACCESS_MEMO, RunAccess, access_for
from keel.ids import ID_PATTERN
from keel.mrp.errors import DslError
from keel.mrp.run import MAX_WINDOW_SIZE, Backend, MRPJobInput, workflow_id_for

router = APIRouter(prefix="/mrp", tags=["mrp"], responses=ERROR_RESPONSES)


MAX_JOB_BYTES = 1_000_000


class SubmitJobBody(BaseModel):
    """Start a job: its YAML, or a job file on the server; plus run options.

    Rules (each broken one is 422 validation_failed, or 403 path_not_allowed):

    - exactly one of `job_yaml` and `path`;
    - `path` names a job file inside a `KEEL_MRP_JOB_ROOTS` folder; its `inputs.files`
      resolve beside it, so `base_dir` does not go with `path`;
    - `base_dir` goes with `job_yaml` and must lie inside a `KEEL_MRP_JOB_ROOTS` folder;
      inline YAML whose `inputs.files` names files needs it (403 without), inline
      `inputs.items` need none.
    """

    model_config = ConfigDict(extra="forbid")

    job_yaml: str | None = Field(
        default=None,
        max_length=MAX_JOB_BYTES,
        description="The job file's text (DSL v0.1)",
        examples=[None],
    )
    path: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="A job file on the server, inside a KEEL_MRP_JOB_ROOTS folder",
        examples=["examples/mrp/wordcount.yaml"],
    )
    base_dir: str | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="Where inputs.files resolve for inline YAML (inside a root)",
    )
    run_id: str | None = Field(default=None, pattern=ID_PATTERN, description="Default: generated")
    backend: Backend | None = Field(default=None, description="ray (default) or threads")
    window_size: int | None = Field(default=None, ge=1, le=MAX_WINDOW_SIZE)

    @model_validator(mode="after")
    def _one_source(self) -> SubmitJobBody:
        if (self.job_yaml is None) == (self.path is None):
            raise ValueError("give exactly one of job_yaml and path")
        if self.path is not None and self.base_dir is not None:
            raise ValueError("base_dir goes with job_yaml; a path resolves beside its file")
        return self


class SubmittedJob(BaseModel):
    """The answer to ``POST /mrp/jobs``: where to follow the run."""

    run_id: str
    workflow_id: str
    job_id: str
    status: str = "running"


def _inside_roots(request: Request, raw: str, what: str) -> Path:
    """``raw`` resolved (symlinks too); 403 unless it lies inside a configured root."""
    roots = [Path(r).resolve() for r in request.app.state.settings.mrp_job_roots]
    if not roots:
        raise ApiError(
            403, "path_not_allowed", f"{what} is refused: no KEEL_MRP_JOB_ROOTS are configured"
        )
    candidate = Path(raw)
    resolved = (candidate if candidate.is_absolute() else roots[0] / candidate).resolve()
    if not candidate.is_absolute():
        # A relative path may name a file in any root: the first that has it wins.
        for root in roots:
            if (root / candidate).resolve().exists():
                resolved = (root / candidate).resolve()
                break
    if not any(resolved == root or root in resolved.parents for root in roots):
        raise ApiError(403, "path_not_allowed", f"{what} {raw!r} is outside KEEL_MRP_JOB_ROOTS")
    return resolved


def _job_input(request: Request, body: SubmitJobBody) -> tuple[MRPJobInput, str, list[str] | None]:
    """The workflow input, the job id and the approval gate's approvers (None: no gate);
    422 for YAML that is not a valid job."""
    if body.path is not None:
        job_file = _inside_roots(request, body.path, "path")
        if not job_file.is_file():
            raise ApiError(404, "not_found", f"no job file {body.path!r}")
        text = job_file.read_text(encoding="utf-8")
        source, base_dir = job_file.name, str(job_file.parent)
    else:
        text = body.job_yaml or ""
        source = "job.yaml"
        base_dir = str(_inside_roots(request, body.base_dir, "base_dir")) if body.base_dir else ""
    try:
        return job_input(
            text, source, base_dir,
            run_id=body.run_id or "", backend=body.backend, window_size=body.window_size,
        )  # fmt: skip
    except DslError as e:
        raise ApiError(
            422,
            "invalid_job",
            f"not a valid MRP job: {e.issues[0].render(source)}",
            [issue.model_dump() for issue in e.issues],
        ) from None
    except FilesNeedBaseDir:
        raise ApiError(
            403,
            "path_not_allowed",
            "inputs.files names files on the worker: give base_dir inside "
            "KEEL_MRP_JOB_ROOTS, or name a job file by path",
        ) from None


def _access(actor: str, approvers: list[str] | None) -> RunAccess:
    return access_for(actor, [approvers] if approvers is not None else [])


@router.post("/jobs", status_code=202, response_model=SubmittedJob)
async def submit_job(body: SubmitJobBody, client: ClientDep, post: RequesterPost) -> Any:
    """Start a job; 202 with the run id and workflow id to follow it by."""
    actor = post.caller.actor

    async def run() -> tuple[int, Any]:
        # Reading and parsing the job is file I/O and CPU work: off the event loop.
        inp, job_id, approvers = await to_thread.run_sync(_job_input, post.request, body)
        run_id = body.run_id or post.key_digest("mrp", width=24) or uuid.uuid4().hex[:24]
        inp = inp.model_copy(update={"run_id": run_id, "requester": actor})
        wid = workflow_id_for(job_id, run_id)
        try:
            await start_job(
                client,
                inp,
                workflow_id=wid,
                task_queue=post.settings.task_queue,
                reject_duplicate=True,
                memo={ACCESS_MEMO: _access(actor, approvers)},
            )
        except WorkflowAlreadyStartedError:
            if post.key is None:
                raise ApiError(409, "conflict", f"run {run_id!r} of {job_id} exists") from None
            # The same key after an answer that was not stored (a 5xx): the same run.
        return 202, SubmittedJob(run_id=run_id, workflow_id=wid, job_id=job_id).model_dump()

    return await post.answer_once(body, run)


@router.get("/jobs/{run_id:path}", response_model=MrpJobView)
async def get_job(
    run_id: str,
    client: ClientDep,
    sessions: SessionsDep,
    artifacts: ArtifactsDep,
    caller: CallerDep,
) -> MrpJobView:
    """A run's status, shard counters, cost and digests (run id or workflow id)."""
    view = await job_view(client, sessions, run_id, artifacts)
    # Another caller's run reads as missing: a 403 would confirm that the id exists.
    if view is None or not await may_read_run(client, view.workflow_id, caller):
        raise ApiError(404, "not_found", f"no MRP run {run_id!r}")
    return view
