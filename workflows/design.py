"""``DesignPipeline``: requirements to a reviewed, costed, approved and generated design.

One workflow per decision set, id ``design/<project>/<decision set>``. The 12 nodes of
plan §21.1 are a LangGraph ``StateGraph`` run through Temporal's LangGraph plugin
(``temporalio.langgraph.LangGraphPlugin``, registered on the worker with
:func:`build_graph`). Every node runs in the workflow (``execute_in="workflow"``): the
pure ones (coverage, questions, planner, critics, policy, rationale) compute there and
replay, and the ones that do I/O (intake, codegen, validators, persist) each call their
own activity through ``workflows.common.call``, so each keeps its row of limits in
``OPTIONS``, a summary in the Web UI and pydantic models in history. The graph is the
checkpoint-free part of LangGraph: the workflow history is the checkpoint.

Loops: ``adaptive_questions`` waits for Update ``answers`` and goes back to
``coverage_check`` until the intake is covered; ``gate_hitl`` opens an ``ApprovalGate``
child per planner round, and a rejection's comment sends the graph back to ``planner``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypedDict, cast

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from langgraph.graph import END, START, StateGraph
    from langgraph.runtime import Runtime
    from langsmith.run_helpers import tracing_context
    from temporalio.langgraph import graph as registered_graph

    from keel.design import steps
    from keel.design.agents import (
        PROMPTS,
        Refusal,
        critic_message,
        guard_findings,
        guard_plan,
        planner_message,
        reply_schema,
        revision_for,
    )
    from keel.design.constraints import BUDGET_BAND_CEILING_USD, FIELD_NAMES, is_stated
    from keel.design.coverage import (
        Coverage,
        IntakeSnapshot,
        Question,
        adaptive_questions,
        apply_answers,
        coverage_check,
    )
    from keel.design.critics import (
        CostEstimate,
        Risk,
        TechReview,
        bill_of_materials,
        estimate_cost,
        estimate_plan_cost,
        review_plan,
    )
    from keel.design.diff import change_summary, change_summary_md, state_diff
    from keel.design.errors import ConstraintError
    from keel.design.patterns import PatternCatalog
    from keel.design.planner import Plan, Revision, interpret_comment
    from keel.design.planner import plan as make_plan
    from keel.design.policy import (
        PolicyReport,
        PolicySettings,
        evaluate_policy,
        gate_required,
        structural_results,
    )
    from keel.design.policy import Status as PolicyStatus
    from keel.design.reasons import (
        ReasonCard,
        Trigger,
        codegen_card,
        critic_cost_card,
        critic_tech_card,
        design_rationale_md,
        node_idempotency_key,
        planner_cards,
        policy_card,
        rationale_json,
    )
    from keel.design.security import review_security
    from keel.design.steps import (
        AgentInput,
        AgentKind,
        AgentOutput,
        AgentRun,
        ApprovalRecord,
        CodegenInput,
        CodegenOutput,
        DesignAnswers,
        DesignEvent,
        DesignInput,
        DesignResult,
        DesignStatus,
        EventsSince,
        IntakeInput,
        LoadInput,
        LoadOutput,
        PersistInput,
        ValidateInput,
        ValidateOutput,
    )
    from keel.digest import canonical_json, digest_json
    from keel.gates import (
        DesignNotice,
        GateRequest,
        GateStatus,
        WebhookDelivery,
        gate_workflow_id,
    )
    from keel.refs import NOTIFY_WEBHOOK
    from workflows.common import call
    from workflows.gate import open_gate

#: The name the graph is registered under in the plugin.
GRAPH_NAME = "design"
#: LangGraph counts supersteps; questions and planner rounds loop, so this bounds
#: the most the input allows, (20 question rounds x 2) + (10 planner rounds x 6) + 12 = 112.
RECURSION_LIMIT = 200
INTAKE_PROMPT = "intake_extract"
#: Patch: an intake reply that does not fit goes to questions (``IntakeSnapshot.unfit``).
PATCH_INTAKE_UNFIT = "design-intake-unfit"
#: From this patch on, the cost critic sizes the bill of materials from the constraints'
#: workload (issue 24 §2); runs recorded before it priced the catalogue's fixed quantities.
COST_FROM_WORKLOAD_PATCH = "design-cost-from-workload"
#: Patch: the planner and critics ask the decision set's model when it is capable
#: (activity ``design.agent``, issue 24 §4). Asked only when design.load found one.
PATCH_AGENTS = "design-agents"
#: Patch: the critics' findings may send the plan back to the planner once before the
#: gate (the plan's auto-revision, its own planner round).
PATCH_AUTO_REVISE = "design-auto-revise"


@dataclass(frozen=True)
class DesignContext:
    """What every node reads besides the graph's own keys: the run's input, the design
    data ``design.load`` returned (an activity result, so in history), the policy in
    force and the thread id its keys are drawn from. Travels in the state (``ctx``)."""

    thread_id: str
    inp: DesignInput
    data: LoadOutput
    policy: PolicySettings

    def key(self, node: str, node_input: Any) -> str:
        """The node's idempotency key (§21.3): thread = the workflow's id."""
        return node_idempotency_key(self.thread_id, node, _dump_deep(node_input))


# --- effects: what a node asks the workflow class to note (it applies them in order) ---


@dataclass(frozen=True)
class Run:
    """A node's run: the query's progress and an ``agent_runs`` row."""

    node: str
    node_input: Any
    output: dict[str, Any]
    key: str | None = None
    provider: str = "workflow"
    model: str = ""
    tokens: int = 0
    latency_ms: int = 0


@dataclass(frozen=True)
class Event:
    """An event for the stream and the ``events`` table (envelope added when applied)."""

    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Notify:
    """A webhook notice, sent beside the pipeline if the input names a URL."""

    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class SetStatus:
    """Fields of the ``status`` query to set."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class Approval:
    record: ApprovalRecord
    rejection_comment: str | None = None


