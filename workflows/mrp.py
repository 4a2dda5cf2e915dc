"""``MRPJob``: compile -> map in windows -> reduce -> evaluate -> approval -> produce -> finalise.

Every phase is an activity (``activities/mrp.py``), called through its reference in
``keel.mrp.steps`` with its limits from ``workflows.common.OPTIONS``; this workflow only
sequences them, keeps the budget, and decides the run's status. ``run`` reads as the
phases in order; each phase is a method that returns the workflow's result when it ends
the run, and ``None`` when the next phase goes on. History stays small and bounded:

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
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from typing import NoReturn, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from keel.access import READERS_SIGNAL
    from keel.gates import GateRequest, GateStatus
    from keel.mrp import steps
    from keel.mrp.budget import BudgetTracker
    from keel.mrp.errors import BudgetExceeded
    from keel.mrp.run import (
        DEFAULT_WINDOW_SIZE,
        ERROR_PHASE,
        ERROR_REPLAY_MISMATCH,
        ERROR_SHARD,
        WORKFLOW_TYPE,
        Backend,
        EvaluationRecord,
        MRPJobInput,
        MRPJobResult,
        RunCost,
        RunStatus,
        ShardCounters,
        run_id_from_workflow_id,
    )
    from keel.mrp.steps import (
        CompiledJob,
        CompileInput,
        EvaluateInput,
        FinaliseInput,
        FinaliseResult,
        MapWindowInput,
        MapWindowResult,
        PhaseInput,
        ProduceInput,
        ProduceOutput,
    )
    from keel.progress import RunProgress
    from keel.refs import ActivityRef
    from workflows.common import call, failure_cause
    from workflows.gate import open_gate
    from workflows.readers import ProgressMemo, upsert_readers

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

# Windows in flight at once; each runs max_workers // in_flight shards at a time. Runs
# before patch mrp-windows-per-cpu: at most this many; after it, at least this many, and
# as many more as the backend's CPUs can keep busy (see windows_in_flight).
MAX_WINDOWS_IN_FLIGHT = 4
# Runs whose compile reported the backend's CPUs keep windows_in_flight(...) windows in
# flight (asked only where that differs from the old count, so older histories replay).
PATCH_WINDOWS_PER_CPU = "mrp-windows-per-cpu"
# Runs started before this patch keep one window in flight where a window has more shards
# than max_workers; newer runs overlap two (when max_workers is even).
PATCH_OVERLAP_WINDOWS = "mrp-overlap-windows"
# Ray runs started after this patch keep one window more in flight than their workers
# need: it gets ready (its activity, the shards already done, the checkpoints, its
# session) while the others run, and its lane takes the first actor one of them frees,
# so no actor waits between windows for the next one to be scheduled and set up
# (bench/mrp_scale.py, 20,000 shards in windows of 1,000: warm map 9.4 s -> 6.1 s).
PATCH_WINDOW_AHEAD = "mrp-window-ahead"
# Runs whose job sets map.min_success_ratio below 1 tolerate shards that fail for good
# (asked only for such jobs, so histories of every other run replay unchanged).
PATCH_MIN_SUCCESS_RATIO = "mrp-min-success-ratio"
# Failed shard ids a message names before it says "and N more".
MAX_NAMED_SHARDS = 20


def windows_of(shard_count: int, size: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``0..shard_count`` in windows of ``size``."""
    return [(s, min(s + size, shard_count)) for s in range(0, shard_count, size)]


