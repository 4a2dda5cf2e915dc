"""``RllmApp``: one ``.rllm`` app run as a durable workflow.

The steps, as the event history shows them (docs/rllm-runtime.md):

1. ``rllm.load``: read, parse, resolve ``uses``, check models and ``llm_params``;
2. (``rllm.ollama_ensure`` when the model is an Ollama one or auto-pull is on);
3. input decoded and validated against ``input_schema`` (in the workflow: pure);
4. ``rllm.block`` once per ``pre`` block (nsjail sandbox);
5. one child ``RllmApp`` per ``uses`` entry, those that do not wait for a sibling in
   parallel; their outputs cut to ``exposes``;
6. prompt rendered and the context window enforced (pure), then ``rllm.generate``
   (model call + parse + schema check); on a mismatch the recovery prompt, with the
   exact errors and the bad answer, is rendered and ``rllm.generate`` runs again, up
   to ``max_retries`` times: each attempt is its own activity in the history;
7. ``output_map`` merged, ``rllm.block`` per ``post`` block, final schema check;
8. ``rllm.record_stats`` (successes and failures).

Failures end the workflow with ``ApplicationError(message, payload, type=<error class>,
non_retryable=True)``; ``payload`` is ``RllmErrorPayload`` as JSON.
"""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from keel.access import READERS_SIGNAL
    from keel.llm import LLMUsage
    from keel.progress import RunProgress
    from keel.rllm.contracts import (
        apply_block_outputs,
        block_inputs,
        child_input,
        merge_output,
        render_prompt,
        template_variables,
        validate_input,
    )
    from keel.rllm.deps import DependencyEdge
    from keel.rllm.errors import (
        ContextWindowExceededError,
        InputSchemaError,
        OutputSchemaError,
        RetryExhaustedError,
        RllmError,
    )
    from keel.rllm.estimate import check_context_window
    from keel.rllm.model import PythonBlock, RllmProgram
    from keel.rllm.ollama import OLLAMA_ENSURE, OllamaEnsureInput, needs_ollama_step
    from keel.rllm.output import OutputCheck, retry_exhausted, validate_output
    from keel.rllm.render import render_recovery
    from keel.rllm.run import (
        BLOCK,
        DEFAULT_MAX_RETRIES,
        GENERATE,
        LOAD,
        RECORD_STATS,
        WORKFLOW_TYPE,
        BlockRequest,
        GenerateRequest,
        LoadedApp,
        LoadRequest,
        RllmAttempt,
        RllmRunInput,
        RllmRunResult,
        add_usage,
        decode_input,
        error_type_and_payload,
    )
    from keel.rllm.stats import RllmRunRecord
    from workflows.common import call, failure_cause
    from workflows.readers import ProgressMemo, upsert_readers


LOCAL_STEPS_PATCH = "rllm-local-load-and-stats"


def _app_error(err: RllmError) -> ApplicationError:
    kind, payload = error_type_and_payload(err)
    return ApplicationError(err.message, payload, type=kind, non_retryable=True)


def _from_failure(
    err: ActivityError | ChildWorkflowError, child: str | None = None
) -> ApplicationError:
    """The workflow's own failure for a failed activity or child: the same type and payload.

    A child's payload gets ``details.child`` (the alias path, ``a/b`` for a grandchild)
    so the reader knows which app failed.
    """
    cause = failure_cause(err)
    if cause is not None:
        details = list(cause.details)
        if child is not None and details and isinstance(details[0], dict):
            payload = dict(details[0])
            inner = dict(payload.get("details") or {})
            inner["child"] = f"{child}/{inner['child']}" if inner.get("child") else child
            payload["details"] = inner
            details[0] = payload
        return ApplicationError(
            cause.message, *details, type=cause.type or "ApplicationError", non_retryable=True
        )
    other = err.cause
    what = type(other).__name__ if other is not None else type(err).__name__
    return ApplicationError(
        f"{err.message}: {other}" if other is not None else str(err),
        {"cause": what},
        type=what,
        non_retryable=True,
    )


def _ms(start: datetime, end: datetime) -> float:
    return round((end - start).total_seconds() * 1000.0, 3)


