"""Design pipelines over HTTP (plan §22): projects, decision sets, their SSE stream,
answers, approvals, codegen and signed downloads.

A project belongs to the caller who created it. ``POST /design/projects/{id}/constraints`` mints a
decision set id (``ds-<12 hex>``), notes it as submitted in SQL and starts its
``DesignPipeline`` with the access memo. Decision sets are read by their project's owner
and ``admin``; an approver named on the run (or any approver, when it names none) may
approve it. To anyone else a decision set id is a 404, as if it did not exist.

The repository archive is handed out as a signed, time-limited URL
(``/design/artifacts/{digest}?expires=&sig=``, ``keel.signed_urls``) that needs no bearer
token, so a browser or ``curl`` can fetch it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from api.deps import (
    ApproverDep,
    ArtifactsDep,
    Caller,
    CallerDep,
    ClientDep,
    RequesterDep,
    SessionsDep,
    may_read_run,
)
from api.errors import ERROR_RESPONSES, ApiError, refusal_error
from api.idempotency import IdempotencyKey, idempotent, request_id_for
from client import design as design_client
from client import gate as gates
from client.temporal import describe_or_none
from keel import signed_urls
from keel.access import ACCESS_MEMO, ADMIN_ROLE, access_for
from keel.design.policy import PolicySettings
from keel.design.steps import (
    ERROR_DESIGN_INPUT,
    DesignAnswers,
    DesignInput,
    DesignOptions,
    DesignStatus,
    workflow_id,
)
from keel.gates import GateRefusal, gate_workflow_id
from keel.ids import SHORT_ID_PATTERN
from keel.settings import Settings
from keel.webhooks import webhook_url_allowed
from store import design as design_store
from store.artifacts import ArtifactNotFound
from store.design_policy import PolicyFileError, read_policy

router = APIRouter(prefix="/design", tags=["design"], responses=ERROR_RESPONSES)

#: Plan §22.3: a ping every 10 s keeps proxies from closing a quiet stream. Tests shorten
#: it (and the poll) through ``app.state.sse_ping_s`` / ``app.state.sse_poll_s``.
PING_INTERVAL_S = 10.0
#: How often a stream asks a running pipeline for new events.
POLL_INTERVAL_S = 0.3
#: How long a download link stays valid.
DOWNLOAD_TTL_S = 15 * 60
#: How long the approve route waits for a round's gate child to be started.
GATE_START_WAIT_S = 5.0

_ID = SHORT_ID_PATTERN


# --- models ---------------------------------------------------------------------------


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateProjectBody(_Body):
    id: str = Field(pattern=_ID, examples=["churn"])
    name: str = Field(default="", max_length=200)


class ProjectCreated(BaseModel):
    project_id: str


class ProjectView(BaseModel):
    id: str
    name: str
    owner_id: str
    created_at: datetime


class ProjectList(BaseModel):
    projects: list[ProjectView]


class ConstraintsBody(DesignOptions):
    """A decision set's options: everything of ``DesignInput`` but the project (the path),
    the decision set id (minted here) and the requester (the caller)."""


class DecisionSetStarted(BaseModel):
    decision_set_id: str
    project_id: str
    stream_url: str
    previous_decision_set: str | None = None


class EventView(BaseModel):
    seq: int
    key: str
    type: str
    payload: dict[str, Any]


class EventsView(BaseModel):
    decision_set_id: str
    project_id: str
    status: str | None
    done: bool
    events: list[EventView]


class ArtifactView(BaseModel):
    path: str
    kind: str
    digest: str
    size_bytes: int | None = None
    download_url: str | None = Field(
        None, description="GET it for a signed URL of the archive (archives only)"
    )
    validation: Literal["passed", "failed"] | None = Field(
        None,
        description="archives: 'failed' when the tree it holds failed a validator (the "
        "archive is still served, marked as failing), else 'passed'",
    )


class DecisionSetView(BaseModel):
    decision_set_id: str
    project_id: str
    workflow_id: str
    run_status: str | None = Field(description="The pipeline's Temporal status; None: no run")
    live: DesignStatus | None = Field(
        None, description="Query status of a running pipeline: phase, node, questions, round"
    )
    stored: dict[str, Any] | None = Field(
        None, description="The decision set row: version, status, parent, constraints, plan"
    )
    cost: dict[str, Any] | None = None
    policy: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    diff: dict[str, Any] | None = None
    artifacts: list[ArtifactView] = Field(default_factory=list)


class AnswersBody(_Body):
    answers: dict[str, Any] = Field(min_length=1, description="{Constraint Schema field: value}")


class ApproveBody(_Body):
    status: Literal["approve", "reject"]
    comment: str = Field(default="", max_length=4000)


class GenerateBody(_Body):
    """Options of the codegen decision set; its constraints come from the planned one."""

    require_approval: bool = Field(
        default=False,
        description="Open a gate again. False: only if policy fails or the cost moved "
        "over the threshold (the plan was approved on the planned decision set)",
    )
    approvers: list[str] = Field(default_factory=list)
    webhook_url: str | None = None


class DownloadLink(BaseModel):
    url: str
    expires_at: datetime
    digest: str
    size_bytes: int | None = None
    validation: Literal["passed", "failed"] = Field(
        "passed",
        description="'failed': the archived tree failed the validators named in "
        "failed_validators; the download also says so (X-Keel-Validation, file name)",
    )
    failed_validators: list[str] = Field(default_factory=list)


# --- who may see what --------------------------------------------------------------------


def _not_found(ds: str) -> ApiError:
    return ApiError(404, "not_found", f"no decision set {ds!r}")


def owns_project(sessions: Any, caller: Caller, project: str) -> bool:
    """Whether ``caller`` owns ``project`` (admin: whether it exists)."""
    if ADMIN_ROLE in caller.roles:
        return design_store.project_row(sessions, project) is not None
    row = design_store.project_row(sessions, project)
    return row is not None and row["owner_id"] == caller.actor


async def project_of(
    client: Client, sessions: Any, caller: Caller, ds: str, *, approvers_too: bool = False
) -> str:
    """The project of decision set ``ds`` that ``caller`` may see: its project's owner and
    admin (and, with ``approvers_too``, the approvers the run names). Else a 404."""
    for project in await to_thread.run_sync(design_store.projects_with, sessions, ds):
        if await to_thread.run_sync(owns_project, sessions, caller, project):
            return project
        if approvers_too and await may_read_run(client, workflow_id(project, ds), caller):
            return project
    raise _not_found(ds)


# --- projects ----------------------------------------------------------------------------


@router.post("/projects", status_code=201, response_model=ProjectCreated)
async def create_project(
    body: CreateProjectBody, sessions: SessionsDep, caller: RequesterDep, response: Response
) -> ProjectCreated:
    """Create a project owned by the caller: 201; the caller's own again: 200; another
    owner's id: 409."""
    try:
        created = await to_thread.run_sync(
            lambda: design_store.create_project(
                sessions, body.id, owner=caller.actor, name=body.name
            )
        )
    except design_store.NotYours:
        raise ApiError(409, "conflict", f"project id {body.id!r} is taken") from None
    if not created:
        response.status_code = 200
    return ProjectCreated(project_id=body.id)


