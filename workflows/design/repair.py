"""Repair rounds (issue 38 §5): after the validators fail, ``design.repair`` then the
validators again, up to ``DesignInput.repair_rounds`` times. Each round is a step in
history (the repair activity and the validators after it), a ``repair`` event and an
entry of the status' ``repairs``; when the rounds run out the run ends
``validation_failed`` as before, with every finding of the last validation
(:func:`last_findings`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from keel.design import steps
    from keel.design.steps import (
        CodegenOutput,
        Finding,
        RepairInput,
        RepairOutput,
        RepairRound,
        ValidateInput,
        ValidateOutput,
    )
    from workflows.common import call

from workflows.design.state import DesignContext, Effect, Event, Run, SetStatus

#: The patch under which a failed validation is repaired (runs before it end at once).
PATCH_REPAIR_ROUNDS = "design-repair-rounds"


def repair_model(ctx: DesignContext) -> tuple[bool, str]:
    """Whether the model may repair, and which: the codegen model when a model wrote the
    repository through the gateway (``codegen="litellm"``), else the decision set's model
    when the models config marks it capable (``LoadOutput.agent_model``). Otherwise the
    rules fix alone."""
    if ctx.inp.codegen == "litellm":
        return True, ctx.inp.codegen_model
    if ctx.data.agent_model:
        return True, ctx.data.agent_model
    return False, ""


def validation_payload(out: ValidateOutput) -> dict[str, Any]:
    """The ``validation`` event's payload of a run that validates the shipped tree."""
    return {
        "summary": out.summary,
        "report": out.report_digest,
        "failed": out.failed,
        "tree_digest": out.tree_digest,
    }


async def repair_rounds(
    ctx: DesignContext,
    codegen: CodegenOutput,
    validation: ValidateOutput,
    extra_of: Callable[[CodegenOutput], dict[str, str]],
    emit: Callable[[list[Effect]], None],
) -> tuple[CodegenOutput, ValidateOutput, list[RepairRound]]:
    """Up to ``ctx.inp.repair_rounds`` rounds while a validator fails; the repaired
    files, the last validation and the rounds. A round that changes nothing ends the
    rounds (the same tree would fail the same way). ``extra_of`` gives the report files
    the shipped tree adds to a files map; ``emit`` applies each round's effects now."""
    use_model, model = repair_model(ctx)
    rounds: list[RepairRound] = []
    for n in range(1, ctx.inp.repair_rounds + 1):
        if not validation.failed:
            break
        failed = validation.failed
        rep, effects = await _repair(ctx, n, codegen, validation, use_model, model)
        if rep.files_changed:
            codegen = CodegenOutput(
                files_digest=rep.files_digest,
                file_count=rep.file_count,
                file_digests=rep.file_digests,
            )
            validation, run = await _revalidate(ctx, n, codegen, extra_of)
            effects.append(run)
        done = RepairRound(
            round=n,
            failed=failed,
            files_changed=rep.files_changed,
            outcomes=rep.outcomes,
            files_digest=codegen.files_digest,
            validation=dict(validation.summary),
        )
        rounds.append(done)
        effects.append(Event(steps.EVENT_REPAIR, done.model_dump(mode="json")))
        if rep.files_changed:
            effects.append(Event(steps.EVENT_VALIDATION, validation_payload(validation)))
        effects.append(SetStatus({"repairs": list(rounds)}))
        emit(effects)
        if not rep.files_changed:
            break
    return codegen, validation, rounds


async def _repair(
    ctx: DesignContext,
    n: int,
    codegen: CodegenOutput,
    validation: ValidateOutput,
    use_model: bool,
    model: str,
) -> tuple[RepairOutput, list[Effect]]:
    """Round ``n``'s ``design.repair`` and the record of its run."""
    key = ctx.key(
        "repair",
        {"files": codegen.files_digest, "report": validation.report_digest, "round": n},
    )
    rep = await call(
        steps.REPAIR,
        _repair_input(ctx, key, codegen, validation, round=n, model=model, use_model=use_model),
        summary=f"repair round {n}: {', '.join(validation.failed)}"
        + (" (rules and the model)" if use_model else " (rules)"),
    )
    run = Run(
        "repair",
        {"files": codegen.files_digest, "report": validation.report_digest},
        {"round": n, "changed": rep.files_changed, "digest": rep.files_digest},
        key=key,
        provider="litellm" if use_model else "workflow",
        model=rep.model,
        tokens=rep.tokens_total,
    )
    return rep, [run]


async def _revalidate(
    ctx: DesignContext,
    n: int,
    codegen: CodegenOutput,
    extra_of: Callable[[CodegenOutput], dict[str, str]],
) -> tuple[ValidateOutput, Run]:
    """The validators on round ``n``'s repaired files, and the record of their run."""
    extra = extra_of(codegen)
    vkey = ctx.validators_key(codegen.files_digest)
    validation = await call(
        steps.VALIDATE,
        ValidateInput(
            key=vkey,
            files_digest=codegen.files_digest,
            extra_files=extra,
            ship=True,
            only=ctx.inp.validators,
        ),
        summary=f"validators after repair round {n} on {codegen.file_count} files",
    )
    run = Run("validators", {"files": codegen.files_digest}, dict(validation.summary), key=vkey)
    return validation, run


def _repair_input(
    ctx: DesignContext,
    key: str,
    codegen: CodegenOutput,
    validation: ValidateOutput,
    *,
    round: int,
    model: str = "",
    use_model: bool = False,
    fix: bool = True,
) -> RepairInput:
    """``design.repair``'s input for this run's repository and validation report (a
    round's fix, or ``fix=False`` to read the findings)."""
    return RepairInput(
        key=key,
        project=ctx.inp.project,
        decision_set=ctx.inp.decision_set,
        files_digest=codegen.files_digest,
        report_digest=validation.report_digest,
        round=round,
        model=model,
        use_model=use_model,
        fix=fix,
    )


async def last_findings(
    ctx: DesignContext,
    codegen: CodegenOutput,
    validation: ValidateOutput,
    emit: Callable[[list[Effect]], None],
) -> list[Finding]:
    """Every finding of a validation that still fails (``design.repair`` reading them,
    changing nothing), as a ``validation-findings`` event."""
    key = ctx.key("findings", {"report": validation.report_digest})
    rep = await call(
        steps.REPAIR,
        _repair_input(ctx, key, codegen, validation, round=0, fix=False),
        summary=f"findings of {', '.join(validation.failed)}",
    )
    emit(
        [
            Event(
                steps.EVENT_FINDINGS,
                {
                    "failed": validation.failed,
                    "findings": [f.model_dump(mode="json") for f in rep.findings],
                },
            )
        ]
    )
    return rep.findings