@dataclass(frozen=True)
class Stored:
    """An event persist already wrote (run-complete), as written."""

    event: DesignEvent


Effect = Run | Event | Notify | SetStatus | Approval | Stored


@dataclass(frozen=True)
class DesignPorts:
    """What a node may ask of the workflow while it runs, passed explicitly as the
    graph's runtime context (``Runtime.context``): apply effects now (before a wait or an
    activity that must see them), wait for Update ``answers``, and read the run's journal
    (``agent_runs``, approvals, events) for persist."""

    emit: Callable[[list[Effect]], None]
    ask: Callable[[list[Question], IntakeSnapshot, int], Awaitable[IntakeSnapshot]]
    journal: Callable[[], tuple[list[AgentRun], list[ApprovalRecord], list[DesignEvent]]]


class GraphState(TypedDict, total=False):
    """The graph's shared state (plan §21.2): each node merges its keys in."""

    ctx: DesignContext
    effects: list[Effect]
    snapshot: IntakeSnapshot
    coverage: Coverage
    question_round: int
    plan: Plan
    plan_round: int
    rejection_comment: str | None
    pending_revision: Revision | None
    revision: Revision | None
    revisions: int
    review: TechReview
    security: TechReview
    agent_revise: list[Risk]
    cost: CostEstimate
    policy: PolicyReport
    gate_required: bool
    gate_reasons: list[str]
    gate_status: str
    cards: list[ReasonCard]
    codegen: CodegenOutput
    validation: ValidateOutput
    rationale: dict[str, Any]
    rationale_md: str
    outcome: str
    version: int
    archive_digest: str | None
    git_commit: str | None
    diff: dict[str, Any] | None


def _dump(value: Any) -> Any:
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def _now() -> str:
    return workflow.now().isoformat()


def _card_events(cards: list[ReasonCard]) -> list[Effect]:
    return [Event(steps.EVENT_REASON_CARD, c.model_dump(mode="json")) for c in cards]


# --- nodes --------------------------------------------------------------------------


async def intake_extract(state: GraphState) -> GraphState:
    """Free text to the Constraint Schema (an activity), or the guided form as given;
    on an iteration both are merged over the previous decision set's constraints."""
    ctx = state["ctx"]
    inp, data = ctx.inp, ctx.data
    base = (
        IntakeSnapshot(constraints=data.previous.constraints) if data.previous else IntakeSnapshot()
    )
    if inp.intake is not None:
        snapshot = _apply(base, inp.intake, "intake")
        run = Run("intake_extract", {"intake": inp.intake}, {"mode": "guided"})
        return {"snapshot": snapshot, "effects": [run]}
    if not inp.requirements.strip():
        run = Run("intake_extract", {}, {"mode": "previous" if data.previous else "empty"})
        return {"snapshot": base, "effects": [run]}
    key = ctx.key("intake_extract", {"text": inp.requirements, "model": inp.model})
    out = await call(
        steps.INTAKE_EXTRACT,
        IntakeInput(
            key=key,
            text=inp.requirements,
            system_prompt=data.prompts[INTAKE_PROMPT],
            model=inp.model,
        ),
        summary=f"intake_extract: {len(inp.requirements)} chars",
    )
    extracted = out.snapshot.constraints
    stated = {f: _dump(getattr(extracted, f)) for f in FIELD_NAMES if is_stated(extracted, f)}
    merged = _apply(base, stated, "extracted")
    snapshot = IntakeSnapshot(
        constraints=merged.constraints, ambiguous={**merged.ambiguous, **out.snapshot.ambiguous}
    )
    output: dict[str, Any] = {"stated": sorted(stated), "ambiguous": sorted(out.snapshot.ambiguous)}
    # Fields the model's reply did not fit even after the re-ask become questions.
    # Recorded runs had none (their activity failed instead), so the marker only guards.
    if workflow.patched(PATCH_INTAKE_UNFIT) and (out.snapshot.unfit or out.reasked):
        snapshot = snapshot.model_copy(update={"unfit": dict(out.snapshot.unfit)})
        output.update(unfit=sorted(out.snapshot.unfit), reasked=out.reasked)
    run = Run(
        "intake_extract",
        {"text_digest": digest_json(inp.requirements)},
        output,
        key=key,
        provider="llm",
        model=out.model,
        tokens=out.tokens_total,
        latency_ms=out.latency_ms,
    )
    return {"snapshot": snapshot, "effects": [run]}


def _apply(base: IntakeSnapshot, values: dict[str, Any], what: str) -> IntakeSnapshot:
    try:
        return apply_answers(base, values)
    except ConstraintError as exc:
        raise ApplicationError(
            f"{what} is not the Constraint Schema: {exc}",
            [i.model_dump() for i in exc.issues],
            type=steps.ERROR_DESIGN_INPUT,
            non_retryable=True,
        ) from None


