"""``DesignPipeline``: the workflow class, its Update ``answers`` and its queries."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from temporalio import workflow
from temporalio.exceptions import ApplicationError, FailureError

with workflow.unsafe.imports_passed_through():
    from langsmith.run_helpers import tracing_context
    from temporalio.langgraph import graph as registered_graph

    from keel.design import steps
    from keel.design.coverage import IntakeSnapshot, Question, apply_answers
    from keel.design.errors import ConstraintError
    from keel.design.policy import PolicySettings
    from keel.design.steps import (
        DesignAnswers,
        DesignEvent,
        DesignInput,
        DesignResult,
        DesignStatus,
        EventsSince,
        LoadInput,
        LoadOutput,
    )
    from keel.digest import digest_json
    from workflows.common import call

from workflows.design.graph import GRAPH_NAME
from workflows.design.read_model import ReadModel
from workflows.design.state import DesignContext, DesignPorts, GraphState

#: LangGraph counts supersteps; questions and planner rounds loop, so this bounds
#: the most the input allows, (20 question rounds x 2) + (10 planner rounds x 6) + 12 = 112.
RECURSION_LIMIT = 200


@workflow.defn(name=steps.WORKFLOW_TYPE)
class DesignPipeline(ReadModel):
    """One decision set through the §21.1 graph. Update ``answers``, query ``status``.
    What the run shows and persists (status, events, rows, notices) is its
    :class:`ReadModel`."""

    @workflow.init
    def __init__(self, inp: DesignInput) -> None:
        super().__init__(inp)
        self._data: LoadOutput | None = None
        self._snapshot: IntakeSnapshot | None = None
        self._answered: IntakeSnapshot | None = None
        self._answer_ids: set[str] = set()

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
        self._memo.start()  # the patch is asked before the run's first command
        self.status.phase = "loading"
        self.show_progress()
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
        self.show_progress()
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
        self.show_progress()
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
            repairs=list(final.get("repairs", [])),
            findings=list(final.get("findings", [])),
        )

    async def ask(
        self, questions: list[Question], snapshot: IntakeSnapshot, n: int
    ) -> IntakeSnapshot:
        """Open the questions and wait for Update ``answers``; the answered snapshot."""
        self._snapshot, self._answered = snapshot, None
        self.status.questions = questions
        self.status.question_round = n
        self.status.phase = "waiting_for_answers"
        self.show_progress()
        self.event(steps.EVENT_QUESTIONS, {"round": n, "fields": [q.field for q in questions]})
        await workflow.wait_condition(lambda: self._answered is not None)
        answered = self._answered
        assert answered is not None
        self.status.questions = []
        self.status.phase = "running"
        self.show_progress()
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