def windows_in_flight(max_workers: int, size: int, windows: int, cpus: int) -> int:
    """Windows to keep in flight: enough that their shards use ``max_workers`` workers,
    at most one window per ``size`` of the backend's ``cpus`` plus one (the next window
    starts while the last shards of the others run), never fewer than the old
    :data:`MAX_WINDOWS_IN_FLIGHT` cap, and never more than there are windows."""
    cap = max(MAX_WINDOWS_IN_FLIGHT, -(-cpus // size) + 1)
    return max(1, min(cap, -(-max_workers // size), windows))


def window_timeout(size: int, parallelism: int, timeout_s: float, retries: int) -> timedelta:
    """Start-to-close of one window: every wave of shards at its timeout and retry cap."""
    waves = -(-size // parallelism)
    return timedelta(seconds=waves * timeout_s * (retries + 1) + 120)


@dataclass(frozen=True, slots=True)
class _WindowPlan:
    """How the map phase cuts and runs its shards."""

    windows: list[tuple[int, int]]
    in_flight: int
    parallelism: int
    timeout: timedelta


@workflow.defn(name=WORKFLOW_TYPE)
class MRPJob:
    @workflow.init
    def __init__(self, inp: MRPJobInput) -> None:
        info = workflow.info()
        self._inp = inp
        self._workflow_id = info.workflow_id
        self._run_id = inp.run_id or run_id_from_workflow_id(info.workflow_id)
        self._backend: Backend = inp.backend or "ray"
        self._replay = inp.replay_of is not None
        self._llm_replay_only = inp.llm_replay_only or self._replay
        # What the progress query shows.
        self._phase = "compile"
        self._counters = ShardCounters()
        self._windows_done = 0
        self._windows_total = 0
        # The same, in the run's progress memo (GET /runs reads it; patch keel-progress-memo).
        self._memo = ProgressMemo()
        # Seconds per phase; a phase's lap starts where the previous one ended.
        self._timings: dict[str, float] = {}
        self._lap_start = workflow.now()
        # Set by _compile; every later phase reads them.
        self._compiled: CompiledJob
        self._tracker: BudgetTracker
        self._cost: RunCost
        self._phase_input: PhaseInput
        # Map: windows still running (the cancel path stops them too), and what ends it.
        self._running: dict[asyncio.Task[MapWindowResult], tuple[int, int]] = {}
        self._shard_error: ApplicationError | None = None
        self._tripped = False
        # map.min_success_ratio < 1 (and the patch): shards that failed for good, by id.
        self._tolerate = False
        self._failed_shards: list[str] = []
        # Set by the phases that make them; the run's record and result carry them.
        self._reduce_digest: str | None = None
        self._evaluation: EvaluationRecord | None = None
        self._produced: ProduceOutput | None = None
        # Set when the run went on without the shards that failed (min_success_ratio).
        self._partial_note = ""

    @workflow.signal(name=READERS_SIGNAL)
    def refresh_readers(self) -> None:
        """Set ``KeelReaders`` from the access memo (``keel migrate-search-attributes``)."""
        upsert_readers()

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
        self._memo.start()
        self._show()
        await self._compile()
        try:
            for phase in (self._map, self._reduce, self._evaluate, self._approve):
                if (ended := await phase()) is not None:
                    return ended
            return await self._produce()
        except asyncio.CancelledError:
            # Cancelled from outside: stop the windows, record the run, then end cancelled.
            await self._stop_windows()
            await self._finalise("failed", partial=True, error="workflow cancelled", outputs=False)
            raise

    # -- phases ------------------------------------------------------------------------------

    async def _compile(self) -> None:
        """Compile the job; a refusal fails the workflow at once (no run to record yet)."""
        inp = self._inp
        try:
            compiled = await call(
                steps.COMPILE,
                CompileInput(
                    job_yaml=inp.job_yaml,
                    source=inp.source,
                    base_dir=inp.base_dir,
                    run_id=self._run_id,
                    workflow_id=self._workflow_id,
                    backend=self._backend,
                    replay_of=inp.replay_of,
                ),
                summary=f"compile run {self._run_id}",
            )
        except ActivityError as err:
            cause = failure_cause(err)
            if cause is None:
                raise
            raise ApplicationError(
                cause.message, *cause.details, type=cause.type, non_retryable=True
            ) from None
        self._lap("compile")
        self._compiled = compiled
        self._tracker = BudgetTracker(compiled.budget.limits)
        self._cost = RunCost(
            limit_units=compiled.budget.limits.units,
            limit_usd=compiled.budget.limits.usd,
            estimate_units=compiled.budget.estimate.units,
            estimate_usd=compiled.budget.estimate.usd,
        )
        self._phase_input = PhaseInput(
            run_id=self._run_id,
            workflow_id=self._workflow_id,
            ir_digest=compiled.ir_digest,
            llm_replay_only=self._llm_replay_only,
        )

    async def _map(self) -> MRPJobResult | None:
        """Run the shards window by window; a failed shard or the kill switch ends the run."""
        self._phase = "map"
        plan = self._plan_windows()
        self._show()
        ratio = self._compiled.limits.min_success_ratio
        # The patch is asked only for jobs that set a ratio: no older history has one.
        self._tolerate = ratio is not None and workflow.patched(PATCH_MIN_SUCCESS_RATIO)
        pending = list(reversed(plan.windows))
        while (pending or self._running) and self._shard_error is None and not self._tripped:
            while pending and len(self._running) < plan.in_flight:
                self._launch_window(plan, *pending.pop())
            done, _ = await workflow.wait(list(self._running), return_when=asyncio.FIRST_COMPLETED)
            for task in sorted(done, key=lambda d: self._running[d]):
                self._collect_window(task)
            self._show()
        if self._running:
            # Kill switch or a failed shard: cancel what still runs and wait for it to stop.
            for late in await self._stop_windows():  # finished before the cancel landed
                self._counters.run += late.counters.run
                self._counters.skipped += late.counters.skipped
                self._counters.retried += late.counters.retried
                self._charge(late.cost_units, late.cost_usd)
        self._lap("map")

        if self._failed_shards and self._shard_error is None and not self._tracker.tripped:
            self._weigh_failures()
        if self._shard_error is not None:
            await self._fail(
                self._shard_error.message, self._shard_error.type, *self._shard_error.details
            )
        if self._tripped or self._tracker.tripped:
            return await self._finish(
                "budget_exceeded",
                partial=True,
                error=f"budget kill switch ({self._cost.tripped})",
                message=f"budget exceeded ({self._cost.tripped}); map stopped",
            )
        return None

    def _weigh_failures(self) -> None:
        """``map.min_success_ratio``: enough shards succeeded and the run goes on over them
        (its message names the failed ones), or the run fails as one failed shard would."""
        limits, total = self._compiled.limits, self._compiled.shard_count
        failed = sorted(set(self._failed_shards))
        named = ", ".join(failed[:MAX_NAMED_SHARDS]) + (
            f" and {len(failed) - MAX_NAMED_SHARDS} more" if len(failed) > MAX_NAMED_SHARDS else ""
        )
        ok = total - len(failed)
        what = (
            f"{len(failed)} of {total} shards failed ({named}); {ok} succeeded, "
            f"min_success_ratio {limits.min_success_ratio}"
        )
        if not limits.enough_succeeded(ok, total):
            self._shard_error = ApplicationError(
                f"{what} needs more (see mrp inspect for each shard's error)",
                {"failed_shards": failed},
                type=ERROR_SHARD,
            )
        else:
            self._partial_note = f"{what}: reduced over the shards that succeeded"

    async def _reduce(self) -> MRPJobResult | None:
        self._phase = "reduce"
        self._show()
        reduced = await self._step(
            steps.REDUCE,
            self._phase_input,
            summary=f"reduce {self._compiled.shard_count} shards",
        )
        self._lap("reduce")
        self._reduce_digest = reduced.reduce_digest
        if not self._charge(reduced.cost_units, reduced.cost_usd):
            return await self._finish("budget_exceeded", partial=True)
        return None

    async def _evaluate(self) -> MRPJobResult | None:
        """Score the reduced value (when the job asks); under ``min_score`` ends the run."""
        if self._compiled.evaluate is None:
            return None
        self._phase = "evaluate"
        self._show()
        ev = await self._step(steps.EVALUATE, self._after_reduce(), summary="evaluate")
        self._lap("evaluate")
        self._evaluation = evaluation = ev.evaluation
        if not self._charge(ev.cost_units, ev.cost_usd):
            return await self._finish("budget_exceeded", partial=True, message="budget exceeded")
        if not evaluation.passed:
            return await self._finish(
                "evaluation_failed",
                message=f"score {evaluation.score} < {evaluation.min_score}",
            )
        return None

    async def _approve(self) -> MRPJobResult | None:
        """The approval gate (a child workflow), when the job has one; a replay skips it."""
        approval = self._compiled.approval
        if approval is None or self._replay:
            return None
        self._phase = "approval"
        self._show()
        compiled, run_id = self._compiled, self._run_id
        gate = await open_gate(
            GateRequest(
                name=approval.gate,
                requester=self._inp.requester,
                approvers=list(approval.approvers),
                subject=f"Produce MRP job {compiled.job_id} (run {run_id}) to "
                f"{compiled.sink.kind.value}:{compiled.sink.destination}?",
                details={
                    "run_id": run_id,
                    "job_id": compiled.job_id,
                    "reduce_digest": self._reduce_digest,
                    "shards": compiled.shard_count,
                    "score": str(self._evaluation.score) if self._evaluation else None,
                    "cost_units": str(self._cost.units),
                },
                expires_in_s=approval.expires_in_s,
            )
        )
        self._lap("approval")
        if gate.status == GateStatus.APPROVED:
            return None
        return await self._finish(
            "rejected" if gate.status == GateStatus.REJECTED else "expired",
            message=f"gate {approval.gate} {gate.status.value}"
            + (f" by {gate.decided_by}" if gate.decided_by else ""),
        )

    async def _produce(self) -> MRPJobResult:
        """Write the sink's files (the job's only side effect), then record the run."""
        self._phase = "produce"
        self._show()
        sink = self._compiled.sink
        self._produced = produced = await self._step(
            steps.PRODUCE,
            ProduceInput(
                **self._after_reduce().model_dump(), output_root=self._compiled.output_root
            ),
            summary=f"produce to {sink.kind.value}:{sink.destination}",
        )
        self._lap("produce")
        self._charge(produced.cost_units, produced.cost_usd)  # the side effect is done: record it
        return await self._finish("succeeded", message=self._partial_note)

    # -- map windows -------------------------------------------------------------------------

    def _plan_windows(self) -> _WindowPlan:
        size = self._inp.window_size or DEFAULT_WINDOW_SIZE
        windows = windows_of(self._compiled.shard_count, size)
        self._windows_total = len(windows)
        limits = self._compiled.limits
        max_workers = limits.max_workers
        in_flight = max(1, min(MAX_WINDOWS_IN_FLIGHT, -(-max_workers // size), len(windows)))
        cpus = self._compiled.backend_cpus
        if cpus is not None:
            scaled = windows_in_flight(max_workers, size, len(windows), cpus)
            if scaled != in_flight and workflow.patched(PATCH_WINDOWS_PER_CPU):
                in_flight = scaled
        # The patch is asked only where it can change something, as it always was: asking
        # it elsewhere would add a marker that older histories lack.
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
        # Asked only where it changes something, like the patches above.
        if (
            self._backend == "ray"
            and in_flight < len(windows)
            and workflow.patched(PATCH_WINDOW_AHEAD)
        ):
            in_flight += 1
        timeout = window_timeout(
            size, parallelism, limits.shard_timeout_s, limits.max_shard_retries
        )
        return _WindowPlan(windows, in_flight, parallelism, timeout)

    def _launch_window(self, plan: _WindowPlan, start: int, end: int) -> None:
        """Start the window ``[start, end)`` with the budget that remains now."""
        units_left, usd_left = self._tracker.remaining()
        task = asyncio.ensure_future(
            call(
                steps.MAP_WINDOW,
                MapWindowInput(
                    run_id=self._run_id,
                    workflow_id=self._workflow_id,
                    ir_digest=self._compiled.ir_digest,
                    start=start,
                    end=end,
                    backend=self._backend,
                    parallelism=plan.parallelism,
                    remaining_units=units_left,
                    remaining_usd=usd_left,
                    use_checkpoints=not self._replay,
                    llm_replay_only=self._llm_replay_only,
                    tolerate_failures=self._tolerate,
                ),
                summary=f"map shards {start}-{end - 1}",
                start_to_close=plan.timeout,
                cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
            )
        )
        self._running[task] = (start, end)

    def _collect_window(self, task: asyncio.Task[MapWindowResult]) -> None:
        """Count a finished window and charge its cost; note a failure or a trip."""
        start, end = self._running.pop(task)
        try:
            wr = task.result()
        except ActivityError as err:
            # The first failure decides; later ones are the same run going down.
            if self._shard_error is None:
                self._shard_error = failure_cause(err) or ApplicationError(
                    f"map window of shards {start}..{end - 1} failed: {err.cause or err}",
                    type=ERROR_PHASE,
                )
            return
        self._windows_done += 1
        self._failed_shards += wr.failed_shards
        c = self._counters
        c.run += wr.counters.run
        c.skipped += wr.counters.skipped
        c.retried += wr.counters.retried
        c.failed += wr.counters.failed
        self._cost.llm_calls += wr.llm_calls
        self._cost.llm_cached += wr.llm_cached
        if not self._charge(wr.cost_units, wr.cost_usd) or wr.stopped_by_budget:
            self._tripped = self._tripped or self._tracker.tripped

    async def _stop_windows(self) -> list[MapWindowResult]:
        """Cancel the windows still running and wait for them; those that finished first."""
        for task in self._running:
            task.cancel()
        outcomes = await asyncio.gather(*self._running, return_exceptions=True)
        self._running.clear()
        return [o for o in outcomes if isinstance(o, MapWindowResult)]

    # -- shared by the phases ----------------------------------------------------------------

    def _show(self) -> None:
        """The progress query's phase and windows, in the run's progress memo."""
        total = self._windows_total or None
        self._memo.show(
            RunProgress(
                phase=self._phase,
                done=self._windows_done if total else None,
                total=total,
                unit="windows" if total else None,
            )
        )

    def _lap(self, phase: str) -> None:
        now = workflow.now()
        self._timings[phase] = round((now - self._lap_start).total_seconds(), 3)
        self._lap_start = now

    def _charge(self, units: Decimal, usd: Decimal) -> bool:
        """Charge the tracker; False once it has tripped."""
        cost = self._cost
        cost.units += units
        cost.usd += usd
        cost.llm_usd += usd
        try:
            self._tracker.charge(units, usd)
        except BudgetExceeded as e:
            cost.tripped = e.dimension
            return False
        return not self._tracker.tripped

    def _after_reduce(self) -> EvaluateInput:
        """The input of evaluate and produce: the phase input and the reduced value."""
        # Only phases after _reduce call this, and _reduce sets the digest or ends the run.
        assert self._reduce_digest is not None
        return EvaluateInput(**self._phase_input.model_dump(), reduce_digest=self._reduce_digest)

    async def _step(self, ref: ActivityRef[In, Out], arg: In, *, summary: str) -> Out:
        """Run reduce, evaluate or produce; a failure is recorded, then fails the workflow."""
        try:
            return await call(ref, arg, summary=summary)
        except ActivityError as err:
            cause = failure_cause(err)
            message = cause.message if cause is not None else str(err)
            await self._fail(
                message, cause.type if cause is not None and cause.type else ERROR_PHASE
            )

    async def _fail(self, message: str, kind: str | None, *details: object) -> NoReturn:
        """Record the run as failed (partial), then fail the workflow with ``kind``."""
        fin = await self._finalise("failed", partial=True, error=message, outputs=False)
        raise ApplicationError(
            message,
            *details,
            {"run_id": self._run_id, "run_manifest_digest": fin.run_manifest_digest},
            type=kind,
            non_retryable=True,
        ) from None

    async def _finish(
        self,
        status: RunStatus,
        *,
        partial: bool = False,
        error: str | None = None,
        message: str = "",
    ) -> MRPJobResult:
        """Record the run with what the phases made, and return the workflow's result."""
        fin = await self._finalise(status, partial=partial, error=error)
        compiled = self._compiled
        produced = list(self._produced.files) if self._produced else []
        return MRPJobResult(
            run_id=self._run_id,
            job_id=compiled.job_id,
            workflow_id=self._workflow_id,
            status=status,
            backend=self._backend,
            run_manifest_digest=fin.run_manifest_digest,
            ir_digest=compiled.ir_digest,
            manifest_digest=compiled.manifest_digest,
            reduce_digest=self._reduce_digest,
            output_digests=fin.output_digests,
            produced=produced,
            output_root=compiled.output_root if produced else None,
            counters=fin.counters,
            cost=self._cost,
            phase_timings=dict(self._timings),
            evaluation=self._evaluation,
            replay_of=self._inp.replay_of,
            replay_matched=(fin.mismatch is None) if self._replay else None,
            message=message,
        )

    async def _finalise(
        self,
        status: RunStatus,
        *,
        partial: bool = False,
        error: str | None = None,
        outputs: bool = True,
    ) -> FinaliseResult:
        """Write the run manifest and the run row; ``outputs=False`` (a failed run) names no
        reduced value, evaluation or produced files.

        A replay whose outputs differ from the original's fails the workflow here.
        """
        self._phase = "finalise"
        started = workflow.now()
        produced = self._produced if outputs else None
        result = await call(
            steps.FINALISE,
            FinaliseInput(
                compiled=self._compiled,
                workflow_id=self._workflow_id,
                backend=self._backend,
                status=status,
                partial=partial,
                counters=self._counters,
                cost=self._cost,
                phase_timings=dict(self._timings),
                reduce_digest=self._reduce_digest if outputs else None,
                evaluation=self._evaluation if outputs else None,
                produced=list(produced.files) if produced else [],
                produce_result_digest=produced.produce_result_digest if produced else None,
                error=error,
            ),
            summary=f"finalise {status}",
        )
        self._timings["finalise"] = round((workflow.now() - started).total_seconds(), 3)
        self._counters = result.counters
        if result.mismatch is not None and status != "failed":
            m = result.mismatch
            raise ApplicationError(
                f"replay of run {self._inp.replay_of} differs at {m.where}: expected "
                f"{m.expected}, got {m.got}",
                m.model_dump(),
                {"run_id": self._run_id, "run_manifest_digest": result.run_manifest_digest},
                type=ERROR_REPLAY_MISMATCH,
                non_retryable=True,
            )
        return result