async def coverage_check_node(state: GraphState) -> GraphState:
    cov = coverage_check(state["snapshot"], state["ctx"].inp.coverage_threshold)
    payload: dict[str, Any] = {"score": cov.score, "missing": cov.missing, "covered": cov.covered}
    if cov.unfit:
        payload["unfit"] = cov.unfit
    effects: list[Effect] = [
        SetStatus({"coverage": cov}),
        Run(
            "coverage_check",
            state["snapshot"],
            {"score": cov.score, "covered": cov.covered, "conflicts": len(cov.conflicts)},
        ),
        Event(steps.EVENT_COVERAGE, payload),
    ]
    return {"coverage": cov, "effects": effects}


# Routers are async: LangGraph runs a sync one in an executor, which a workflow has not.
async def after_coverage(state: GraphState) -> str:
    if state["coverage"].covered:
        return "planner"
    if state.get("question_round", 0) >= state["ctx"].inp.max_question_rounds:
        return "rationale_compile"
    return "adaptive_questions"


async def adaptive_questions_node(state: GraphState, runtime: Runtime[DesignPorts]) -> GraphState:
    """Ask the fewest questions and wait for Update ``answers`` (the workflow's port)."""
    questions = adaptive_questions(state["coverage"])
    n = state.get("question_round", 0) + 1
    snapshot = await runtime.context.ask(questions, state["snapshot"], n)
    run = Run(
        "adaptive_questions",
        {"questions": [q.field for q in questions], "round": n},
        {"answered": snapshot.constraints.model_dump(mode="json", exclude_defaults=True)},
    )
    return {"snapshot": snapshot, "question_round": n, "effects": [run]}


