"""The gate loop: the policy in force, an ``ApprovalGate`` child per planner round, and
where a decision sends the graph (codegen, the planner again with the rejection's
comment, or the rationale)."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langgraph.runtime import Runtime

    from keel.design import steps
    from keel.design.policy import evaluate_policy, gate_required
    from keel.design.reasons import policy_card
    from keel.design.steps import ApprovalRecord
    from keel.gates import GateRequest, GateState, GateStatus, gate_workflow_id
    from workflows.gate import open_gate

from workflows.design.state import (
    Approval,
    DesignPorts,
    Effect,
    Event,
    GraphState,
    Notify,
    Run,
    SetStatus,
    card_events,
    now_iso,
)


async def policy_eval_node(state: GraphState) -> GraphState:
    ctx = state["ctx"]
    constraints, chosen = state["snapshot"].constraints, state["plan"]
    report = evaluate_policy(
        constraints, chosen, ctx.data.catalog, state["cost"], state["review"], ctx.policy
    )
    decision = gate_required(state["cost"], report, ctx.policy)
    key = ctx.key("policy_eval", {"plan": chosen, "cost": state["cost"]})
    card = policy_card(
        report,
        state["cost"],
        gate_required=decision.required,
        gate_reasons=list(decision.reasons),
        idempotency_key=key,
        ts=now_iso(),
        prompt_pack=ctx.data.prompt_pack,
    )
    effects: list[Effect] = [
        Run("policy_eval", {"plan": key}, {"overall": report.overall}, key=key),
        Event(
            steps.EVENT_POLICY,
            {**report.model_dump(mode="json"), "gate_required": decision.required},
        ),
        *card_events([card]),
    ]
    return {
        "policy": report,
        "gate_required": decision.required,
        "gate_reasons": list(decision.reasons),
        "cards": [*state["cards"], card],
        "effects": effects,
    }


def _gate_details(state: GraphState, n: int) -> dict[str, Any]:
    """What the gate shows its approvers: the round's plan, cost and policy, and what the
    round was planned again or revised for."""
    inp, cost = state["ctx"].inp, state["cost"]
    details: dict[str, Any] = {
        "decision_set": inp.decision_set,
        "round": n,
        "plan": {c.capability.value: c.pattern_id for c in state["plan"].choices},
        "monthly_usd": cost.monthly_usd,
        "delta_vs_prev_usd": cost.delta_vs_prev_usd,
        "policy": state["policy"].overall,
        "gate_reasons": state["gate_reasons"],
    }
    if state.get("rejection_comment"):
        details["replanned_for"] = state["rejection_comment"]
    revision = state.get("revision")
    if revision is not None:
        details["revised_for"] = revision.reasons
    return details


def _decided(name: str, n: int, gate: GateState) -> GraphState:
    """The graph's update for the gate's decision: its record, and a rejection's comment
    for the planner."""
    actor = gate.decided_by or ""
    rejected = gate.status == GateStatus.REJECTED
    effects: list[Effect] = [
        SetStatus({"phase": "running"}),
        Approval(
            ApprovalRecord(
                gate=name, actor=actor, status=gate.status.value, comment=gate.decision_comment
            ),
            rejection_comment=gate.decision_comment if rejected else None,
        ),
        Run("gate_hitl", {"round": n}, {"status": gate.status.value, "by": actor}),
        Event(steps.EVENT_APPROVAL, {"gate": name, "status": gate.status.value, "by": actor}),
    ]
    if rejected:
        return {
            "gate_status": "rejected",
            "rejection_comment": gate.decision_comment,
            "effects": effects,
        }
    return {"gate_status": gate.status.value, "rejection_comment": None, "effects": effects}


async def gate_hitl_node(state: GraphState, runtime: Runtime[DesignPorts]) -> GraphState:
    """An ``ApprovalGate`` child per planner round, unless neither the input nor §23.5
    asks for one."""
    ctx = state["ctx"]
    inp, cost, report = ctx.inp, state["cost"], state["policy"]
    n = state["plan_round"]
    if not (inp.require_approval or state["gate_required"]):
        run = Run("gate_hitl", {"round": n}, {"status": "not_required"})
        return {"gate_status": "not_required", "rejection_comment": None, "effects": [run]}
    name = f"plan-r{n}"
    gate_id = gate_workflow_id(ctx.thread_id, name)
    details = _gate_details(state, n)
    # Before the wait: the stream and the status query show the open gate at once.
    runtime.context.emit(
        [
            SetStatus({"gate_id": gate_id, "phase": "waiting_for_approval"}),
            Event(steps.EVENT_GATE_WAITING, {"gate": name, "gate_id": gate_id, "round": n}),
            Notify("gate.waiting", {"gate_id": gate_id, "plan_round": n}),
        ]
    )
    gate = await open_gate(
        GateRequest(
            name=name,
            requester=inp.requester,
            approvers=inp.approvers,
            subject=f"Design {inp.project}/{inp.decision_set}, planner round {n}: "
            f"${cost.monthly_usd:,.2f}/month, policy {report.overall}",
            details=details,
            expires_in_s=inp.gate_expires_in_s,
        )
    )
    return _decided(name, n, gate)


async def after_gate(state: GraphState) -> str:
    status = state["gate_status"]
    inp = state["ctx"].inp
    if status in ("approved", "not_required"):
        return "codegen" if inp.generate else "rationale_compile"
    if (
        status == "rejected"
        and state.get("rejection_comment")
        and state["plan_round"] < inp.max_plan_rounds
    ):
        return "planner"
    return "rationale_compile"
