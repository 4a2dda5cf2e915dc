"""Client side of ``DesignPipeline``, for the API, the ``design`` CLI and tests (by type
name: no workflow code imported here).

A decision set is one workflow, ``design/<project>/<decision set>``; its questions are
answered by Update ``answers`` and each planner round's approval is the ``ApprovalGate``
child ``.../gate/plan-r<round>``.
"""

from __future__ import annotations

from typing import Any, Literal

from temporalio.client import Client, WorkflowHandle

from client.temporal import describe_or_none, start_by_type
from keel.design.steps import (
    WORKFLOW_TYPE,
    DesignAnswers,
    DesignInput,
    DesignResult,
    DesignStatus,
    workflow_id,
)
from keel.gates import GateDecision, GateState, gate_workflow_id


def gate_name(plan_round: int) -> str:
    """The gate a planner round opens."""
    return f"plan-r{plan_round}"


async def start_design(
    client: Client, inp: DesignInput, *, task_queue: str
) -> WorkflowHandle[Any, DesignResult]:
    """Start the decision set's pipeline; a decision set that ran before is refused
    (``WorkflowAlreadyStartedError``): a new iteration is a new decision set."""
    return await start_by_type(
        client,
        WORKFLOW_TYPE,
        inp,
        workflow_id=workflow_id(inp.project, inp.decision_set),
        task_queue=task_queue,
        result_type=DesignResult,
        reject_duplicate=True,
    )


def handle_of(client: Client, project: str, decision_set: str) -> WorkflowHandle[Any, DesignResult]:
    return client.get_workflow_handle(workflow_id(project, decision_set), result_type=DesignResult)


async def status(client: Client, project: str, decision_set: str) -> DesignStatus | None:
    """The ``status`` query of a running or finished pipeline; None when there is none."""
    wid = workflow_id(project, decision_set)
    if await describe_or_none(client, wid, WORKFLOW_TYPE) is None:
        return None
    return await handle_of(client, project, decision_set).query("status", result_type=DesignStatus)


async def answer(
    client: Client, project: str, decision_set: str, answers: DesignAnswers
) -> DesignStatus:
    """Update ``answers``; a refused answer raises ``WorkflowUpdateFailedError`` whose
    cause names the field."""
    return await handle_of(client, project, decision_set).execute_update(
        "answers", answers, result_type=DesignStatus
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
    return await client.get_workflow_handle(gate).execute_update(
        "decide",
        GateDecision(decision=decision, actor=actor, comment=comment, request_id=request_id),
        result_type=GateState,
    )
