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

Every action is a use case of ``client/design_cases.py`` (the same the ``design`` CLI
calls); a route parses the request, calls it and answers with its result, or with the
HTTP error of its refusal (:func:`refusals`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.deps import (
    ArtifactsDep,
    Caller,
    CallerDep,
    ClientDep,
    RequesterDep,
    SessionsDep,
    may_read_run,
)
from api.errors import ERROR_RESPONSES, ApiError
from api.idempotency import request_id_for
from api.routes.design_errors import refusals
from api.routes.design_models import (
    AnswersBody,
    ApproveBody,
    ArtifactView,
    ConstraintsBody,
    CreateProjectBody,
    DecisionSetStarted,
    DecisionSetView,
    DesignPolicyView,
    EventsView,
    EventView,
    GenerateBody,
    ProjectCreated,
    ProjectList,
    ProjectView,
)
from api.routes.shared import ApproverPost, RequesterPost
from client import design as design_client
from client import design_cases as cases
from client.design_view import node_models, repair_rounds, stored_smoke
from keel.access import ADMIN_ROLE
from keel.design.steps import DesignAnswers, DesignOptions, DesignStatus, workflow_id
from keel.gates import GateDecision
from keel.settings import Settings
from store import design as design_store
from store.design_policy import PolicyFileError, read_policy

router = APIRouter(prefix="/design", tags=["design"], responses=ERROR_RESPONSES)

#: Plan §22.3: a ping every 10 s keeps proxies from closing a quiet stream. Tests shorten
#: it (and the poll) through ``app.state.sse_ping_s`` / ``app.state.sse_poll_s``.
PING_INTERVAL_S = 10.0
#: How often a stream asks a running pipeline for new events.
POLL_INTERVAL_S = 0.3
#: A stored row's times, as JSON gives them.
_TIMES = ("created_at", "updated_at")


@dataclass(frozen=True)
class At:
    """What a route acts with: its request, the Temporal client and the store."""

    request: Request
    client: Client
    sessions: sessionmaker[Session]


async def at(request: Request, client: ClientDep, sessions: SessionsDep) -> At:
    return At(request, client, sessions)


AtDep = Annotated[At, Depends(at)]


# --- who may see what --------------------------------------------------------------------


def owns_project(sessions: Any, caller: Caller, project: str) -> bool:
    """Whether ``caller`` owns ``project`` (admin: whether it exists)."""
    return cases.may_use_project(sessions, project, caller.actor, admin=ADMIN_ROLE in caller.roles)


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
    raise ApiError(404, "not_found", f"no decision set {ds!r}")


@dataclass(frozen=True)
class Seen:
    """A decision set the caller may read (its project's owner, admin), and what the
    route reads it with."""

    project: str
    ds: str
    client: Client
    sessions: sessionmaker[Session]
    caller: Caller


async def seen(
    decision_set_id: str, client: ClientDep, sessions: SessionsDep, caller: CallerDep
) -> Seen:
    project = await project_of(client, sessions, caller, decision_set_id)
    return Seen(project, decision_set_id, client, sessions, caller)


#: The path's decision set, when the caller may read it (else a 404).
SeenDep = Annotated[Seen, Depends(seen)]


# --- projects ----------------------------------------------------------------------------


@router.post("/projects", status_code=201, response_model=ProjectCreated)
async def create_project(
    body: CreateProjectBody, sessions: SessionsDep, caller: RequesterDep, response: Response
) -> ProjectCreated:
    """Create a project owned by the caller: 201; the caller's own again: 200; another
    owner's id: 409."""
    try:
        with refusals():
            created = await to_thread.run_sync(
                lambda: cases.create_project(sessions, body.id, owner=caller.actor, name=body.name)
            )
    except design_store.NotYours:
        raise ApiError(409, "conflict", f"project id {body.id!r} is taken") from None
    if not created:
        response.status_code = 200
    return ProjectCreated(project_id=body.id)


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
    rows = await to_thread.run_sync(
        lambda: cases.projects(sessions, caller.actor, admin=ADMIN_ROLE in caller.roles)
    )
    return ProjectList(projects=[ProjectView.model_validate(r) for r in rows])


async def _start(
    at: At, caller: Caller, project: str, options: DesignOptions
) -> DecisionSetStarted:
    """Note a new decision set (a minted id) as submitted and start its pipeline."""
    settings: Settings = at.request.app.state.settings
    with refusals(project):
        inp = await to_thread.run_sync(
            lambda: cases.new_decision_set(
                at.sessions, settings, project, options, requester=caller.actor
            )
        )
    await cases.start(at.client, inp, task_queue=settings.task_queue)
    return DecisionSetStarted(
        decision_set_id=inp.decision_set,
        project_id=project,
        stream_url=f"/design/streams/{inp.decision_set}",
        previous_decision_set=inp.previous_decision_set,
    )


@router.post("/projects/{project}/constraints", status_code=202, response_model=DecisionSetStarted)
async def submit_constraints(
    project: str,
    body: ConstraintsBody,
    at: AtDep,
    post: RequesterPost,
) -> Any:
    """Start a decision set of the caller's project: 202 with its id and stream URL."""

    async def run() -> tuple[int, Any]:
        if not await to_thread.run_sync(owns_project, at.sessions, post.caller, project):
            raise ApiError(404, "not_found", f"no project {project!r}")
        started = await _start(at, post.caller, project, body)
        return 202, started.model_dump(mode="json")

    return await post.answer_once(body, run)


# --- the stream --------------------------------------------------------------------------


def _frame(seq: int | None, event: str, data: dict[str, Any]) -> str:
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def _sse(request: Request, it: Seen, after: int) -> AsyncIterator[str]:
    """Events after ``after`` until ``run-complete`` or ``run-error``, with pings."""
    state = request.app.state
    ping_s = float(getattr(state, "sse_ping_s", PING_INTERVAL_S))
    poll_s = float(getattr(state, "sse_poll_s", POLL_INTERVAL_S))
    # Open streams, so tests can see a disconnected one end and leave nothing behind.
    state.design_streams = getattr(state, "design_streams", 0) + 1
    try:
        last_sent = time.monotonic()
        while True:
            page = await design_client.events_since(
                it.client, it.sessions, it.project, it.ds, after
            )
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
    it: SeenDep,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamingResponse:
    """The decision set's events as Server-Sent Events (``id:`` = the event's seq); with
    ``Last-Event-ID`` only the events after it. Ends after ``run-complete`` or ``run-error``."""
    after = -1
    if last_event_id is not None and last_event_id.strip():
        try:
            after = int(last_event_id)
        except ValueError:
            raise ApiError(422, "validation_failed", "Last-Event-ID must be an event id") from None
        if after < -1:
            raise ApiError(422, "validation_failed", "Last-Event-ID must be an event id")
    return StreamingResponse(
        _sse(request, it, after),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# --- reads -------------------------------------------------------------------------------


@router.get("/decision-sets/{decision_set_id}/events", response_model=EventsView)
async def list_events(
    decision_set_id: str, it: SeenDep, after: Annotated[int, Query(ge=-1)] = -1
) -> EventsView:
    """The timeline: the same events as the stream, after ``after``."""
    page = await design_client.events_since(it.client, it.sessions, it.project, it.ds, after)
    return EventsView(
        decision_set_id=it.ds,
        project_id=it.project,
        status=page.status,
        done=page.done,
        events=[
            EventView(seq=e.seq, key=e.key, type=e.type, payload=e.payload) for e in page.events
        ],
    )


@router.get("/decision-sets/{decision_set_id}", response_model=DecisionSetView)
async def get_decision_set(
    decision_set_id: str, it: SeenDep, artifacts: ArtifactsDep
) -> DecisionSetView:
    """A decision set: the pipeline's status while it runs; once stored, its row, plan,
    cost, policy, validation summary, diff, repair rounds, the model of each node,
    artifacts and the smoke (metrics, one prediction per entry point, drift)."""
    ds, project, sm = it.ds, it.project, it.sessions
    stored = await to_thread.run_sync(design_store.stored_view, sm, project, ds)
    run = await cases.run_state(it.client, sm, project, ds, stored.row)
    row = run.row
    if row is not None:
        row = {**row, **{k: row[k].isoformat() if row.get(k) else None for k in _TIMES}}
    failed = stored.failed_validators
    return DecisionSetView(
        decision_set_id=ds,
        project_id=project,
        workflow_id=workflow_id(project, ds),
        run_status=run.run_status,
        live=run.live,
        stored=row,
        cost=stored.cost,
        policy=stored.last.get("policy-update"),
        validation=stored.last.get("validation"),
        diff=stored.last.get("diff-update"),
        repairs=await to_thread.run_sync(repair_rounds, sm, project, ds),
        nodes=await to_thread.run_sync(node_models, sm, project, ds),
        smoke=await to_thread.run_sync(stored_smoke, sm, artifacts, project, ds),
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


@router.post("/decision-sets/{decision_set_id}/answers", response_model=DesignStatus)
async def answer(
    decision_set_id: str,
    body: AnswersBody,
    at: AtDep,
    post: RequesterPost,
) -> Any:
    """Answer the open questions (Update ``answers``): 200 with the new status; a refused
    value is 422 naming the field; no open questions: 409."""
    ds = decision_set_id
    project = await project_of(at.client, at.sessions, post.caller, ds)
    answers = DesignAnswers(
        answers=body.answers,
        actor=post.caller.actor,
        request_id=request_id_for(post.caller, post.key),
    )

    async def run() -> tuple[int, Any]:
        with refusals(project, ds):
            _, new = await cases.answer(at.client, project, ds, answers)
        return 200, new.model_dump(mode="json")

    return await post.answer_once(body, run)


@router.post("/decision-sets/{decision_set_id}/approve")
async def approve(
    decision_set_id: str,
    body: ApproveBody,
    at: AtDep,
    post: ApproverPost,
) -> Any:
    """Decide the gate of the current planner round: 200 with the gate's state; no open
    gate: 409; the caller is not an approver of it (or requested it): 403."""
    ds = decision_set_id
    project = await project_of(at.client, at.sessions, post.caller, ds, approvers_too=True)
    decision = GateDecision(
        decision=body.status, actor=post.caller.actor, comment=body.comment,
        request_id=request_id_for(post.caller, post.key),
    )  # fmt: skip

    async def run() -> tuple[int, Any]:
        with refusals(project, ds):
            _, state = await cases.decide(at.client, project, ds, decision)
        return 200, state.model_dump(mode="json")

    return await post.answer_once(body, run)


@router.post(
    "/decision-sets/{decision_set_id}/generate",
    status_code=202,
    response_model=DecisionSetStarted,
)
async def generate(
    decision_set_id: str,
    at: AtDep,
    post: RequesterPost,
    body: GenerateBody | None = None,
) -> Any:
    """Codegen for a decision set planned with ``generate=false``: a new decision set
    whose previous is this one, run with ``generate=true``. 409 unless this one completed
    without a repository."""
    ds = decision_set_id
    project = await project_of(at.client, at.sessions, post.caller, ds)
    o = body or GenerateBody()

    def options() -> DesignOptions:
        return cases.codegen_options(
            at.sessions, project, ds, require_approval=o.require_approval,
            approvers=o.approvers, webhook_url=o.webhook_url, validators=o.validators,
        )  # fmt: skip

    async def run() -> tuple[int, Any]:
        with refusals(project, ds):
            planned = await to_thread.run_sync(options)
        started = await _start(at, post.caller, project, planned)
        return 202, started.model_dump(mode="json")

    return await post.answer_once(o, run)
