"""Client side of ``DesignPipeline``, for the API, the ``design`` CLI and tests (by type
name: no workflow code imported here).

A decision set is one workflow, ``design/<project>/<decision set>``; its questions are
answered by Update ``answers`` and each planner round's approval is the ``ApprovalGate``
child ``.../gate/plan-r<round>``.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from client import gate as gates

# The stored reads (``design show``, ``design diff``), named here as before.
from client.design_view import DecisionSetNotFound as DecisionSetNotFound
from client.design_view import decision_set_view as decision_set_view
from client.design_view import load_diff as load_diff
from client.temporal import RunStatus, cause_chain, describe_or_none, start_by_type, status_name
from keel.design import steps
from keel.design.steps import DesignEvent, event_key, workflow_id
from keel.gates import GateDecision, GateState, gate_workflow_id
from store.design import SUBMITTED, list_events, note_run_ended
from store.design import decision_set as decision_set_row


def gate_name(plan_round: int) -> str:
    """The gate a planner round opens."""
    return f"plan-r{plan_round}"


async def start_design(
    client: Client,
    inp: steps.DesignInput,
    *,
    task_queue: str,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle[Any, steps.DesignResult]:
    """Start the decision set's pipeline; a decision set that ran before is refused
    (``WorkflowAlreadyStartedError``): a new iteration is a new decision set. The API
    passes the access ``memo`` (``keel.access``) so its read checks know the owner."""
    return await start_by_type(
        client,
        steps.WORKFLOW_TYPE,
        inp,
        workflow_id=workflow_id(inp.project, inp.decision_set),
        task_queue=task_queue,
        result_type=steps.DesignResult,
        reject_duplicate=True,
        memo=memo,
    )


def handle_of(
    client: Client, project: str, decision_set: str
) -> WorkflowHandle[Any, steps.DesignResult]:
    return client.get_workflow_handle(
        workflow_id(project, decision_set), result_type=steps.DesignResult
    )


async def status(client: Client, project: str, decision_set: str) -> steps.DesignStatus | None:
    """The ``status`` query of a running or finished pipeline; None when there is none.

    Raises:
        RPCError: no worker answered within ``QUERY_TIMEOUT`` (none running, or all busy).
    """
    wid = workflow_id(project, decision_set)
    if await describe_or_none(client, wid, steps.WORKFLOW_TYPE) is None:
        return None
    return await handle_of(client, project, decision_set).query(
        "status", result_type=steps.DesignStatus, rpc_timeout=QUERY_TIMEOUT
    )


async def true_statuses(
    client: Client,
    sessions: sessionmaker[Session],
    project: str,
    rows: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """``rows`` (``store.design.decision_sets_of``) with the status of each one still
    ``submitted`` made true: ``running`` while its pipeline runs, and how it ended
    (``failed``, ``terminated``, ``canceled``, ``timed_out``) once it ended without
    persisting; an ended status is written to its row too (``note_run_ended``), so
    readers after the run's history is gone see it. A row whose run Temporal cannot tell
    about (no such run, the server unreachable) keeps ``submitted``."""

    async def one(row: dict[str, Any]) -> dict[str, Any]:
        if row["status"] != SUBMITTED:
            return row
        try:
            desc = await describe_or_none(
                client, workflow_id(project, row["id"]), steps.WORKFLOW_TYPE
            )
        except RPCError:
            return row
        if desc is None:
            return row
        status = status_name(desc)
        if status == "running":
            return {**row, "status": status}
        if status == "completed":
            # Persisted since the row was read: the row says how.
            stored = await asyncio.to_thread(decision_set_row, sessions, project, row["id"])
            return {k: stored.get(k, v) for k, v in row.items()} if stored else row
        await asyncio.to_thread(note_run_ended, sessions, project, row["id"], status)
        return {**row, "status": status}

    return list(await asyncio.gather(*(one(r) for r in rows)))


async def answer(
    client: Client, project: str, decision_set: str, answers: steps.DesignAnswers
) -> steps.DesignStatus:
    """Update ``answers``; a refused answer raises ``WorkflowUpdateFailedError`` whose
    cause names the field."""
    return await handle_of(client, project, decision_set).execute_update(
        "answers", answers, result_type=steps.DesignStatus
    )


async def decide(
    client: Client,
    project: str,
    decision_set: str,
    plan_round: int,
    decision: Literal["approve", "reject"],
    *,
    actor: str,
    comment: str = "",
    request_id: str = "",
) -> GateState:
    """Decide the gate of planner round ``plan_round`` (a rejection's comment is the
    next round's planner input)."""
    gate = gate_workflow_id(workflow_id(project, decision_set), gate_name(plan_round))
    return await gates.decide(
        client,
        gate,
        GateDecision(decision=decision, actor=actor, comment=comment, request_id=request_id),
    )


#: How long a reader waits for a worker to answer the ``events`` query before it takes
#: "nothing yet" for the answer (a stream sends its pings meanwhile).
QUERY_TIMEOUT = timedelta(seconds=5)


class EventsPage(BaseModel):
    """A decision set's events after a place, and whether more can come."""

    events: list[DesignEvent] = Field(default_factory=list)
    status: RunStatus | None = Field(None, description="None: no such run, none stored")
    done: bool = Field(description="the last event has been given: run-complete or run-error")


async def events_since(
    client: Client,
    sessions: sessionmaker[Session],
    project: str,
    decision_set: str,
    after: int = -1,
) -> EventsPage:
    """The events of a decision set after place ``after`` (-1: all), for SSE and the CLI.

    A running pipeline answers its ``events`` query; a finished one is read from the
    ``events`` table (persist wrote every event, ``run-complete`` last), which also serves
    a run whose history is gone. A run that failed or was terminated ends with a
    ``run-error`` event made here: the workflow could not write it.
    """
    wid = workflow_id(project, decision_set)
    desc = await describe_or_none(client, wid, steps.WORKFLOW_TYPE)
    if desc is None or status_name(desc) == "completed":
        rows = await asyncio.to_thread(list_events, sessions, project, decision_set)
        stored = [DesignEvent(key=r["key"], type=r["type"], payload=r["payload"]) for r in rows]
        if desc is None and not stored:
            return EventsPage(status=None, done=True)
        return EventsPage(
            events=[e for e in stored if e.seq > after],
            status="completed",
            done=desc is not None or bool(stored),
        )
    status = status_name(desc)
    handle = client.get_workflow_handle(wid)
    try:
        events = await handle.query(
            "events",
            steps.EventsSince(after=after),
            result_type=list[DesignEvent],
            rpc_timeout=QUERY_TIMEOUT,
        )
    except RPCError:
        if status == "running":
            # No worker has answered yet (a fresh worker still starting, or all of them
            # busy or restarting): nothing new for now, and the reader asks again.
            return EventsPage(events=[], status=status, done=False)
        # A run that ended without a result may have no worker able to answer: its
        # stored events are all there is.
        rows = await asyncio.to_thread(list_events, sessions, project, decision_set)
        events = [
            DesignEvent(key=r["key"], type=r["type"], payload=r["payload"])
            for r in rows
            if r["seq"] > after
        ]
    if status == "running":
        return EventsPage(events=events, status=status, done=False)
    last = events[-1].seq if events else after
    # The node the run was in: the last event's (the query answers only after ``after``).
    node = events[-1].payload.get("node_name") if events else None
    error = await _run_error(handle, project, decision_set, last + 1, status, node)
    return EventsPage(
        events=[*events, error],
        status=status,
        done=True,
    )


async def _run_error(
    handle: WorkflowHandle[Any, Any],
    project: str,
    decision_set: str,
    seq: int,
    status: str,
    node: str | None,
) -> DesignEvent:
    """The ``run-error`` event (plan §22.3) of a run that ended ``status``."""
    message = f"the run ended {status}"
    try:
        await handle.result()
    except WorkflowFailureError as err:
        chain = cause_chain(err)
        message = str(chain[-1]) or message
    except RPCError:
        pass
    desc = await handle.describe()
    ts = desc.close_time.isoformat() if desc.close_time else ""
    return DesignEvent(
        key=event_key(seq, steps.EVENT_RUN_ERROR),
        type=steps.EVENT_RUN_ERROR,
        payload={
            "project_id": project,
            "decision_set_id": decision_set,
            "node_name": node,
            "message": message,
            "status": status,
            "ts": ts,
        },
    )