async def _ask_agent(
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


def _agents_on(ctx: DesignContext) -> bool:
    """Whether the planner and critics ask a model: the decision set's model is capable
    (only runs started since the agents ask; older histories had no such model)."""
    return bool(ctx.data.agent_model) and workflow.patched(PATCH_AGENTS)


def _agent_run(
    node: str, node_input: Any, output: dict[str, Any], key: str, out: AgentOutput | None
) -> Run:
    if out is None:
        return Run(node, node_input, output, key=key)
    return Run(
        node,
        node_input,
        output,
        key=key,
        provider="llm",
        model=out.model,
        tokens=out.tokens_total,
        latency_ms=out.latency_ms,
    )


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
    if _agents_on(ctx):
        message = planner_message(
            constraints, chosen, catalog, rejection_comment=comment, revision=revision
        )
        agent_out, refusals = await _ask_agent(
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
        chosen, refusals, accepted = guarded.plan, guarded.refusals, guarded.accepted
    trigger: Trigger = (
        "user_reject"
        if comment and revision is None
        else ("regen" if revision is not None else "constraints_updated")
    )
    refused = [r.line() for r in refusals]
    cards = planner_cards(
        chosen,
        idempotency_key=key,
        constraints_keys=[f for f in FIELD_NAMES if is_stated(constraints, f)],
        trigger=trigger,
        ts=_now(),
        prompt_pack=ctx.data.prompt_pack,
        policy_results=structural_results(constraints, chosen, catalog, ctx.policy),
        impacts=_impacts(chosen, catalog),
        refusals=refused,
        model=agent_out.model if agent_out else "",
    )
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
    effects: list[Effect] = [
        SetStatus({"plan_round": n}),
        _agent_run("planner", node_input, output, key, agent_out),
        Event(steps.EVENT_PLAN, output),
        Notify("plan.ready", {"plan_round": n}),
        *_card_events(cards),
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


async def _critic_agent(
    state: GraphState, agent: AgentKind, key: str, rules: TechReview, kind: str
) -> tuple[list[Risk], list[Refusal], bool, AgentOutput | None]:
    """A critic agent's findings beside the rules' (checked by ``guard_findings``)."""
    ctx = state["ctx"]
    if not _agents_on(ctx):
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
    out, refusals = await _ask_agent(ctx, agent, key, message, reply_schema(agent))
    risks, refused, revise = guard_findings(
        agent, state["plan"], ctx.data.catalog, out.reply if out else None, kind
    )
    return risks, [*refusals, *refused], revise, out


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
    card = critic_tech_card(
        review,
        idempotency_key=key,
        trigger="regen",
        ts=_now(),
        prompt_pack=ctx.data.prompt_pack,
        refusals=[r.line() for r in refusals],
        model=out.model if out else "",
    )
    effects: list[Effect] = [
        _agent_run("critic_tech", {"plan": key}, _critic_output(review, refusals, out), key, out),
        *_card_events([card]),
    ]
    asked = [r for r in added if revise and r.severity == "high"]
    return {
        "review": review,
        "agent_revise": asked,
        "cards": [*state["cards"], card],
        "effects": effects,
    }


async def critic_cost_node(state: GraphState) -> GraphState:
    ctx = state["ctx"]
    data = ctx.data
    chosen = state["plan"]
    previous = data.previous.cost if data.previous else None
    if workflow.patched(COST_FROM_WORKLOAD_PATCH):
        constraints = state["snapshot"].constraints
        key = ctx.key(
            "critic_cost", {"plan": chosen, "previous": previous, "workload": constraints}
        )
        cost = estimate_plan_cost(chosen, data.catalog, constraints, data.prices, previous)
    else:
        key = ctx.key("critic_cost", {"plan": chosen, "previous": previous})
        cost = estimate_cost(bill_of_materials(chosen, data.catalog), data.prices, previous)
    band = state["snapshot"].constraints.budget_band
    budget: PolicyStatus = "warn"
    if band is not None:
        budget = "fail" if cost.monthly_usd > BUDGET_BAND_CEILING_USD[band] else "pass"
    rules = TechReview(risks=[])
    if band is not None and budget == "fail":
        rules = TechReview(
            risks=[
                Risk(
                    id="cost:over_band",
                    kind="cost",
                    severity="high",
                    detail=f"${cost.monthly_usd:,.2f}/month is over the {band.value} band's "
                    f"${BUDGET_BAND_CEILING_USD[band]:,.0f}",
                )
            ]
        )
    state_for_agent: GraphState = {**state, "cost": cost}
    added, refusals, revise, out = await _critic_agent(
        state_for_agent, "critic_cost", key, rules, "cost"
    )
    card = critic_cost_card(
        cost,
        idempotency_key=key,
        trigger="regen",
        ts=_now(),
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
        _agent_run("critic_cost", {"plan": key}, summary, key, out),
        Event(steps.EVENT_COST, cost.model_dump(mode="json")),
        *_card_events([card]),
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
    card = critic_tech_card(
        review,
        idempotency_key=key,
        trigger="regen",
        ts=_now(),
        prompt_pack=ctx.data.prompt_pack,
        refusals=[r.line() for r in refusals],
        model=out.model if out else "",
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
        _agent_run("critic_security", {"plan": key}, output, key, out),
        *_card_events([card]),
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
        ts=_now(),
        prompt_pack=ctx.data.prompt_pack,
    )
    effects: list[Effect] = [
        Run("policy_eval", {"plan": key}, {"overall": report.overall}, key=key),
        Event(
            steps.EVENT_POLICY,
            {**report.model_dump(mode="json"), "gate_required": decision.required},
        ),
        *_card_events([card]),
    ]
    return {
        "policy": report,
        "gate_required": decision.required,
        "gate_reasons": list(decision.reasons),
        "cards": [*state["cards"], card],
        "effects": effects,
    }


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
    details: dict[str, Any] = {
        "decision_set": inp.decision_set,
        "round": n,
        "plan": {c.capability.value: c.pattern_id for c in state["plan"].choices},
        "monthly_usd": cost.monthly_usd,
        "delta_vs_prev_usd": cost.delta_vs_prev_usd,
        "policy": report.overall,
        "gate_reasons": state["gate_reasons"],
    }
    if state.get("rejection_comment"):
        details["replanned_for"] = state["rejection_comment"]
    revision = state.get("revision")
    if revision is not None:
        details["revised_for"] = revision.reasons
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


def _rationale_md(state: GraphState) -> str:
    return design_rationale_md(state["plan"], state["cards"], state["policy"], state["cost"])


async def codegen_node(state: GraphState) -> GraphState:
    ctx = state["ctx"]
    inp = ctx.inp
    node_input = {"plan": state["plan"], "constraints": state["snapshot"].constraints}
    key_input: dict[str, Any] = {**node_input, "cost": state["cost"], "policy": state["policy"]}
    if inp.codegen != "template":
        # A model's repository is another output than the templates' (and than another
        # model's), so it has its own key; the templates' key is what it always was.
        key_input["codegen"] = {"provider": inp.codegen, "model": inp.codegen_model}
    key = ctx.key("codegen", key_input)
    out = await call(
        steps.CODEGEN,
        CodegenInput(
            key=key,
            project=inp.project,
            decision_set=inp.decision_set,
            plan=state["plan"],
            constraints=state["snapshot"].constraints,
            rationale_md=_rationale_md(state),
            cost=state["cost"],
            policy=state["policy"],
            codegen=inp.codegen,
            codegen_model=inp.codegen_model,
        ),
        summary=f"codegen: {len(state['plan'].choices)} capabilities"
        + ("" if inp.codegen == "template" else f" by {inp.codegen}"),
    )
    card = codegen_card(
        provider=inp.codegen,
        model=inp.codegen_model,
        files_digest=out.files_digest,
        file_count=out.file_count,
        capabilities=[c.capability.value for c in state["plan"].choices],
        policy=state["policy"],
        cost=state["cost"],
        idempotency_key=key,
        ts=_now(),
        prompt_pack=ctx.data.prompt_pack,
    )
    effects: list[Effect] = [
        Run(
            "codegen",
            {"plan": key},
            {"files": out.file_count, "digest": out.files_digest},
            key=key,
            provider=inp.codegen,
            model=inp.codegen_model,
        ),
        Event(steps.EVENT_ARTIFACTS, {"files": out.file_count, "digest": out.files_digest}),
        *_card_events([card]),
    ]
    return {"codegen": out, "cards": [*state["cards"], card], "effects": effects}


#: The patch under which the validators check the tree that ships (the generated files,
#: rationale.json, diff.json and the SBOM) and a failed validator ends the run
#: ``validation_failed``. Runs started before it validate the generated files only.
PATCH_SHIPPED_TREE = "design-validate-shipped-tree"


async def validators_node(state: GraphState) -> GraphState:
    ctx = state["ctx"]
    files = state["codegen"].files_digest
    key = ctx.key("validators", {"files": files})
    ship = workflow.patched(PATCH_SHIPPED_TREE)
    extra: dict[str, str] = _shipped_reports(state)[0] if ship else {}
    out = await call(
        steps.VALIDATE,
        ValidateInput(key=key, files_digest=files, extra_files=extra, ship=ship),
        summary=f"validators on {state['codegen'].file_count} files"
        + (f" + {len(extra)} reports and the SBOM" if ship else ""),
    )
    payload: dict[str, Any] = {"summary": out.summary, "report": out.report_digest}
    if ship:
        payload |= {"failed": out.failed, "tree_digest": out.tree_digest}
    effects: list[Effect] = [
        Run("validators", {"files": files}, dict(out.summary), key=key),
        Event(steps.EVENT_VALIDATION, payload),
    ]
    return {"validation": out, "effects": effects}


def _shipped_reports(state: GraphState) -> tuple[dict[str, str], dict[str, Any] | None, str]:
    """The report files the workflow adds to the generated tree (rationale.json and, on an
    iteration, diff.json), the diff and the Change Summary's markdown. Pure: the
    validators node (which validates them in the tree) and persist compute the same."""
    previous = state["ctx"].data.previous
    new_state = _state_of(state)
    files = state["codegen"].file_digests if "codegen" in state else {}
    cost = state.get("cost")
    diff: dict[str, Any] | None = None
    summary_md = state.get("rationale_md", "")
    if "rationale" in state:
        rationale = state["rationale"]
    else:
        # Before rationale_compile (the validators node): what that node will compute.
        rationale = rationale_json(state.get("cards", []))
    if previous is not None:
        old_state = {
            "constraints": previous.constraints.model_dump(mode="json"),
            "plan": previous.plan or {},
        }
        delta = cost.delta_vs_prev_usd if cost else None
        sd = state_diff(old_state, new_state)
        summary = change_summary(old_state, new_state, previous.file_digests, files, delta)
        diff = {"summary": summary.model_dump(mode="json"), "state": sd.model_dump(mode="json")}
        summary_md = change_summary_md(summary, sd) + "\n\n" + summary_md
    report_files = {"reports/rationale.json": canonical_json(rationale).decode()}
    if diff is not None:
        report_files["reports/diff.json"] = canonical_json(diff).decode()
    return report_files, diff, summary_md


def _validation_md(validation: ValidateOutput) -> str:
    """The Change Summary's validation section of a run that validated the shipped tree."""
    failed = validation.failed
    lines = ["## Validation", ""]
    if failed:
        lines.append(
            "**Validation failed**: " + ", ".join(failed) + ". The archive is the tree "
            "that was validated; it stays downloadable, marked as failing."
        )
    else:
        lines.append("Every validator that ran passed.")
    lines.append(
        "Validators: " + ", ".join(f"{n} {s}" for n, s in validation.summary.items()) + "."
    )
    return "\n".join(lines)


async def rationale_compile_node(state: GraphState) -> GraphState:
    cards = state.get("cards", [])
    if "plan" not in state:
        run = Run("rationale_compile", {}, {"cards": 0})
        return {"rationale": rationale_json(cards), "rationale_md": "", "effects": [run]}
    md = _rationale_md(state)
    run = Run("rationale_compile", {"cards": len(cards)}, {"cards": len(cards)})
    return {"rationale": rationale_json(cards), "rationale_md": md, "effects": [run]}


def _outcome(state: GraphState) -> str:
    if not state["coverage"].covered:
        return "not_covered"
    status = state.get("gate_status")
    if status == "rejected":
        return "rejected"
    if status == "expired":
        return "expired"
    validation = state.get("validation")
    if validation is not None and validation.tree_digest is not None and validation.failed:
        # Only runs that validated the shipped tree (PATCH_SHIPPED_TREE) end here.
        return "validation_failed"
    return "completed"


async def diff_and_persist_node(state: GraphState, runtime: Runtime[DesignPorts]) -> GraphState:
    """The Change Summary against the previous decision set, then the SQL rows and the
    repository's archive (one idempotent activity)."""
    ctx = state["ctx"]
    inp, previous = ctx.inp, ctx.data.previous
    outcome = _outcome(state)
    new_state = _state_of(state)
    files = state["codegen"].file_digests if "codegen" in state else {}
    cost = state.get("cost")
    report_files, diff, summary_md = _shipped_reports(state)
    validation = state.get("validation")
    shipped = validation.tree_files_digest if validation is not None else None
    if validation is not None and shipped is not None:
        summary_md = _validation_md(validation) + "\n\n" + summary_md
    key = ctx.key("diff_and_persist", {"state": new_state, "files": files, "outcome": outcome})
    before: list[Effect] = []
    if diff is not None and previous is not None:
        before.append(
            Event(steps.EVENT_DIFF, {"previous": previous.decision_set, **diff["summary"]})
        )
    before.append(Run("diff_and_persist", {"outcome": outcome}, {"files": len(files)}, key=key))
    # Persist writes the run's journal, so this node's own notes go in first.
    runtime.context.emit(before)
    agent_runs, approvals, events = runtime.context.journal()
    out = await call(
        steps.PERSIST,
        PersistInput(
            key=key,
            project=inp.project,
            owner=inp.requester,
            decision_set=inp.decision_set,
            parent=inp.previous_decision_set,
            status=outcome,
            constraints=state["snapshot"].constraints,
            plan=new_state.get("plan"),
            summary_md=summary_md,
            cost=cost,
            files_digest=state["codegen"].files_digest if "codegen" in state else None,
            file_digests=files,
            report_files=report_files,
            validation_digest=(
                state["validation"].report_digest if "validation" in state else None
            ),
            tree_files_digest=shipped,
            agent_runs=agent_runs,
            approvals=approvals,
            events=events,
        ),
        summary=f"persist {inp.project}/{inp.decision_set}: {outcome}",
    )
    effects: list[Effect] = []
    if out.completed is not None:
        # The event persist wrote last, as written: the query and the events table agree.
        effects.append(Stored(out.completed))
    if diff is not None and out.git_commit is not None:
        # The commit exists only once persist ran; the Diff Summary names it (§22.2).
        diff["summary"]["git_commit"] = out.git_commit
    return {
        "outcome": outcome,
        "version": out.version,
        "archive_digest": out.archive_digest,
        "git_commit": out.git_commit,
        "diff": diff,
        "effects": effects,
    }


def _state_of(state: GraphState) -> dict[str, Any]:
    """The decision set's state as the diff compares it (JSON)."""
    out: dict[str, Any] = {"constraints": state["snapshot"].constraints.model_dump(mode="json")}
    if "plan" in state:
        out["plan"] = state["plan"].model_dump(mode="json", exclude={"candidates"})
    if "cost" in state:
        out["cost"] = {"monthly_usd": state["cost"].monthly_usd}
    if "policy" in state:
        out["policy"] = {"overall": state["policy"].overall}
    return out


def build_graph() -> StateGraph[GraphState, Any, GraphState, GraphState]:
    """The §21.1 graph, every node run in the workflow. A fresh graph per call: the
    plugin rewrites the nodes of the graph it is given."""
    g: StateGraph[GraphState, Any, GraphState, GraphState] = StateGraph(
        GraphState, context_schema=DesignPorts
    )
    # Two shapes: (state) and (state, runtime) for the nodes that use the ports.
    nodes: dict[str, Any] = {
        "intake_extract": intake_extract,
        "coverage_check": coverage_check_node,
        "adaptive_questions": adaptive_questions_node,
        "planner": planner_node,
        "critic_tech": critic_tech_node,
        "critic_cost": critic_cost_node,
        "critic_security": critic_security_node,
        "policy_eval": policy_eval_node,
        "gate_hitl": gate_hitl_node,
        "codegen": codegen_node,
        "validators": validators_node,
        "rationale_compile": rationale_compile_node,
        "diff_and_persist": diff_and_persist_node,
    }
    for name, fn in nodes.items():
        # The plugin shows a workflow node's summary as the run's current details.
        g.add_node(name, fn, metadata={"execute_in": "workflow", "summary": f"design: {name}"})
    g.add_edge(START, "intake_extract")
    g.add_edge("intake_extract", "coverage_check")
    g.add_conditional_edges(
        "coverage_check",
        after_coverage,
        ["planner", "adaptive_questions", "rationale_compile"],
    )
    g.add_edge("adaptive_questions", "coverage_check")
    g.add_edge("planner", "critic_tech")
    g.add_edge("critic_tech", "critic_cost")
    g.add_edge("critic_cost", "critic_security")
    # The critics may send the plan back to the planner once (the auto-revision).
    g.add_conditional_edges("critic_security", after_critics, ["planner", "policy_eval"])
    g.add_edge("policy_eval", "gate_hitl")
    g.add_conditional_edges("gate_hitl", after_gate, ["codegen", "planner", "rationale_compile"])
    g.add_edge("codegen", "validators")
    g.add_edge("validators", "rationale_compile")
    g.add_edge("rationale_compile", "diff_and_persist")
    g.add_edge("diff_and_persist", END)
    return g


@workflow.defn(name=steps.WORKFLOW_TYPE)
class DesignPipeline:
    """One decision set through the §21.1 graph. Update ``answers``, query ``status``."""

    @workflow.init
    def __init__(self, inp: DesignInput) -> None:
        self.inp = inp
        self.status = DesignStatus(phase="starting")
        self.agent_runs: list[AgentRun] = []
        self.approvals: list[ApprovalRecord] = []
        self.events: list[DesignEvent] = []
        self.rejection_comments: list[str] = []
        self._data: LoadOutput | None = None
        self._snapshot: IntakeSnapshot | None = None
        self._answered: IntakeSnapshot | None = None
        self._answer_ids: set[str] = set()
        # Webhook notices run beside the pipeline: a slow receiver never holds it up.
        self._notices: list[asyncio.Task[None]] = []

    @property
    def data(self) -> LoadOutput:
        assert self._data is not None, "design data is loaded before the graph runs"
        return self._data

    @workflow.run
    async def run(self, inp: DesignInput) -> DesignResult:
        try:
            result = await self._run(inp)
        except FailureError as err:
            # A failure ends the run: tell the webhook, then fail as before. Other
            # exceptions fail the workflow task, which retries: no notice for those.
            if inp.webhook_url:
                await self._deliver("run.error", message=str(err.cause or err) or str(err))
            await asyncio.gather(*self._notices)
            raise
        self.notify("run.complete", status=result.status, version=result.version)
        await asyncio.gather(*self._notices)
        return result

    async def _run(self, inp: DesignInput) -> DesignResult:
        self.status.phase = "loading"
        self._data = await call(
            steps.LOAD,
            LoadInput(
                project=inp.project,
                previous_decision_set=inp.previous_decision_set,
                model=inp.model,
            ),
            summary="load patterns, prices, prompts"
            + (f" and {inp.previous_decision_set}" if inp.previous_decision_set else ""),
        )
        if inp.previous_decision_set and self._data.previous is None:
            raise ApplicationError(
                f"previous decision set {inp.previous_decision_set!r} of project "
                f"{inp.project!r} is not in the store",
                type=steps.ERROR_DESIGN_INPUT,
                non_retryable=True,
            )
        self.status.phase = "running"
        ctx = DesignContext(
            thread_id=workflow.info().workflow_id,
            inp=inp,
            data=self._data,
            policy=_policy_in_force(inp, self._data),
        )
        app = registered_graph(GRAPH_NAME).compile()
        final: GraphState = {}
        # LangSmith tracing (switched on by LANGSMITH_TRACING in the worker's environment)
        # would run its tracer inside the workflow: subprocesses and HTTP from workflow
        # code. The history is the trace here, so it is off for the graph.
        with tracing_context(enabled=False):
            # Each node's update carries its effects (runs, events, status, notices): the
            # workflow applies them as the node finishes, so the query and the stream
            # show them live; the last values are the final state.
            async for mode, chunk in app.astream(
                {"ctx": ctx, "question_round": 0, "plan_round": 0, "cards": []},
                config={"recursion_limit": RECURSION_LIMIT},
                context=DesignPorts(emit=self.emit, ask=self.ask, journal=self.journal),
                stream_mode=["updates", "values"],
            ):
                if mode == "updates":
                    for update in cast(dict[str, Any], chunk).values():
                        if isinstance(update, dict):
                            self.emit(update.get("effects") or [])
                else:
                    final = cast(GraphState, chunk)
        self.status.phase = "done"
        await workflow.wait_condition(workflow.all_handlers_finished)
        return self._result(final)

    def _result(self, final: GraphState) -> DesignResult:
        cost = final.get("cost")
        validation = final.get("validation")
        codegen = final.get("codegen")
        return DesignResult(
            project=self.inp.project,
            decision_set=self.inp.decision_set,
            status=final["outcome"],  # type: ignore[typeddict-item]
            version=final.get("version", 0),
            constraints=final["snapshot"].constraints,
            coverage=final["coverage"],
            plan=final.get("plan"),
            cost=cost,
            policy=final.get("policy"),
            gate_required=final.get("gate_required", False),
            gate_reasons=final.get("gate_reasons", []),
            plan_rounds=final.get("plan_round", 0),
            rejection_comments=list(self.rejection_comments),
            files_digest=codegen.files_digest if codegen else None,
            file_count=codegen.file_count if codegen else 0,
            validation_digest=validation.report_digest if validation else None,
            validation=dict(validation.summary) if validation else {},
            validated_tree_digest=validation.tree_digest if validation else None,
            rationale_digest=digest_json(final.get("rationale", {})),
            archive_digest=final.get("archive_digest"),
            git_commit=final.get("git_commit"),
            diff=final.get("diff"),
            cost_delta_usd=cost.delta_vs_prev_usd if cost else None,
            cost_delta_pct=cost.delta_vs_prev_pct if cost else None,
            nodes_run=list(self.status.nodes_run),
        )

    # --- the ports the nodes are given (DesignPorts), and helpers -------------------

    def emit(self, effects: list[Effect]) -> None:
        """Apply a node's effects in order. By the effect's type name: the graph's nodes
        are the worker's module (the plugin holds the graph built at worker start) while
        this class is the sandbox's copy, so ``isinstance`` across the two would fail."""
        for e in effects:
            kind = type(e).__name__
            if kind == "Run":
                run = cast(Run, e)
                self.run_node(
                    run.node,
                    run.node_input,
                    run.output,
                    key=run.key,
                    provider=run.provider,
                    model=run.model,
                    tokens=run.tokens,
                    latency_ms=run.latency_ms,
                )
            elif kind == "Event":
                event = cast(Event, e)
                self.event(event.kind, event.payload)
            elif kind == "Notify":
                notice = cast(Notify, e)
                self.notify(notice.event, **notice.fields)
            elif kind == "SetStatus":
                for name, value in cast(SetStatus, e).fields.items():
                    setattr(self.status, name, value)
            elif kind == "Approval":
                approval = cast(Approval, e)
                self.approvals.append(approval.record)
                if approval.rejection_comment is not None:
                    self.rejection_comments.append(approval.rejection_comment)
            elif kind == "Stored":
                self.events.append(cast(Stored, e).event)
            else:
                raise TypeError(f"unknown effect {kind}")

    def journal(self) -> tuple[list[AgentRun], list[ApprovalRecord], list[DesignEvent]]:
        """The run's ``agent_runs``, approvals and events so far (persist writes them)."""
        return self.agent_runs, self.approvals, self.events

    def key(self, node: str, node_input: Any) -> str:
        """The node's idempotency key (§21.3): thread = this workflow's id."""
        return node_idempotency_key(workflow.info().workflow_id, node, _dump_deep(node_input))

    def now(self) -> str:
        return workflow.now().isoformat()

    def run_node(
        self,
        node: str,
        node_input: Any,
        output: dict[str, Any],
        *,
        key: str | None = None,
        provider: str = "workflow",
        model: str = "",
        tokens: int = 0,
        latency_ms: int = 0,
    ) -> None:
        """Note a node's run: the query's progress and an ``agent_runs`` row."""
        self.status.node = node
        self.status.nodes_run.append(node)
        run_key = key or self.key(node, node_input)
        # A node that runs again (a new round) with the same input keeps one key; the
        # round count makes each run's row its own.
        seq = sum(1 for r in self.agent_runs if r.agent == node)
        self.agent_runs.append(
            AgentRun(
                key=run_key if seq == 0 else f"{run_key}#{seq}",
                agent=node,
                provider=provider,
                model=model,
                input_digest=digest_json(_dump_deep(node_input)),
                output=output,
                tokens_total=tokens,
                latency_ms=latency_ms,
            )
        )

    def event(self, kind: str, payload: dict[str, Any]) -> None:
        """Note an event: the ``events`` query shows it at once, persist writes it."""
        envelope = {
            "project_id": self.inp.project,
            "decision_set_id": self.inp.decision_set,
            "node_name": self.status.node,
            "ts": self.now(),
        }
        self.events.append(
            DesignEvent(
                key=steps.event_key(len(self.events), kind),
                type=kind,
                payload={**envelope, **payload},
            )
        )

    def notify(self, event: str, **fields: Any) -> None:
        """Send webhook notice ``event`` beside the pipeline, if the input names a URL."""
        if self.inp.webhook_url:
            self._notices.append(asyncio.create_task(self._deliver(event, **fields)))

    async def _deliver(self, event: str, **fields: Any) -> None:
        info = workflow.info()
        notice = DesignNotice(
            event=event,  # type: ignore[arg-type]
            project_id=self.inp.project,
            decision_set_id=self.inp.decision_set,
            workflow_id=info.workflow_id,
            node_name=self.status.node,
            at=workflow.now(),
            **fields,
        )
        # One key per event and round: a retried delivery is the same notice to receivers.
        round_ = fields.get("plan_round")
        suffix = f":{round_}" if round_ is not None else ""
        try:
            await call(
                NOTIFY_WEBHOOK,
                WebhookDelivery(
                    url=self.inp.webhook_url or "",
                    notice=notice,
                    idempotency_key=f"{info.run_id}:{event}{suffix}",
                ),
                summary=f"notify {event}",
            )
        except ActivityError as err:
            # A notice that cannot be delivered must not fail the design.
            workflow.logger.warning("design notice %s not delivered: %s", event, err.cause)

    async def ask(
        self, questions: list[Question], snapshot: IntakeSnapshot, n: int
    ) -> IntakeSnapshot:
        """Open the questions and wait for Update ``answers``; the answered snapshot."""
        self._snapshot, self._answered = snapshot, None
        self.status.questions = questions
        self.status.question_round = n
        self.status.phase = "waiting_for_answers"
        self.event(steps.EVENT_QUESTIONS, {"round": n, "fields": [q.field for q in questions]})
        await workflow.wait_condition(lambda: self._answered is not None)
        answered = self._answered
        assert answered is not None
        self.status.questions = []
        self.status.phase = "running"
        self._snapshot = None
        return answered

    # --- messages -------------------------------------------------------------------

    @workflow.update
    async def answers(self, answers: DesignAnswers) -> DesignStatus:
        """Answers to the open questions (any Constraint Schema field may be given)."""
        if answers.request_id and answers.request_id in self._answer_ids:
            return self.status
        if answers.request_id:
            self._answer_ids.add(answers.request_id)
        assert self._snapshot is not None
        self._answered = apply_answers(self._snapshot, answers.answers)
        self.event(steps.EVENT_ANSWERS, {"fields": sorted(answers.answers), "by": answers.actor})
        return self.status

    @answers.validator
    def _validate_answers(self, answers: DesignAnswers) -> None:
        if answers.request_id and answers.request_id in self._answer_ids:
            return
        if self._snapshot is None or self._answered is not None:
            raise ApplicationError(
                f"no questions are open (phase {self.status.phase})", type="NoOpenQuestions"
            )
        try:
            apply_answers(self._snapshot, answers.answers)
        except ConstraintError as exc:
            raise ApplicationError(
                f"answers refused: {exc}",
                [i.model_dump() for i in exc.issues],
                type=steps.ERROR_DESIGN_INPUT,
            ) from None

    @workflow.query(name="status")
    def get_status(self) -> DesignStatus:
        return self.status

    @workflow.query(name="events")
    def get_events(self, since: EventsSince) -> list[DesignEvent]:
        """The events after place ``since.after``, for live streams (SSE, the CLI)."""
        return self.events[since.after + 1 :]


def _policy_in_force(inp: DesignInput, data: LoadOutput) -> PolicySettings:
    """The input's policy if its starter set one (a trusted client, tests, runs recorded
    before the policy file), else the organisation's file as design.load read it."""
    if inp.policy is not None:
        return inp.policy
    return data.policy or PolicySettings()


def _dump_deep(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _dump_deep(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_dump_deep(v) for v in value]
    return value
