"""What the run ships: codegen, the validators on the shipped tree, the rationale, and
the Change Summary with the persisted rows and archive."""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from langgraph.runtime import Runtime

    from keel.design import steps
    from keel.design.diff import change_summary, change_summary_md, state_diff
    from keel.design.reasons import codegen_card, design_rationale_md, rationale_json
    from keel.design.steps import (
        CodegenInput,
        Finding,
        PersistInput,
        RepairRound,
        ValidateInput,
        ValidateOutput,
    )
    from keel.digest import canonical_json
    from workflows.common import call

from workflows.design.repair import PATCH_REPAIR_ROUNDS, last_findings, repair_rounds
from workflows.design.state import (
    DesignPorts,
    Effect,
    Event,
    GraphState,
    Run,
    Stored,
    card_events,
    now_iso,
)


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
        ts=now_iso(),
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
        *card_events([card]),
    ]
    return {"codegen": out, "cards": [*state["cards"], card], "effects": effects}


#: The patch under which the validators check the tree that ships (the generated files,
#: rationale.json, diff.json and the SBOM) and a failed validator ends the run
#: ``validation_failed``. Runs started before it validate the generated files only.
PATCH_SHIPPED_TREE = "design-validate-shipped-tree"


async def validators_node(state: GraphState, runtime: Runtime[DesignPorts]) -> GraphState:
    ctx = state["ctx"]
    files = state["codegen"].files_digest
    key = ctx.validators_key(files)
    ship = workflow.patched(PATCH_SHIPPED_TREE)
    extra: dict[str, str] = _shipped_reports(state)[0] if ship else {}
    out = await call(
        steps.VALIDATE,
        ValidateInput(
            key=key, files_digest=files, extra_files=extra, ship=ship, only=ctx.inp.validators
        ),
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
    if ship and out.failed and workflow.patched(PATCH_REPAIR_ROUNDS):
        # The findings go back to the files' maker, round by round (workflows/design/
        # repair.py); each round's effects are applied as it ends, so these go first.
        runtime.context.emit(effects)
        codegen, out, rounds = await repair_rounds(
            ctx,
            state["codegen"],
            out,
            lambda c: _shipped_reports({**state, "codegen": c})[0],
            runtime.context.emit,
        )
        findings: list[Finding] = []
        if out.failed:
            findings = await last_findings(ctx, codegen, out, runtime.context.emit)
        return {
            "validation": out,
            "codegen": codegen,
            "repairs": rounds,
            "findings": findings,
            "effects": [],
        }
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


def _validation_md(
    validation: ValidateOutput, repairs: list[RepairRound], findings: list[Finding]
) -> str:
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
    for r in repairs:
        fixed = sum(o.fixed_by != "not_fixed" for o in r.outcomes)
        lines.append(
            f"Repair round {r.round} (after {', '.join(r.failed)} failed): "
            f"{len(r.files_changed)} file(s) changed"
            + (f" ({', '.join(r.files_changed)})" if r.files_changed else "")
            + f", {fixed} of {len(r.outcomes)} finding(s) addressed; then "
            + (", ".join(n for n, s in r.validation.items() if s == "failed") or "none")
            + " failed."
        )
    if findings:
        lines += ["", f"Findings ({len(findings)}):"]
        for f in findings:
            where = f"{f.file}:{f.line}" if f.file and f.line else f.file or "-"
            lines.append(f"- {f.validator} {where}: {f.message[:200]}")
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
    report_files, diff, summary_md = _shipped_reports(state)
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
            summary_md=_with_validation_md(state, summary_md),
            cost=state.get("cost"),
            files_digest=state["codegen"].files_digest if "codegen" in state else None,
            file_digests=files,
            report_files=report_files,
            validation_digest=(
                state["validation"].report_digest if "validation" in state else None
            ),
            tree_files_digest=_shipped_digest(state),
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


def _shipped_digest(state: GraphState) -> str | None:
    """The digest of the tree the validators shipped, None where none was validated."""
    validation = state.get("validation")
    return validation.tree_files_digest if validation is not None else None


def _with_validation_md(state: GraphState, summary_md: str) -> str:
    """The summary, after the validation's section where the shipped tree was validated."""
    validation = state.get("validation")
    if validation is None or validation.tree_files_digest is None:
        return summary_md
    return (
        _validation_md(validation, state.get("repairs", []), state.get("findings", []))
        + "\n\n"
        + summary_md
    )


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
