"""The critics (technical, cost, security and compliance) and the plan's auto-revision:
whether their findings send the plan back to the planner once before the gate."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from keel.design import steps
    from keel.design.agents import (
        Refusal,
        critic_message,
        guard_findings,
        reply_schema,
        revision_for,
    )
    from keel.design.constraints import BUDGET_BAND_CEILING_USD, BudgetBand
    from keel.design.critics import (
        CostEstimate,
        Risk,
        TechReview,
        bill_of_materials,
        estimate_cost,
        estimate_plan_cost,
        review_plan,
    )
    from keel.design.planner import Revision
    from keel.design.planner import plan as make_plan
    from keel.design.policy import Status as PolicyStatus
    from keel.design.policy import structural_results
    from keel.design.reasons import ReasonCard, critic_cost_card, critic_tech_card
    from keel.design.security import review_security
    from keel.design.steps import AgentKind, AgentOutput

from workflows.design.planner import agent_run, agents_on, ask_agent
from workflows.design.state import Effect, Event, GraphState, card_events, now_iso

#: From this patch on, the cost critic sizes the bill of materials from the constraints'
#: workload (issue 24 §2); runs recorded before it priced the catalogue's fixed quantities.
COST_FROM_WORKLOAD_PATCH = "design-cost-from-workload"
#: Patch: the critics' findings may send the plan back to the planner once before the
#: gate (the plan's auto-revision, its own planner round).
PATCH_AUTO_REVISE = "design-auto-revise"


async def _critic_agent(
    state: GraphState, agent: AgentKind, key: str, rules: TechReview, kind: str
) -> tuple[list[Risk], list[Refusal], bool, AgentOutput | None]:
    """A critic agent's findings beside the rules' (checked by ``guard_findings``)."""
    ctx = state["ctx"]
    if not agents_on(ctx):
        return [], [], False, None
    message = critic_message(
        agent,
        state["snapshot"].constraints,
        state["plan"],
        ctx.data.catalog,
        rules,
        cost=state.get("cost"),
        settings=ctx.policy,
    )
    out, refusals = await ask_agent(ctx, agent, key, message, reply_schema(agent))
    risks, refused, revise = guard_findings(
        agent, state["plan"], ctx.data.catalog, out.reply if out else None, kind
    )
    return risks, [*refusals, *refused], revise, out


def _tech_card(
    state: GraphState,
    review: TechReview,
    key: str,
    refusals: list[Refusal],
    out: AgentOutput | None,
    **extra: Any,
) -> ReasonCard:
    """The technical or security critic's card, with what every critic card carries: the
    regen trigger, the time, the prompt pack, the agent's refused proposals and model."""
    return critic_tech_card(
        review,
        idempotency_key=key,
        trigger="regen",
        ts=now_iso(),
        prompt_pack=state["ctx"].data.prompt_pack,
        refusals=[r.line() for r in refusals],
        model=out.model if out else "",
        **extra,
    )


def _critic_output(
    review: TechReview, refusals: list[Refusal], out: AgentOutput | None
) -> dict[str, Any]:
    output: dict[str, Any] = {"risks": len(review.risks)}
    if out is not None or refusals:
        output["agent"] = {
            "findings": sum(1 for r in review.risks if r.id.startswith("agent:")),
            "refused": [r.model_dump() for r in refusals],
        }
    return output


async def critic_tech_node(state: GraphState) -> GraphState:
    ctx = state["ctx"]
    constraints, chosen = state["snapshot"].constraints, state["plan"]
    key = ctx.key("critic_tech", {"constraints": constraints, "plan": chosen})
    review = review_plan(constraints, chosen, ctx.data.catalog)
    added, refusals, revise, out = await _critic_agent(
        state, "critic_tech", key, review, "feasibility"
    )
    review = TechReview(risks=[*review.risks, *added])
    card = _tech_card(state, review, key, refusals, out)
    effects: list[Effect] = [
        agent_run("critic_tech", {"plan": key}, _critic_output(review, refusals, out), key, out),
        *card_events([card]),
    ]
    asked = [r for r in added if revise and r.severity == "high"]
    return {
        "review": review,
        "agent_revise": asked,
        "cards": [*state["cards"], card],
        "effects": effects,
    }


def _estimate(state: GraphState) -> tuple[str, CostEstimate]:
    """The plan's idempotency key and cost: from the stated workload since the patch,
    from the bill of materials before it."""
    ctx = state["ctx"]
    data = ctx.data
    chosen = state["plan"]
    previous = data.previous.cost if data.previous else None
    if workflow.patched(COST_FROM_WORKLOAD_PATCH):
        constraints = state["snapshot"].constraints
        key = ctx.key(
            "critic_cost", {"plan": chosen, "previous": previous, "workload": constraints}
        )
        return key, estimate_plan_cost(chosen, data.catalog, constraints, data.prices, previous)
    key = ctx.key("critic_cost", {"plan": chosen, "previous": previous})
    return key, estimate_cost(bill_of_materials(chosen, data.catalog), data.prices, previous)


