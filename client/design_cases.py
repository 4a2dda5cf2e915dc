"""The design family's use cases, one per action, called by both ``cli/design.py`` and
``api/routes/design.py`` (issue 41 §2): projects, starting a decision set, its run's
state, answers and gate. Each decides here what the action does and raises a
:mod:`client.design_refusals` reason when it will not; the CLI and the API only turn the
arguments or the request into a call, and the result or the refusal into their output
(each in its own words and codes). The repository's use cases are
``client/design_files.py``; the stored views ``client/design_view.py``."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from client import design as design_client
from client import gate as gates
from client.design_refusals import (
    GateNotOpenYet,
    HasRepository,
    InvalidAnswer,
    InvalidProjectId,
    NoOpenGate,
    NoOpenQuestions,
    NoRun,
    NotCompleted,
    NotProjectOwner,
    NotRunning,
    NoWorker,
    PreviousNotStored,
    ProjectNotFound,
    WebhookNotAllowed,
)
from client.temporal import describe_or_none, status_name
from keel.access import ACCESS_MEMO, access_for
from keel.design.steps import (
    ERROR_DESIGN_INPUT,
    WORKFLOW_TYPE,
    DesignAnswers,
    DesignInput,
    DesignOptions,
    DesignStatus,
    workflow_id,
)
from keel.gates import GateDecision, GateState, gate_workflow_id
from keel.ids import SHORT_ID_RE
from keel.webhooks import webhook_url_allowed
from store import design as design_store

if TYPE_CHECKING:
    from keel.settings import Settings

#: How long deciding a gate waits for the round's gate child to be started.
GATE_START_WAIT_S = 5.0
#: How long a reader waits for a running pipeline's ``status`` before it shows none.
LIVE_STATUS_WAIT_S = 10.0


# --- projects ----------------------------------------------------------------------------


def create_project(sm: sessionmaker[Session], project: str, *, owner: str, name: str) -> bool:
    """Create ``project`` owned by ``owner``; False when it is theirs already.

    Raises:
        InvalidProjectId: not a short id.
        store.design.NotYours: another owner's.
    """
    if not SHORT_ID_RE.match(project):
        raise InvalidProjectId(project)
    return design_store.create_project(sm, project, owner=owner, name=name)


def projects(sm: sessionmaker[Session], actor: str, *, admin: bool = False) -> list[dict[str, Any]]:
    """The actor's projects, newest first (admin: everyone's)."""
    return design_store.projects_of(sm, None if admin else actor)


def may_use_project(sm: sessionmaker[Session], project: str, actor: str, *, admin: bool) -> bool:
    """Whether ``actor`` owns ``project`` (admin: whether it exists)."""
    row = design_store.project_row(sm, project)
    return row is not None and (admin or row["owner_id"] == actor)


def owned_project(sm: sessionmaker[Session], project: str, actor: str) -> dict[str, Any]:
    """The project's row when ``actor`` owns it.

    Raises:
        ProjectNotFound, NotProjectOwner.
    """
    row = design_store.project_row(sm, project)
    if row is None:
        raise ProjectNotFound(project)
    if row["owner_id"] != actor:
        raise NotProjectOwner(project, row["owner_id"], actor)
    return row


def decision_sets(sm: sessionmaker[Session], project: str) -> list[dict[str, Any]]:
    """The project's decision sets, newest first, as stored."""
    return design_store.decision_sets_of(sm, project)


def unsettled(rows: list[dict[str, Any]]) -> bool:
    """Whether a row's true status needs its run asked (one is still only submitted:
    :func:`client.design.true_statuses`)."""
    return any(r["status"] == design_store.SUBMITTED for r in rows)


# --- starting a decision set -------------------------------------------------------------


def new_decision_set(
    sm: sessionmaker[Session],
    settings: Settings,
    project: str,
    options: DesignOptions,
    *,
    requester: str,
    decision_set: str | None = None,
    numbered: bool = False,
) -> DesignInput:
    """Check a new decision set's options, note it as submitted and give its input: its
    id is ``decision_set``, else ``ds<N>`` (``numbered``: the project's N-th), else a
    minted ``ds-<12 hex>``.

    Raises:
        PreviousNotStored: ``previous_decision_set`` is no stored set of the project.
        WebhookNotAllowed: the worker would refuse its ``webhook_url``.
        pydantic.ValidationError: the input does not validate.
    """
    prev = options.previous_decision_set
    if prev is not None:
        row = design_store.decision_set(sm, project, prev)
        if row is None or row["version"] == 0:
            raise PreviousNotStored(project, prev)
    url = options.webhook_url
    if url is not None and not (
        url == settings.webhook_url or webhook_url_allowed(url, settings.webhook_allowed_prefixes)
    ):
        raise WebhookNotAllowed(url)
    if decision_set is None and numbered:
        decision_set = f"ds{len(design_store.decision_sets_of(sm, project)) + 1}"
    elif decision_set is None:
        decision_set = f"ds-{uuid.uuid4().hex[:12]}"
    inp = DesignInput(
        project=project, decision_set=decision_set, requester=requester, **dict(options)
    )
    design_store.submit_decision_set(sm, project, decision_set, parent=prev)
    return inp