class DesignPolicyView(BaseModel):
    """The organisation's design policy as the next run will read it."""

    source: str
    policy: PolicySettings


@router.get("/policy", response_model=DesignPolicyView)
async def design_policy(request: Request, caller: CallerDep) -> DesignPolicyView:
    """The organisation's design policy (read-only): allowed regions and clouds, cost-gate
    thresholds, required compliance. Set in ``configs/design/policy.yaml`` (or the file
    ``KEEL_DESIGN_POLICY`` names); a run reads it when it starts."""
    settings: Settings = request.app.state.settings
    path = settings.design_policy_path
    try:
        policy = await to_thread.run_sync(
            lambda: read_policy(path, missing_ok=settings.design_policy is None)
        )
    except PolicyFileError as exc:
        raise ApiError(500, "policy_invalid", str(exc)) from None
    return DesignPolicyView(source=str(path), policy=policy)


@router.get("/projects", response_model=ProjectList)
async def list_projects(sessions: SessionsDep, caller: CallerDep) -> ProjectList:
    """The caller's projects, newest first (admin: everyone's)."""
    owner = None if ADMIN_ROLE in caller.roles else caller.actor
    rows = await to_thread.run_sync(design_store.projects_of, sessions, owner)
    return ProjectList(projects=[ProjectView.model_validate(r) for r in rows])