class _Run:
    """What a run has done so far: the facts its stats record is made of."""

    def __init__(self) -> None:
        self.app = ""
        self.version = ""
        self.model = ""
        self.input_valid: bool | None = None
        self.output_valid: bool | None = None
        self.attempts: list[RllmAttempt] = []
        self.children: dict[str, RllmRunResult] = {}
        self.children_ms = 0.0

    @property
    def own_usage(self) -> LLMUsage:
        return add_usage(*(a.usage for a in self.attempts))

    @property
    def usage(self) -> LLMUsage:
        return add_usage(self.own_usage, *(c.usage for c in self.children.values()))

    @property
    def own_llm_ms(self) -> float:
        return round(sum(a.latency_ms for a in self.attempts), 3)

    @property
    def llm_ms(self) -> float:
        return round(self.own_llm_ms + sum(c.llm_latency_ms for c in self.children.values()), 3)


@workflow.defn(name=WORKFLOW_TYPE)
class RllmApp:
    """Runs one ``.rllm`` app (and, as child workflows, the apps it uses)."""

    def __init__(self) -> None:
        self._run = _Run()
        self._step = "start"
        self._local_steps = False
        # The step a remote activity or child waits in, in the run's progress memo.
        self._memo = ProgressMemo()

    @workflow.signal(name=READERS_SIGNAL)
    def refresh_readers(self) -> None:
        """Set ``KeelReaders`` from the access memo (``keel migrate-search-attributes``)."""
        upsert_readers()

    @workflow.query(name="step")
    def step(self) -> str:
        """The step the run is at (``load``, ``pre:<block>``, ``attempt:2``...)."""
        return self._step

    @workflow.run
    async def run(self, inp: RllmRunInput) -> RllmRunResult:
        started = workflow.now()
        # Loading and the stats record only read files or write one row: as local
        # activities they run inside the workflow task that needs them, which saves two
        # workflow tasks (about half of a run's overhead, docs/rllm-runtime.md). Runs
        # recorded before this change replay their remote activities.
        self._local_steps = workflow.patched(LOCAL_STEPS_PATCH)
        self._memo.start()
        failure: ApplicationError | None = None
        result: RllmRunResult | None = None
        try:
            result = await self._execute(inp, started)
        except RllmError as e:
            failure = _app_error(e)
        except ApplicationError as e:
            failure = e
        except (ActivityError, ChildWorkflowError) as e:
            failure = _from_failure(e)
        await self._record(inp, started, failure)
        if failure is not None:
            raise failure
        assert result is not None
        return result

    def _wait_in(self, step: str) -> None:
        """Enter ``step``, one that waits on a worker's activity or a child run: shown by
        the ``step`` query and, as ``step <step>``, in the progress memo."""
        self._step = step
        self._memo.show(RunProgress(phase=f"step {step}"))

    # -- the run --------------------------------------------------------------------
    async def _execute(self, inp: RllmRunInput, started: datetime) -> RllmRunResult:
        loaded = await self._load(inp)
        program = loaded.resolved.root
        inputs = self._inputs(program, inp)

        pre_outputs: dict[str, Any] = {}
        for block in program.pre_blocks:
            produced = await self._block(program, block, {**inputs, **pre_outputs})
            pre_outputs = apply_block_outputs(block, pre_outputs, produced)

        child_outputs = await self._children(inp, loaded, program, inputs, pre_outputs)
        variables = template_variables(
            program, inputs, pre_outputs=pre_outputs, child_outputs=child_outputs
        )

        llm_output = (
            await self._generate(inp, loaded, program, variables) if program.needs_llm else None
        )
        output = await self._output(program, llm_output, child_outputs, {**inputs, **pre_outputs})
        state = self._run
        return RllmRunResult(
            app=program.name,
            version=program.version,
            model=loaded.model,
            output=output,
            attempts=list(state.attempts),
            retries=max(0, len(state.attempts) - 1),
            children=dict(state.children),
            usage=state.usage,
            llm_latency_ms=state.llm_ms,
            total_latency_ms=_ms(started, workflow.now()),
        )

    async def _load(self, inp: RllmRunInput) -> LoadedApp:
        """``rllm.load``, then ``rllm.ollama_ensure`` where the app's model needs it."""
        state = self._run
        self._step = "load"
        # A step that only reads files or writes one row runs as a local activity when
        # the run began after the patch (older histories replay with regular ones).
        loaded = await call(
            LOAD,
            LoadRequest(path=inp.path, files=inp.files, model=inp.model),
            summary=f"load {inp.path}",
            local=self._local_steps,
        )
        program = loaded.resolved.root
        state.app, state.version, state.model = program.name, program.version, loaded.model

        if needs_ollama_step(
            llm_model=loaded.litellm_model if program.needs_llm else None,
            override=None,
            auto_pull=inp.ollama_auto_pull,
        ):
            self._wait_in("ollama")
            await call(
                OLLAMA_ENSURE,
                OllamaEnsureInput(
                    app=program.name,
                    model=loaded.model,
                    recommended=program.ollama_models(),
                    auto_pull=inp.ollama_auto_pull,
                ),
                summary=f"ollama models of {program.name}",
            )
        return loaded

    def _inputs(self, program: RllmProgram, inp: RllmRunInput) -> dict[str, Any]:
        """The run's input, decoded and checked against ``input_schema``."""
        self._step = "input"
        try:
            inputs = validate_input(program, decode_input(program, inp.input))
        except InputSchemaError:
            self._run.input_valid = False
            raise
        self._run.input_valid = True
        return inputs

    async def _output(
        self,
        program: RllmProgram,
        llm_output: dict[str, Any] | None,
        child_outputs: dict[str, dict[str, Any]],
        scope: dict[str, Any],
    ) -> dict[str, Any]:
        """The output: the model's and the children's merged, the ``post`` blocks run on
        it (``scope``: the inputs and ``pre`` outputs beside it), checked at the end."""
        self._step = "output"
        try:
            output = merge_output(program, llm_output, child_outputs)
        except OutputSchemaError:
            self._run.output_valid = False
            raise
        for block in program.post_blocks:
            produced = await self._block(program, block, {**scope, **output})
            output = apply_block_outputs(block, output, produced)
        try:
            output = validate_output(output, program.output_schema)
        except OutputSchemaError:
            self._run.output_valid = False
            raise
        self._run.output_valid = True
        return output

    async def _block(
        self, program: RllmProgram, block: PythonBlock, scope: dict[str, Any]
    ) -> dict[str, Any]:
        self._wait_in(f"{block.stage}:{block.name}")
        res = await call(
            BLOCK,
            BlockRequest(app=program.name, block=block, inputs=block_inputs(block, scope)),
            summary=f"{block.stage} block {block.name}",
        )
        return res.outputs

    async def _children(
        self,
        inp: RllmRunInput,
        loaded: LoadedApp,
        program: RllmProgram,
        inputs: dict[str, Any],
        pre_outputs: dict[str, Any],
    ) -> dict[str, dict[str, Any]]:
        """Run every ``uses`` entry as a child workflow, in waves of independent entries."""
        graph = loaded.resolved.graph
        edges = graph.children(graph.root)
        uses = {u.alias: u for u in program.uses}
        outputs: dict[str, dict[str, Any]] = {}
        pending: list[DependencyEdge] = list(edges)
        while pending:
            wave = [e for e in pending if all(a in outputs for a in e.after)]
            if not wave:  # resolve() orders `after` by earlier entries: unreachable
                raise ApplicationError(
                    f"uses entries wait on each other: {[e.alias for e in pending]}",
                    type="DependencyResolutionError",
                    non_retryable=True,
                )
            pending = [e for e in pending if e not in wave]
            scope = template_variables(
                program, inputs, pre_outputs=pre_outputs, child_outputs=outputs
            )
            self._wait_in("uses:" + ",".join(e.alias for e in wave))
            wave_start = workflow.now()
            results = await asyncio.gather(
                *(
                    self._child(inp, e.alias, uses[e.alias].path, child_input(uses[e.alias], scope))
                    for e in wave
                ),
                return_exceptions=True,
            )
            self._run.children_ms += _ms(wave_start, workflow.now())
            for edge, res in zip(wave, results, strict=True):
                if isinstance(res, ChildWorkflowError):
                    raise _from_failure(res, child=edge.alias)
                if isinstance(res, BaseException):
                    raise res
                self._run.children[edge.alias] = res
                outputs[edge.alias] = res.output
        return outputs

    async def _child(
        self, inp: RllmRunInput, alias: str, use_path: str, child_in: dict[str, Any]
    ) -> RllmRunResult:
        child_path = posixpath.normpath(posixpath.join(posixpath.dirname(inp.path), use_path))
        info = workflow.info()
        result: RllmRunResult = await workflow.execute_child_workflow(
            RllmApp.run,
            RllmRunInput(
                path=child_path,
                files=inp.files,
                input=child_in,
                model=inp.model,
                max_retries=inp.max_retries,
                ollama_auto_pull=inp.ollama_auto_pull,
                record_stats=inp.record_stats,
            ),
            id=f"{info.workflow_id}/{alias}",
            task_queue=info.task_queue,
            static_summary=f"uses {use_path} as {alias}",
        )
        return result

    async def _generate(
        self,
        inp: RllmRunInput,
        loaded: LoadedApp,
        program: RllmProgram,
        variables: dict[str, Any],
    ) -> dict[str, Any]:
        """The model's answer: the first attempt, then recovery retries until one is valid."""
        self._step = "render"
        max_retries = DEFAULT_MAX_RETRIES if inp.max_retries is None else inp.max_retries
        schema = program.llm_output_schema()
        prompt = render_prompt(program, variables)
        check_context_window(prompt, program.max_context_window, program.max_tokens)
        checks: list[OutputCheck] = []
        text = prompt
        for n in range(1, max_retries + 2):
            if n > 1:
                last = checks[-1]
                text = render_recovery(
                    program.recovery_template,
                    last.issues,
                    last.raw,
                    schema,
                    prompt=prompt,
                    variables=variables,
                )
                try:
                    check_context_window(text, program.max_context_window, program.max_tokens)
                except ContextWindowExceededError as e:
                    e.message = f"the recovery prompt of attempt {n} is too long: {e.message}"
                    e.details.update(
                        stage="recovery", attempt=n, attempts=self._attempt_details(checks)
                    )
                    raise
            self._wait_in(f"attempt:{n}")
            res = await call(
                GENERATE,
                GenerateRequest(
                    app=program.name,
                    attempt=n,
                    model=loaded.model,
                    prompt=text,
                    params=program.llm_params,
                    output_schema=schema,
                    structured_output=program.structured_output,
                ),
                summary=f"{program.name} attempt {n}" + (" (recovery)" if n > 1 else ""),
            )
            self._run.attempts.append(res.attempt)
            checks.append(res.check)
            if res.check.ok and res.check.value is not None:
                return res.check.value
        err: RetryExhaustedError = retry_exhausted(checks, schema, max_retries)
        err.details["attempts"] = self._attempt_details(checks)
        err.details["usage"] = self._run.own_usage.model_dump()
        err.details["model"] = loaded.model
        raise err

    def _attempt_details(self, checks: Sequence[OutputCheck]) -> list[dict[str, Any]]:
        """Each attempt's issues, raw answer, token usage and latency, in order."""
        out = []
        for n, (check, att) in enumerate(zip(checks, self._run.attempts, strict=True), start=1):
            out.append(
                {
                    "attempt": n,
                    "issues": [i.model_dump() for i in check.issues],
                    "output": check.raw,
                    "usage": att.usage.model_dump(),
                    "latency_ms": att.latency_ms,
                    "model_name": att.model_name,
                    "finish_reason": att.finish_reason,
                }
            )
        return out

    # -- stats ----------------------------------------------------------------------
    async def _record(
        self, inp: RllmRunInput, started: datetime, failure: ApplicationError | None
    ) -> None:
        state = self._run
        if not inp.record_stats or not state.app:
            return  # nothing to key the record on when the app never loaded
        self._step = "record_stats"
        info = workflow.info()
        finished = workflow.now()
        total_ms = _ms(started, finished)
        usage = state.own_usage
        record = RllmRunRecord(
            run_key=f"{info.workflow_id}/{info.run_id}",
            workflow_id=info.workflow_id,
            app=state.app,
            app_version=state.version,
            model=state.model,
            status="ok" if failure is None else "error",
            error_type=None if failure is None else failure.type,
            input_valid=state.input_valid,
            output_valid=False
            if failure is not None and failure.type == "RetryExhaustedError"
            else state.output_valid,
            attempts=len(state.attempts),
            retries=max(0, len(state.attempts) - 1),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            max_completion_tokens=max(
                (a.usage.completion_tokens for a in state.attempts), default=0
            ),
            llm_latency_ms=state.own_llm_ms,
            total_latency_ms=total_ms,
            own_latency_ms=max(0.0, round(total_ms - state.children_ms, 3)),
            created_at=finished,
        )
        await call(RECORD_STATS, record, summary=f"stats of {state.app}", local=self._local_steps)
