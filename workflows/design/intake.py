"""The intake loop: free text or the guided form to the Constraint Schema, the coverage
check, and the questions that wait for Update ``answers`` until the intake is covered."""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from langgraph.runtime import Runtime

    from keel.design import steps
    from keel.design.constraints import FIELD_NAMES, is_stated
    from keel.design.coverage import (
        IntakeSnapshot,
        adaptive_questions,
        apply_answers,
        coverage_check,
    )
    from keel.design.errors import ConstraintError
    from keel.design.policy import with_account_baseline
    from keel.design.steps import IntakeInput
    from keel.digest import digest_json
    from workflows.common import call

from workflows.design.state import DesignPorts, Effect, Event, GraphState, Run, SetStatus, dump

INTAKE_PROMPT = "intake_extract"
#: Patch: an intake reply that does not fit goes to questions (``IntakeSnapshot.unfit``).
PATCH_INTAKE_UNFIT = "design-intake-unfit"
#: Patch: the organisation's ``policy.yaml`` ``account_baseline: true`` turns the flag on in
#: the constraints, so the cost, the policy check and codegen all see the same baseline.
#: Asked only when it changes something (no recorded run had the setting).
PATCH_ACCOUNT_BASELINE = "design-account-baseline-policy"


async def intake_extract(state: GraphState) -> GraphState:
    """Free text to the Constraint Schema (an activity), or the guided form as given;
    on an iteration both are merged over the previous decision set's constraints; the
    organisation's account-baseline setting over both."""
    update = await _intake(state)
    snapshot = update["snapshot"]
    constraints = with_account_baseline(snapshot.constraints, state["ctx"].policy)
    if constraints is not snapshot.constraints and workflow.patched(PATCH_ACCOUNT_BASELINE):
        update["snapshot"] = snapshot.model_copy(update={"constraints": constraints})
    return update


async def _intake(state: GraphState) -> GraphState:
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
    stated = {f: dump(getattr(extracted, f)) for f in FIELD_NAMES if is_stated(extracted, f)}
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
    run = Run.of_model(
        "intake_extract", {"text_digest": digest_json(inp.requirements)}, output, key, out
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