async def _start(
    request: Request,
    client: Client,
    sessions: Any,
    caller: Caller,
    project: str,
    options: DesignOptions,
) -> DecisionSetStarted:
    """Mint a decision set id, note it as submitted and start its pipeline."""
    prev = options.previous_decision_set
    if prev is not None:
        row = await to_thread.run_sync(design_store.decision_set, sessions, project, prev)
        if row is None or row["version"] == 0:
            raise ApiError(
                422,
                "validation_failed",
                f"previous_decision_set {prev!r} is not a stored decision set of {project!r}",
                [{"loc": ["body", "previous_decision_set"], "msg": "not stored"}],
            )
    settings: Settings = request.app.state.settings
    url = options.webhook_url
    if url is not None and not (
        url == settings.webhook_url or webhook_url_allowed(url, settings.webhook_allowed_prefixes)
    ):
        # The worker would refuse it; say so now rather than drop every notice.
        raise ApiError(
            422,
            "validation_failed",
            "webhook_url is not KEEL_WEBHOOK_URL nor under KEEL_WEBHOOK_ALLOWED_PREFIXES",
            [{"loc": ["body", "webhook_url"], "msg": "not allowed"}],
        )
    ds = f"ds-{uuid.uuid4().hex[:12]}"
    inp = DesignInput(project=project, decision_set=ds, requester=caller.actor, **dict(options))
    await to_thread.run_sync(
        lambda: design_store.submit_decision_set(sessions, project, ds, parent=prev)
    )
    await design_client.start_design(
        client,
        inp,
        task_queue=settings.task_queue,
        memo={ACCESS_MEMO: access_for(caller.actor, [inp.approvers])},
    )
    return DecisionSetStarted(
        decision_set_id=ds,
        project_id=project,
        stream_url=f"/design/streams/{ds}",
        previous_decision_set=prev,
    )