async def start(client: Client, inp: DesignInput, *, task_queue: str) -> Any:
    """Start the noted decision set's pipeline, its access memo naming the requester and
    the approvers (``keel.access``)."""
    return await design_client.start_design(
        client,
        inp,
        task_queue=task_queue,
        memo={ACCESS_MEMO: access_for(inp.requester, [inp.approvers])},
    )


def codegen_options(
    sm: sessionmaker[Session],
    project: str,
    ds: str,
    *,
    require_approval: bool,
    approvers: list[str],
    webhook_url: str | None,
    validators: list[str] | None = None,
) -> DesignOptions:
    """The options of the codegen decision set of ``ds`` (planned with ``generate=false``):
    its previous is ``ds``, run with ``generate=true`` and ``validators`` (None: every one).

    Raises:
        NotCompleted: ``ds`` is not a completed, stored decision set.
        HasRepository: ``ds`` has its repository already.
    """
    stored = design_store.stored_view(sm, project, ds)
    row = stored.row
    if row is None or row["version"] == 0 or row["status"] != "completed":
        raise NotCompleted(ds, row["status"] if row else "absent")
    if stored.archive is not None:
        raise HasRepository(ds)
    return DesignOptions(
        previous_decision_set=ds,
        generate=True,
        require_approval=require_approval,
        approvers=approvers,
        webhook_url=webhook_url,
        validators=validators,
    )


# --- a running decision set: its state, answers and gate ----------------------------------


@dataclass
class RunState:
    """A decision set's run as Temporal tells it: its status (None: no run), the live
    ``status`` query of a running one (None when it has none, or no worker answered:
    ``unanswered`` says why) and the row with its true status (``true_statuses``)."""

    run_status: str | None
    live: DesignStatus | None
    row: dict[str, Any] | None
    unanswered: str | None = None


async def run_state(
    client: Client, sm: sessionmaker[Session], project: str, ds: str, row: dict[str, Any] | None
) -> RunState:
    """The run of ``ds`` and its ``row`` (as stored) made true."""
    desc = await describe_or_none(client, workflow_id(project, ds))
    live, unanswered = None, None
    if desc is not None and desc.status == WorkflowExecutionStatus.RUNNING:
        # No worker answering (one restarting) leaves out the live part, not the rest.
        try:
            live = await asyncio.wait_for(
                design_client.status(client, project, ds), LIVE_STATUS_WAIT_S
            )
        except (RPCError, TimeoutError) as e:
            unanswered = f"the run does not answer its status query: {e}"
    if row is not None:
        # Not persisted yet: the run's status (running, failed, ...), not "submitted".
        [row] = await design_client.true_statuses(client, sm, project, [row])
    run_status = desc.status.name.lower() if desc is not None and desc.status else None
    return RunState(run_status, live, row, unanswered)


async def running_status(client: Client, project: str, ds: str) -> DesignStatus:
    """The ``status`` of a running decision set.

    Raises:
        NoRun, NotRunning, NoWorker.
    """
    desc = await describe_or_none(client, workflow_id(project, ds), WORKFLOW_TYPE)
    if desc is None:
        raise NoRun(project, ds)
    if status_name(desc) != "running":
        raise NotRunning(project, ds, status_name(desc))
    try:
        st = await design_client.status(client, project, ds)
    except RPCError as e:
        raise NoWorker(project, ds, e) from e
    if st is None:
        raise NoRun(project, ds)
    return st


async def answer(
    client: Client, project: str, ds: str, answers: DesignAnswers
) -> tuple[DesignStatus, DesignStatus]:
    """Answer a running decision set's open questions: its status before and after.

    Raises:
        NoRun, NotRunning, NoWorker: as :func:`running_status`.
        InvalidAnswer: a value that does not validate.
        NoOpenQuestions: none to answer.
        temporalio.client.WorkflowUpdateFailedError: any other refusal.
    """
    st = await running_status(client, project, ds)
    try:
        return st, await design_client.answer(client, project, ds, answers)
    except WorkflowUpdateFailedError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.type == ERROR_DESIGN_INPUT:
            issues = cause.details[0] if cause.details else None
            raise InvalidAnswer(cause.message, issues, st) from err
        if isinstance(cause, ApplicationError) and cause.type == "NoOpenQuestions":
            raise NoOpenQuestions(cause.message, st) from err
        raise


async def decide(
    client: Client, project: str, ds: str, decision: GateDecision
) -> tuple[DesignStatus, GateState]:
    """Decide the gate of the running decision set's current planner round (a
    rejection's comment is the next round's planner input): its status and the gate's
    state.

    Raises:
        NoRun, NotRunning, NoWorker: as :func:`running_status`.
        NoOpenGate: the run waits for no approval.
        GateNotOpenYet: the round's gate was not started within ``GATE_START_WAIT_S``.
        keel.gates.GateRefusal: the gate refused the decision (not an approver, ...).
    """
    st = await running_status(client, project, ds)
    if st.phase != "waiting_for_approval" or st.gate_id is None or not st.plan_round:
        raise NoOpenGate(project, ds, st)
    gate_id = gate_workflow_id(workflow_id(project, ds), design_client.gate_name(st.plan_round))
    if not await gates.when_open(client, gate_id, GATE_START_WAIT_S):
        raise GateNotOpenYet(gate_id)
    return st, await gates.decide(client, gate_id, decision)
