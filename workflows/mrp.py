"""``MRPJob``: compile -> map in windows -> reduce -> evaluate -> approval -> produce -> finalise.

Every phase is an activity (``activities/mrp.py``); this workflow only sequences them,
keeps the budget, and decides the run's status. History stays small and bounded:

- the map phase is cut into windows of ``window_size`` shards (default 100), each one
  heartbeating activity whose input and result are a few hundred bytes (digests, counters,
  cost), so a job writes about 3 events per window plus workflow tasks, not per shard;
- shard payloads and outputs never enter history (the artifact store holds them).

Budget: a :class:`~keel.mrp.budget.BudgetTracker` on the IR's kill limits is charged with
each window's reported cost (units from operators' weights and metered charges, USD from
LLM calls) and with each later phase's. Each window also gets the budget that remains when
it starts and stops starting shards once it has spent it. When the tracker trips, the
windows still running are cancelled and the run ends as ``budget_exceeded`` with a partial
manifest; produce never runs.

Status: ``succeeded``; ``budget_exceeded``; ``rejected``/``expired`` (approval gate; no
side effect); ``evaluation_failed`` (score under ``min_score``; no side effect). A compile
failure, a shard over its retry cap, a failed phase or a replay mismatch fail the workflow
with a non-retryable ``ApplicationError`` (types in ``keel.mrp.run``) after the run is
recorded.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from decimal import Decimal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.mrp import MrpActivities
    from keel.gates import GateRequest, GateStatus
    from keel.mrp.budget import BudgetTracker
    from keel.mrp.errors import BudgetExceeded
    from keel.mrp.run import (
        DEFAULT_WINDOW_SIZE,
        ERROR_COMPILE,
        ERROR_PHASE,
        ERROR_REPLAY_MISMATCH,
        ERROR_REPLAY_SOURCE,
        ERROR_SHARD,
        WORKFLOW_TYPE,
        EvaluationRecord,
        MRPJobInput,
        MRPJobResult,
        ProducedFileRecord,
        RunCost,
        RunStatus,
        ShardCounters,
        run_id_from_workflow_id,
    )
    from keel.mrp.steps import (
        CompiledJob,
        CompileInput,
        EvaluateInput,
        EvaluateResult,
        FinaliseInput,
        FinaliseResult,
        MapWindowInput,
        MapWindowResult,
        PhaseInput,
        ProduceInput,
        ProduceOutput,
        ReduceResult,
    )
    from workflows.gate import open_gate

COMPILE_TIMEOUT = timedelta(minutes=10)
PHASE_TIMEOUT = timedelta(minutes=30)
FINALISE_TIMEOUT = timedelta(minutes=5)
WINDOW_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# Windows in flight at once; each runs max_workers // in_flight shards at a time.
MAX_WINDOWS_IN_FLIGHT = 4
# Runs started before this patch keep one window in flight where a window has more shards
# than max_workers; newer runs overlap two (when max_workers is even).
PATCH_OVERLAP_WINDOWS = "mrp-overlap-windows"

COMPILE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_COMPILE, ERROR_REPLAY_SOURCE],
)
WINDOW_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=[ERROR_SHARD, ERROR_COMPILE],
)
PHASE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_PHASE, ERROR_COMPILE],
)
FINALISE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # the record must land
)


def _cause(err: BaseException) -> ApplicationError | None:
    """The ``ApplicationError`` an activity failed with, if any."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return cause if isinstance(cause, ApplicationError) else None