@router.post("/projects/{project}/constraints", status_code=202, response_model=DecisionSetStarted)
async def submit_constraints(
    project: str,
    body: ConstraintsBody,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: RequesterDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Start a decision set of the caller's project: 202 with its id and stream URL."""

    async def run() -> tuple[int, Any]:
        if not await to_thread.run_sync(owns_project, sessions, caller, project):
            raise ApiError(404, "not_found", f"no project {project!r}")
        started = await _start(request, client, sessions, caller, project, body)
        return 202, started.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


# --- the stream --------------------------------------------------------------------------


def _frame(seq: int | None, event: str, data: dict[str, Any]) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _sse(
    request: Request, client: Client, sessions: Any, project: str, ds: str, after: int
) -> AsyncIterator[str]:
    """Events after ``after`` until ``run-complete`` or ``run-error``, with pings."""
    state = request.app.state
    ping_s = float(getattr(state, "sse_ping_s", PING_INTERVAL_S))
    poll_s = float(getattr(state, "sse_poll_s", POLL_INTERVAL_S))
    # Open streams, so tests can see a disconnected one end and leave nothing behind.
    state.design_streams = getattr(state, "design_streams", 0) + 1
    try:
        last_sent = time.monotonic()
        while True:
            page = await design_client.events_since(client, sessions, project, ds, after)
            for e in page.events:
                yield _frame(e.seq, e.type, e.payload)
                after = e.seq
                last_sent = time.monotonic()
            if page.done:
                return
            if time.monotonic() - last_sent >= ping_s:
                yield _frame(None, "ping", {})
                last_sent = time.monotonic()
            if await request.is_disconnected():
                return
            await asyncio.sleep(poll_s)
    finally:
        state.design_streams -= 1


@router.get(
    "/streams/{decision_set_id}",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE, plan §22.3"}},
)
async def stream(
    decision_set_id: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamingResponse:
    """The decision set's events as Server-Sent Events (``id:`` = the event's seq); with
    ``Last-Event-ID`` only the events after it. Ends after ``run-complete`` or ``run-error``."""
    project = await project_of(client, sessions, caller, decision_set_id)
    after = -1
    if last_event_id is not None and last_event_id.strip():
        try:
            after = int(last_event_id)
        except ValueError:
            raise ApiError(422, "validation_failed", "Last-Event-ID must be an event id") from None
        if after < -1:
            raise ApiError(422, "validation_failed", "Last-Event-ID must be an event id")
    return StreamingResponse(
        _sse(request, client, sessions, project, decision_set_id, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# --- reads -------------------------------------------------------------------------------


@router.get("/decision-sets/{decision_set_id}/events", response_model=EventsView)
async def list_events(
    decision_set_id: str,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    after: Annotated[int, Query(ge=-1)] = -1,
) -> EventsView:
    """The timeline: the same events as the stream, after ``after``."""
    project = await project_of(client, sessions, caller, decision_set_id)
    page = await design_client.events_since(client, sessions, project, decision_set_id, after)
    return EventsView(
        decision_set_id=decision_set_id,
        project_id=project,
        status=page.status,
        done=page.done,
        events=[
            EventView(seq=e.seq, key=e.key, type=e.type, payload=e.payload) for e in page.events
        ],
    )


@router.get("/decision-sets/{decision_set_id}", response_model=DecisionSetView)
async def get_decision_set(
    decision_set_id: str, client: ClientDep, sessions: SessionsDep, caller: CallerDep
) -> DecisionSetView:
    """A decision set: the pipeline's status while it runs; once stored, its row, plan,
    cost, policy, validation summary, diff and artifacts."""
    ds = decision_set_id
    project = await project_of(client, sessions, caller, ds)
    wid = workflow_id(project, ds)
    desc = await describe_or_none(client, wid)
    live = None
    if desc is not None and desc.status is not None and desc.status.name == "RUNNING":
        # No worker answering (one restarting) leaves out the live part, not the rest.
        with contextlib.suppress(RPCError):
            live = await design_client.status(client, project, ds)
    stored = await to_thread.run_sync(design_store.stored_view, sessions, project, ds)
    row = stored.row
    if row is not None:
        # Not persisted yet: the run's status (running, failed, ...), not "submitted".
        [row] = await design_client.true_statuses(client, sessions, project, [row])
        for key in ("created_at", "updated_at"):
            row[key] = row[key].isoformat() if row.get(key) else None
    failed = stored.failed_validators
    return DecisionSetView(
        decision_set_id=ds,
        project_id=project,
        workflow_id=wid,
        run_status=desc.status.name.lower() if desc is not None and desc.status else None,
        live=live,
        stored=row,
        cost=stored.cost,
        policy=stored.last.get("policy-update"),
        validation=stored.last.get("validation"),
        diff=stored.last.get("diff-update"),
        artifacts=[
            ArtifactView(
                **a,
                download_url=(
                    f"/design/decision-sets/{ds}/download" if a["kind"] == "archive" else None
                ),
                validation=("failed" if failed else "passed") if a["kind"] == "archive" else None,
            )
            for a in stored.artifacts
        ],
    )


# --- answers, approval, codegen ---------------------------------------------------------


async def _live_status(client: Client, project: str, ds: str) -> DesignStatus:
    wid = workflow_id(project, ds)
    desc = await describe_or_none(client, wid)
    if desc is None or desc.status is None or desc.status.name != "RUNNING":
        raise ApiError(409, "conflict", f"decision set {ds!r} is not running", run_id=wid)
    try:
        st = await design_client.status(client, project, ds)
    except RPCError:
        raise ApiError(
            503,
            "no_worker",
            f"no worker answered for decision set {ds!r}: try again shortly",
            headers={"Retry-After": "5"},
            run_id=wid,
        ) from None
    if st is None:
        raise ApiError(409, "conflict", f"decision set {ds!r} is not running", run_id=wid)
    return st


@router.post("/decision-sets/{decision_set_id}/answers", response_model=DesignStatus)
async def answer(
    decision_set_id: str,
    body: AnswersBody,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: RequesterDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Answer the open questions (Update ``answers``): 200 with the new status; a refused
    value is 422 naming the field; no open questions: 409."""
    ds = decision_set_id
    project = await project_of(client, sessions, caller, ds)
    wid = workflow_id(project, ds)

    async def run() -> tuple[int, Any]:
        st = await _live_status(client, project, ds)
        answers = DesignAnswers(
            answers=body.answers,
            actor=caller.actor,
            request_id=request_id_for(caller, idempotency_key),
        )
        try:
            new = await design_client.answer(client, project, ds, answers)
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == ERROR_DESIGN_INPUT:
                issues = cause.details[0] if cause.details else None
                raise ApiError(
                    422, "validation_failed", cause.message, issues, run_id=wid, node_name=st.node
                ) from None
            if isinstance(cause, ApplicationError) and cause.type == "NoOpenQuestions":
                raise ApiError(
                    409, "no_open_questions", cause.message, run_id=wid, node_name=st.node
                ) from None
            raise
        return 200, new.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


@router.post("/decision-sets/{decision_set_id}/approve")
async def approve(
    decision_set_id: str,
    body: ApproveBody,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: ApproverDep,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Decide the gate of the current planner round: 200 with the gate's state; no open
    gate: 409; the caller is not an approver of it (or requested it): 403."""
    ds = decision_set_id
    project = await project_of(client, sessions, caller, ds, approvers_too=True)
    wid = workflow_id(project, ds)

    async def run() -> tuple[int, Any]:
        st = await _live_status(client, project, ds)
        if st.phase != "waiting_for_approval" or st.gate_id is None:
            raise ApiError(
                409, "no_open_gate", f"decision set {ds!r} is not waiting for an approval "
                f"(phase {st.phase})", run_id=wid, node_name=st.node,
            )  # fmt: skip
        gate_id = gate_workflow_id(wid, design_client.gate_name(st.plan_round))
        if not await gates.when_open(client, gate_id, GATE_START_WAIT_S):
            raise ApiError(409, "no_open_gate", f"gate {gate_id!r} is not open yet", run_id=wid)
        try:
            state = await design_client.decide(
                client, project, ds, st.plan_round, body.status, actor=caller.actor,
                comment=body.comment, request_id=request_id_for(caller, idempotency_key),
            )  # fmt: skip
        except GateRefusal as err:
            raise refusal_error(err, run_id=wid, node_name="gate_hitl") from None
        return 200, state.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


@router.post(
    "/decision-sets/{decision_set_id}/generate",
    status_code=202,
    response_model=DecisionSetStarted,
)
async def generate(
    decision_set_id: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: RequesterDep,
    body: GenerateBody | None = None,
    idempotency_key: IdempotencyKey = None,
) -> Any:
    """Codegen for a decision set planned with ``generate=false``: a new decision set
    whose previous is this one, run with ``generate=true``. 409 unless this one completed
    without a repository."""
    ds = decision_set_id
    project = await project_of(client, sessions, caller, ds)
    options = body or GenerateBody()

    async def run() -> tuple[int, Any]:
        row = await to_thread.run_sync(design_store.decision_set, sessions, project, ds)
        if row is None or row["version"] == 0 or row["status"] != "completed":
            status = row["status"] if row else "absent"
            raise ApiError(
                409, "conflict", f"decision set {ds!r} is {status}, not completed",
                run_id=workflow_id(project, ds),
            )  # fmt: skip
        artifacts = await to_thread.run_sync(design_store.artifacts_of, sessions, project, ds)
        if any(a["kind"] == "archive" for a in artifacts):
            raise ApiError(409, "conflict", f"decision set {ds!r} has its repository already")
        started = await _start(
            request,
            client,
            sessions,
            caller,
            project,
            DesignOptions(
                previous_decision_set=ds,
                generate=True,
                require_approval=options.require_approval,
                approvers=options.approvers,
                webhook_url=options.webhook_url,
            ),
        )
        return 202, started.model_dump(mode="json")

    return await idempotent(
        sessions=sessions, key=idempotency_key, caller=caller, method="POST",
        path=request.url.path, body=options, run=run,
    )  # fmt: skip


# --- downloads ---------------------------------------------------------------------------


def _download_key(settings: Settings) -> bytes:
    # The webhook secret is the API's one configured secret (check_secrets refuses its
    # default outside dev); a purpose label keeps link signatures apart from webhook ones.
    return signed_urls.derive_key(settings.webhook_secret.get_secret_value())


def _artifact_path(digest: str) -> str:
    return f"/design/artifacts/{digest}"


@router.get("/decision-sets/{decision_set_id}/download", response_model=DownloadLink)
async def download_link(
    decision_set_id: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
) -> DownloadLink:
    """A signed URL of the repository archive, valid ``DOWNLOAD_TTL_S`` seconds; 404 when
    the decision set has no archive (planned with ``generate=false``)."""
    ds = decision_set_id
    project = await project_of(client, sessions, caller, ds)
    artifacts = await to_thread.run_sync(design_store.artifacts_of, sessions, project, ds)
    archive = next((a for a in artifacts if a["kind"] == "archive"), None)
    if archive is None:
        raise ApiError(404, "not_found", f"decision set {ds!r} has no repository archive")
    failed = await to_thread.run_sync(design_store.failing_validators, sessions, project, ds)
    expires = int(time.time()) + DOWNLOAD_TTL_S
    path = signed_urls.signed_path(
        _download_key(request.app.state.settings), _artifact_path(archive["digest"]), expires
    )
    return DownloadLink(
        url=str(request.base_url).rstrip("/") + path,
        expires_at=datetime.fromtimestamp(expires, UTC),
        digest=archive["digest"],
        size_bytes=archive["size_bytes"],
        validation="failed" if failed else "passed",
        failed_validators=failed or [],
    )


@router.get(
    "/artifacts/{digest}",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "the archive"}},
)
async def signed_download(
    digest: str,
    request: Request,
    sessions: SessionsDep,
    artifacts: ArtifactsDep,
    expires: int | None = None,
    sig: str | None = None,
) -> Response:
    """The archive a signed URL names; no bearer token. A missing, expired or tampered
    signature is 403."""
    refused = ApiError(403, "forbidden", "the download link is invalid or expired")
    if expires is None or sig is None:
        raise refused
    key = _download_key(request.app.state.settings)
    if not signed_urls.verify(key, _artifact_path(digest), expires, sig, now=time.time()):
        raise refused
    # Signed links are only made for archives; the check keeps it so if a key leaks.
    if not await to_thread.run_sync(design_store.is_archive, sessions, digest):
        raise ApiError(404, "not_found", "no such archive")
    try:
        data = await to_thread.run_sync(artifacts.get_bytes, digest)
    except ArtifactNotFound:
        raise ApiError(404, "not_found", "no such archive") from None
    failed = await to_thread.run_sync(design_store.archive_failing_validators, sessions, digest)
    name = digest.split(":", 1)[-1][:12] + ("-validation-failed" if failed else "")
    headers = {
        "Content-Disposition": f'attachment; filename="design-{name}.zip"',
        # The archive stays downloadable when its tree failed a validator, marked so.
        "X-Keel-Validation": "failed" if failed else "passed",
    }
    if failed:
        headers["X-Keel-Failed-Validators"] = ",".join(failed)
    return Response(data, media_type="application/zip", headers=headers)
