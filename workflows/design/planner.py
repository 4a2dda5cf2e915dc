"""The planner node: the rules' plan and, with a capable model, the planner agent's choice
(checked by the rules); the agent call the critics share."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from keel.design import steps
    from keel.design.agents import (
        PROMPTS,
        Refusal,
        guard_plan,
        planner_message,
        reply_schema,
    )
    from keel.design.constraints import FIELD_NAMES, Constraints, is_stated
    from keel.design.patterns import PatternCatalog
    from keel.design.planner import Plan, Revision, interpret_comment
    from keel.design.planner import plan as make_plan
    from keel.design.policy import structural_results
    from keel.design.reasons import Trigger, planner_cards
    from keel.design.steps import AgentInput, AgentKind, AgentOutput
    from workflows.common import call

from workflows.design.state import (
    DesignContext,
    Effect,
    Event,
    GraphState,
    Notify,
    Run,
    SetStatus,
    card_events,
    now_iso,
)

#: Patch: the planner and critics ask the decision set's model when it is capable
#: (activity ``design.agent``, issue 24 §4). Asked only when design.load found one.
PATCH_AGENTS = "design-agents"


async def ask_agent(
    ctx: DesignContext, agent: AgentKind, key: str, message: str, schema: dict[str, Any]
) -> tuple[AgentOutput | None, list[Refusal]]:
    """One agent's model call (activity ``design.agent``); on a model that cannot be
    reached (past the retries) or a reply that does not fit after the re-ask, the rules
    decide alone and the refusal says why."""
    model = ctx.data.agent_model or ""
    try:
        out = await call(
            steps.AGENT,
            AgentInput(
                key=key,
                agent=agent,
                model=model,
                system_prompt=ctx.data.prompts[PROMPTS[agent]],
                message=message,
                json_schema=schema,
            ),
            summary=f"{agent} agent: {model}",
        )
    except ActivityError as err:
        cause = str(err.cause or err)[:300]
        return None, [Refusal(agent=agent, proposal="(no reply)", rule="unreachable", reason=cause)]
    if out.reply is None:
        return out, [
            Refusal(
                agent=agent,
                proposal="(reply)",
                rule="unusable_reply",
                reason="not the schema after a re-ask: " + "; ".join(out.problems[:3]),
            )
        ]
    return out, []


def agents_on(ctx: DesignContext) -> bool:
    """Whether the planner and critics ask a model: the decision set's model is capable
    (only runs started since the agents ask; older histories had no such model)."""
    return bool(ctx.data.agent_model) and workflow.patched(PATCH_AGENTS)


def agent_run(
    node: str, node_input: Any, output: dict[str, Any], key: str, out: AgentOutput | None
) -> Run:
    if out is None:
        return Run(node, node_input, output, key=key)
    return Run.of_model(node, node_input, output, key, out)


def _impacts(plan: Plan, catalog: PatternCatalog) -> dict[str, dict[str, float | None]]:
    by_id = catalog.by_id()
    out: dict[str, dict[str, float | None]] = {}
    for pid in plan.pattern_ids():
        p = by_id.get(pid)
        if p is not None:
            out[pid] = {
                "cost_tier": float(p.cost_tier),
                "p95_latency_ms": float(p.p95_latency_ms) if p.p95_latency_ms else None,
                "availability": p.availability,
            }
    return out


def _trigger(comment: str | None, revision: Revision | None) -> Trigger:
    """Why the planner ran: a rejection's comment, a revision, or new constraints."""
    if comment and revision is None:
        return "user_reject"
    return "regen" if revision is not None else "constraints_updated"


async def _agent_plan(
    ctx: DesignContext,
    key: str,
    constraints: Constraints,
    chosen: Plan,
    comment: str | None,
    revision: Revision | None,
) -> tuple[Plan, AgentOutput | None, list[Refusal], dict[str, str]]:
    """The planner agent's choice, checked by the rules: the plan, the agent's reply,
    what the rules refused and what they accepted."""
    catalog = ctx.data.catalog
    message = planner_message(
        constraints, chosen, catalog, rejection_comment=comment, revision=revision
    )
    agent_out, refusals = await ask_agent(
        ctx, "planner", key, message, reply_schema("planner", catalog)
    )
    guarded = guard_plan(
        constraints,
        catalog,
        chosen,
        agent_out.reply if agent_out else None,
        ctx.policy,
        refusals=refusals,
    )
    return guarded.plan, agent_out, guarded.refusals, guarded.accepted


def _planner_output(
    n: int,
    chosen: Plan,
    catalog: PatternCatalog,
    comment: str | None,
    revision: Revision | None,
    agent: tuple[AgentOutput | None, list[Refusal], dict[str, str]],
) -> dict[str, Any]:
    """The round's record: its plan's choices and gaps, the comment read, the revision,
    and the agent's accepted and refused proposals."""
    agent_out, refusals, accepted = agent
    output: dict[str, Any] = {
        "round": n,
        "choices": {c.capability.value: c.pattern_id for c in chosen.choices},
        "gaps": [g.capability.value for g in chosen.gaps],
    }
    if comment:
        output["feedback"] = interpret_comment(comment, catalog).model_dump(mode="json")
    if revision is not None:
        output["revision"] = revision.model_dump(mode="json")
    if agent_out is not None or refusals:
        output["agent"] = {"accepted": accepted, "refused": [r.model_dump() for r in refusals]}
    return output


async def planner_node(state: GraphState) -> GraphState:
    """The rules' plan; with a capable model, the planner agent's choice among the
    catalogue's patterns, checked by the rules (``keel.design.agents.guard_plan``)."""
    ctx = state["ctx"]
    catalog = ctx.data.catalog
    comment = state.get("rejection_comment")
    revision = state.get("pending_revision")
    constraints = state["snapshot"].constraints
    node_input: dict[str, Any] = {"constraints": constraints, "rejection_comment": comment}
    if revision is not None:
        node_input["revision"] = revision
    key = ctx.key("planner", node_input)
    chosen = make_plan(constraints, catalog, rejection_comment=comment, revision=revision)
    n = state.get("plan_round", 0) + 1
    agent_out: AgentOutput | None = None
    refusals: list[Refusal] = []
    accepted: dict[str, str] = {}
    if agents_on(ctx):
        chosen, agent_out, refusals, accepted = await _agent_plan(
            ctx, key, constraints, chosen, comment, revision
        )
    cards = planner_cards(
        chosen,
        idempotency_key=key,
        constraints_keys=[f for f in FIELD_NAMES if is_stated(constraints, f)],
        trigger=_trigger(comment, revision),
        ts=now_iso(),
        prompt_pack=ctx.data.prompt_pack,
        policy_results=structural_results(constraints, chosen, catalog, ctx.policy),
        impacts=_impacts(chosen, catalog),
        refusals=[r.line() for r in refusals],
        model=agent_out.model if agent_out else "",
    )
    output = _planner_output(n, chosen, catalog, comment, revision, (agent_out, refusals, accepted))
    effects: list[Effect] = [
        SetStatus({"plan_round": n}),
        agent_run("planner", node_input, output, key, agent_out),
        Event(steps.EVENT_PLAN, output),
        Notify("plan.ready", {"plan_round": n}),
        *card_events(cards),
    ]
    # ``revision``: what this round was revised for (the gate shows it), none otherwise.
    update: GraphState = {
        "plan": chosen,
        "plan_round": n,
        "cards": cards,
        "effects": effects,
        "revision": revision,
    }
    if revision is not None:
        update |= {"pending_revision": None, "revisions": state.get("revisions", 0) + 1}
    return update