def windows_of(shard_count: int, size: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``0..shard_count`` in windows of ``size``."""
    return [(s, min(s + size, shard_count)) for s in range(0, shard_count, size)]


def window_timeout(size: int, parallelism: int, timeout_s: float, retries: int) -> timedelta:
    """Start-to-close of one window: every wave of shards at its timeout and retry cap."""
    waves = -(-size // parallelism)
    return timedelta(seconds=waves * timeout_s * (retries + 1) + 120)


@workflow.defn(name=WORKFLOW_TYPE)
class MRPJob:
    def __init__(self) -> None:
        self._phase = "compile"
        self._counters = ShardCounters()
        self._windows_done = 0
        self._windows_total = 0
        self._running: dict[asyncio.Task[MapWindowResult], tuple[int, int]] = {}

    @workflow.query(name="progress")
    def progress(self) -> dict[str, object]:
        """Phase, windows done and shard counters (cheap; no history)."""
        return {
            "phase": self._phase,
            "windows_done": self._windows_done,
            "windows_total": self._windows_total,
            "counters": self._counters.model_dump(),
        }

    @workflow.run
    async def run(self, inp: MRPJobInput) -> MRPJobResult:
        info = workflow.info()
        workflow_id = info.workflow_id
        run_id = inp.run_id or run_id_from_workflow_id(workflow_id)
        backend = inp.backend or "ray"
        replay = inp.replay_of is not None
        llm_replay_only = inp.llm_replay_only or replay
        timings: dict[str, float] = {}

        def lap(phase: str, since: datetime) -> datetime:
            now = workflow.now()
            timings[phase] = round((now - since).total_seconds(), 3)
            return now

        t = workflow.now()
        try:
            compiled: CompiledJob = await workflow.execute_activity_method(
                MrpActivities.compile,
                CompileInput(
                    job_yaml=inp.job_yaml,
                    source=inp.source,
                    base_dir=inp.base_dir,
                    run_id=run_id,
                    workflow_id=workflow_id,
                    backend=backend,
                    replay_of=inp.replay_of,
                ),
                start_to_close_timeout=COMPILE_TIMEOUT,
                retry_policy=COMPILE_RETRY,
            )
        except ActivityError as err:
            cause = _cause(err)
            if cause is None:
                raise
            raise ApplicationError(
                cause.message, *cause.details, type=cause.type, non_retryable=True
            ) from None
        t = lap("compile", t)

        tracker = BudgetTracker(compiled.budget.limits)
        cost = RunCost(
            limit_units=compiled.budget.limits.units,
            limit_usd=compiled.budget.limits.usd,
            estimate_units=compiled.budget.estimate.units,
            estimate_usd=compiled.budget.estimate.usd,
        )

        def charge(units: Decimal, usd: Decimal) -> bool:
            """Charge the tracker; False once it has tripped."""
            cost.units += units
            cost.usd += usd
            cost.llm_usd += usd
            try:
                tracker.charge(units, usd)
            except BudgetExceeded as e:
                cost.tripped = e.dimension
                return False
            return not tracker.tripped

        async def finish(
            status: RunStatus,
            *,
            partial: bool = False,
            reduce_digest: str | None = None,
            evaluation: EvaluationRecord | None = None,
            produce: ProduceOutput | None = None,
            error: str | None = None,
        ) -> FinaliseResult:
            self._phase = "finalise"
            t0 = workflow.now()
            result: FinaliseResult = await workflow.execute_activity_method(
                MrpActivities.finalise,
                FinaliseInput(
                    compiled=compiled,
                    workflow_id=workflow_id,
                    backend=backend,
                    status=status,
                    partial=partial,
                    counters=self._counters,
                    cost=cost,
                    phase_timings=dict(timings),
                    reduce_digest=reduce_digest,
                    evaluation=evaluation,
                    produced=list(produce.files) if produce else [],
                    produce_result_digest=produce.produce_result_digest if produce else None,
                    error=error,
                ),
                start_to_close_timeout=FINALISE_TIMEOUT,
                retry_policy=FINALISE_RETRY,
            )
            timings["finalise"] = round((workflow.now() - t0).total_seconds(), 3)
            self._counters = result.counters
            if result.mismatch is not None and status != "failed":
                m = result.mismatch
                raise ApplicationError(
                    f"replay of run {inp.replay_of} differs at {m.where}: expected "
                    f"{m.expected}, got {m.got}",
                    m.model_dump(),
                    {"run_id": run_id, "run_manifest_digest": result.run_manifest_digest},
                    type=ERROR_REPLAY_MISMATCH,
                    non_retryable=True,
                )
            return result

        def result_of(
            status: RunStatus,
            fin: FinaliseResult,
            *,
            reduce_digest: str | None = None,
            evaluation: EvaluationRecord | None = None,
            produced: list[ProducedFileRecord] | None = None,
            message: str = "",
        ) -> MRPJobResult:
            return MRPJobResult(
                run_id=run_id,
                job_id=compiled.job_id,
                workflow_id=workflow_id,
                status=status,
                backend=backend,
                run_manifest_digest=fin.run_manifest_digest,
                ir_digest=compiled.ir_digest,
                manifest_digest=compiled.manifest_digest,
                reduce_digest=reduce_digest,
                output_digests=fin.output_digests,
                produced=produced or [],
                output_root=compiled.output_root if produced else None,
                counters=fin.counters,
                cost=cost,
                phase_timings=dict(timings),
                evaluation=evaluation,
                replay_of=inp.replay_of,
                replay_matched=(fin.mismatch is None) if replay else None,
                message=message,
            )

        async def rest() -> MRPJobResult:
            nonlocal t
            # -- map ---------------------------------------------------------------------------
            self._phase = "map"
            size = inp.window_size or DEFAULT_WINDOW_SIZE
            windows = windows_of(compiled.shard_count, size)
            self._windows_total = len(windows)
            max_workers = compiled.limits.max_workers
            in_flight = max(1, min(MAX_WINDOWS_IN_FLIGHT, -(-max_workers // size), len(windows)))
            if (
                in_flight == 1
                and len(windows) > 1
                and max_workers % 2 == 0
                and workflow.patched(PATCH_OVERLAP_WINDOWS)
            ):
                # Two windows of half the workers each: the next window starts while the
                # last shards of the other run, so no worker idles between windows.
                in_flight = 2
            parallelism = max(1, max_workers // in_flight)
            timeout = window_timeout(
                size,
                parallelism,
                compiled.limits.shard_timeout_s,
                compiled.limits.max_shard_retries,
            )
            pending = list(reversed(windows))
            running: dict[asyncio.Task[MapWindowResult], tuple[int, int]] = {}
            self._running = running
            shard_error: ApplicationError | None = None
            tripped = False

            def launch(start: int, end: int) -> None:
                units_left, usd_left = tracker.remaining()
                task = asyncio.ensure_future(
                    workflow.execute_activity_method(
                        MrpActivities.map_window,
                        MapWindowInput(
                            run_id=run_id,
                            workflow_id=workflow_id,
                            ir_digest=compiled.ir_digest,
                            start=start,
                            end=end,
                            backend=backend,
                            parallelism=parallelism,
                            remaining_units=units_left,
                            remaining_usd=usd_left,
                            use_checkpoints=not replay,
                            llm_replay_only=llm_replay_only,
                        ),
                        start_to_close_timeout=timeout,
                        heartbeat_timeout=WINDOW_HEARTBEAT_TIMEOUT,
                        retry_policy=WINDOW_RETRY,
                        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                        summary=f"shards {start}..{end - 1}",
                    )
                )
                running[task] = (start, end)

            while (pending or running) and shard_error is None and not tripped:
                while pending and len(running) < in_flight:
                    launch(*pending.pop())
                done, _ = await workflow.wait(list(running), return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda d: running[d]):
                    start, end = running.pop(task)
                    try:
                        wr = task.result()
                    except ActivityError as err:
                        # The first failure decides; later ones are the same run going down.
                        if shard_error is None:
                            shard_error = _cause(err) or ApplicationError(
                                f"map window of shards {start}..{end - 1} failed: {err.cause or err}",
                                type=ERROR_PHASE,
                            )
                        continue
                    self._windows_done += 1
                    c = self._counters
                    c.run += wr.counters.run
                    c.skipped += wr.counters.skipped
                    c.retried += wr.counters.retried
                    c.failed += wr.counters.failed
                    cost.llm_calls += wr.llm_calls
                    cost.llm_cached += wr.llm_cached
                    if not charge(wr.cost_units, wr.cost_usd) or wr.stopped_by_budget:
                        tripped = tripped or tracker.tripped
            if running:
                # Kill switch or a failed shard: cancel what still runs and wait for it to stop.
                for task in running:
                    task.cancel()
                outcomes = await asyncio.gather(*running, return_exceptions=True)
                for outcome in outcomes:
                    if isinstance(outcome, MapWindowResult):  # finished before the cancel landed
                        self._counters.run += outcome.counters.run
                        self._counters.skipped += outcome.counters.skipped
                        self._counters.retried += outcome.counters.retried
                        charge(outcome.cost_units, outcome.cost_usd)
                running.clear()
            t = lap("map", t)

            if shard_error is not None:
                fin = await finish("failed", partial=True, error=shard_error.message)
                raise ApplicationError(
                    shard_error.message,
                    *shard_error.details,
                    {"run_id": run_id, "run_manifest_digest": fin.run_manifest_digest},
                    type=shard_error.type,
                    non_retryable=True,
                )
            if tripped or tracker.tripped:
                fin = await finish(
                    "budget_exceeded", partial=True, error=f"budget kill switch ({cost.tripped})"
                )
                return result_of(
                    "budget_exceeded", fin, message=f"budget exceeded ({cost.tripped}); map stopped"
                )

            # -- reduce, evaluate --------------------------------------------------------------
            phase_input = PhaseInput(
                run_id=run_id,
                workflow_id=workflow_id,
                ir_digest=compiled.ir_digest,
                llm_replay_only=llm_replay_only,
            )
            self._phase = "reduce"
            reduced: ReduceResult = await self._phase_activity(
                MrpActivities.reduce, phase_input, run_id, finish
            )
            t = lap("reduce", t)
            if not charge(reduced.cost_units, reduced.cost_usd):
                fin = await finish(
                    "budget_exceeded", partial=True, reduce_digest=reduced.reduce_digest
                )
                return result_of("budget_exceeded", fin, reduce_digest=reduced.reduce_digest)

            evaluation: EvaluationRecord | None = None
            if compiled.evaluate is not None:
                self._phase = "evaluate"
                ev: EvaluateResult = await self._phase_activity(
                    MrpActivities.evaluate,
                    EvaluateInput(**phase_input.model_dump(), reduce_digest=reduced.reduce_digest),
                    run_id,
                    finish,
                )
                t = lap("evaluate", t)
                evaluation = ev.evaluation
                within = charge(ev.cost_units, ev.cost_usd)
                if not within or not evaluation.passed:
                    status: RunStatus = "budget_exceeded" if not within else "evaluation_failed"
                    fin = await finish(
                        status,
                        partial=not within,
                        reduce_digest=reduced.reduce_digest,
                        evaluation=evaluation,
                    )
                    return result_of(
                        status,
                        fin,
                        reduce_digest=reduced.reduce_digest,
                        evaluation=evaluation,
                        message=f"score {evaluation.score} < {evaluation.min_score}"
                        if within
                        else "budget exceeded",
                    )

            # -- approval ----------------------------------------------------------------------
            if compiled.approval is not None and not replay:
                self._phase = "approval"
                approval = compiled.approval
                gate = await open_gate(
                    GateRequest(
                        name=approval.gate,
                        requester=inp.requester,
                        approvers=list(approval.approvers),
                        subject=f"Produce MRP job {compiled.job_id} (run {run_id}) to "
                        f"{compiled.sink.kind.value}:{compiled.sink.destination}?",
                        details={
                            "run_id": run_id,
                            "job_id": compiled.job_id,
                            "reduce_digest": reduced.reduce_digest,
                            "shards": compiled.shard_count,
                            "score": str(evaluation.score) if evaluation else None,
                            "cost_units": str(cost.units),
                        },
                        expires_in_s=approval.expires_in_s,
                    )
                )
                t = lap("approval", t)
                if gate.status != GateStatus.APPROVED:
                    status = "rejected" if gate.status == GateStatus.REJECTED else "expired"
                    fin = await finish(
                        status, reduce_digest=reduced.reduce_digest, evaluation=evaluation
                    )
                    return result_of(
                        status,
                        fin,
                        reduce_digest=reduced.reduce_digest,
                        evaluation=evaluation,
                        message=f"gate {approval.gate} {gate.status.value}"
                        + (f" by {gate.decided_by}" if gate.decided_by else ""),
                    )

            # -- produce -----------------------------------------------------------------------
            self._phase = "produce"
            produced: ProduceOutput = await self._phase_activity(
                MrpActivities.produce,
                ProduceInput(
                    **phase_input.model_dump(),
                    reduce_digest=reduced.reduce_digest,
                    output_root=compiled.output_root,
                ),
                run_id,
                finish,
            )
            t = lap("produce", t)
            charge(produced.cost_units, produced.cost_usd)  # the side effect is done: record it

            fin = await finish(
                "succeeded",
                reduce_digest=reduced.reduce_digest,
                evaluation=evaluation,
                produce=produced,
            )
            return result_of(
                "succeeded",
                fin,
                reduce_digest=reduced.reduce_digest,
                evaluation=evaluation,
                produced=list(produced.files),
            )

        try:
            return await rest()
        except asyncio.CancelledError:
            # Cancelled from outside: stop the windows, record the run, then end cancelled.
            for task in self._running:
                task.cancel()
            await asyncio.gather(*self._running, return_exceptions=True)
            await finish("failed", partial=True, error="workflow cancelled")
            raise

    async def _phase_activity(self, fn, arg, run_id, finish):  # type: ignore[no-untyped-def]
        """Run a reduce/evaluate/produce activity; a failure is recorded, then raised."""
        try:
            return await workflow.execute_activity_method(
                fn,
                arg,
                start_to_close_timeout=PHASE_TIMEOUT,
                retry_policy=PHASE_RETRY,
            )
        except ActivityError as err:
            cause = _cause(err)
            message = cause.message if cause is not None else str(err)
            fin = await finish("failed", partial=True, error=message)
            raise ApplicationError(
                message,
                {"run_id": run_id, "run_manifest_digest": fin.run_manifest_digest},
                type=cause.type if cause is not None and cause.type else ERROR_PHASE,
                non_retryable=True,
            ) from None