def _budget(band: BudgetBand | None, cost: CostEstimate) -> tuple[PolicyStatus, TechReview]:
    """The cost against the budget band (``warn`` with none stated), and the rules' risk
    of a cost over it."""
    if band is None:
        return "warn", TechReview(risks=[])
    ceiling = BUDGET_BAND_CEILING_USD[band]
    if cost.monthly_usd <= ceiling:
        return "pass", TechReview(risks=[])
    risk = Risk(
        id="cost:over_band",
        kind="cost",
        severity="high",
        detail=f"${cost.monthly_usd:,.2f}/month is over the {band.value} band's ${ceiling:,.0f}",
    )
    return "fail", TechReview(risks=[risk])


async def critic_cost_node(state: GraphState) -> GraphState:
    data = state["ctx"].data
    key, cost = _estimate(state)
    budget, rules = _budget(state["snapshot"].constraints.budget_band, cost)
    state_for_agent: GraphState = {**state, "cost": cost}
    added, refusals, revise, out = await _critic_agent(
        state_for_agent, "critic_cost", key, rules, "cost"
    )
    card = critic_cost_card(
        cost,
        idempotency_key=key,
        trigger="regen",
        ts=now_iso(),
        prompt_pack=data.prompt_pack,
        budget_status=budget,
        extra_risks=[f"[{r.severity}] {r.detail}" for r in added] + [r.line() for r in refusals],
        model=out.model if out else "",
    )
    summary: dict[str, Any] = {
        "monthly_usd": cost.monthly_usd,
        "delta_vs_prev_usd": cost.delta_vs_prev_usd,
        "delta_vs_prev_pct": cost.delta_vs_prev_pct,
        "unpriced": len(cost.unpriced),
    }
    if out is not None or refusals:
        summary["agent"] = {"findings": len(added), "refused": [r.model_dump() for r in refusals]}
    effects: list[Effect] = [
        agent_run("critic_cost", {"plan": key}, summary, key, out),
        Event(steps.EVENT_COST, cost.model_dump(mode="json")),
        *card_events([card]),
    ]
    asked = [r for r in added if revise and r.severity == "high"]
    return {
        "cost": cost,
        "agent_revise": [*state.get("agent_revise", []), *asked],
        "cards": [*state["cards"], card],
        "effects": effects,
    }


async def critic_security_node(state: GraphState) -> GraphState:
    """The security and compliance critic (rules, plus its agent with a capable model);
    then whether the critics send the plan back to the planner, once per run."""
    ctx = state["ctx"]
    constraints, chosen = state["snapshot"].constraints, state["plan"]
    key = ctx.key(
        "critic_security", {"constraints": constraints, "plan": chosen, "policy": ctx.policy}
    )
    review = review_security(constraints, chosen, ctx.data.catalog, ctx.policy)
    added, refusals, revise, out = await _critic_agent(
        state, "critic_security", key, review, "security"
    )
    review = TechReview(risks=[*review.risks, *added])
    structural = structural_results(constraints, chosen, ctx.data.catalog, ctx.policy)
    card = _tech_card(
        state,
        review,
        key,
        refusals,
        out,
        agent="critic.security",
        node_name="critic_security",
        policy_results={
            k: v
            for k, v in structural.items()
            if k in ("region_policy", "data_class", "cloud_policy", "required_compliance")
        },
    )
    asked = [*state.get("agent_revise", []), *(r for r in added if revise and r.severity == "high")]
    output = _critic_output(review, refusals, out)
    pending = _revision(state, review, asked)
    if pending is not None:
        output["sends_back"] = pending.reasons
    effects: list[Effect] = [
        agent_run("critic_security", {"plan": key}, output, key, out),
        *card_events([card]),
    ]
    return {
        "security": review,
        "pending_revision": pending,
        "agent_revise": [],
        "cards": [*state["cards"], card],
        "effects": effects,
    }


def _revision(state: GraphState, security: TechReview, asked: list[Risk]) -> Revision | None:
    """The critics' findings send the plan back once per run (the plan's auto-revision)
    when they ask something of it: the cost over the band, a high finding on a pattern.
    With the rules alone, only when the rules' revised plan differs (else it would be
    the same plan again); with a planner agent, always (the model may do better)."""
    if state.get("revisions", 0) > 0:
        return None
    ctx = state["ctx"]
    constraints, chosen = state["snapshot"].constraints, state["plan"]
    wanted = revision_for(
        constraints, chosen, [state["review"], security], state["cost"], agent_asked=asked
    )
    if wanted is None:
        return None
    if not ctx.data.agent_model:
        again = make_plan(
            constraints,
            ctx.data.catalog,
            rejection_comment=state.get("rejection_comment"),
            revision=wanted,
        )
        if again.pattern_ids() == chosen.pattern_ids():
            return None
    # Runs recorded before the auto-revision went on to policy and the gate.
    if not workflow.patched(PATCH_AUTO_REVISE):
        return None
    return wanted


async def after_critics(state: GraphState) -> str:
    return "planner" if state.get("pending_revision") is not None else "policy_eval"
