"""The ``MRPJob`` activities: compile, map windows, reduce, evaluate, produce, finalise.

Only digests cross into workflow history: the IR, shard inputs and outputs, reduced value,
evaluation and run manifest live in the artifact store; per-shard status and the checkpoint
index live in SQL (``store/mrp_runs.py``).

- ``mrp.compile``: parse and admit the job against ``configs/mrp.yaml`` (operators whose
  code no longer matches their pin are refused), resolve ``inputs.files`` under
  ``base_dir`` and store their bytes, store every shard input, ``IR.json``,
  ``manifest.json``, the policy report and the job file; record the run. For a replay,
  load the original run's IR instead. Failures are non-retryable
  ``ApplicationError(type="MrpCompileError")`` naming the rule or operator. It heartbeats
  every ``COMPILE_HEARTBEAT_EVERY_S`` with how far the input scan has got.
- ``mrp.map_window``: run shards ``[start, end)`` on the backend, heartbeating the number
  done. A shard whose checkpoint key is indexed (or that this run already finished) is
  skipped; others run with the policy's timeout and retry cap. Over the cap the window
  fails non-retryably (``MrpShardFailed``) naming the shard. With a remaining budget the
  window stops starting shards once it has spent it.
- ``mrp.reduce`` / ``mrp.evaluate`` / ``mrp.produce``: one operator call each; produce is
  the only phase that writes outside the store (under the run's output root).
- ``mrp.finalise``: the run manifest (every digest) into the store, the run row into SQL,
  and for a replay the comparison with the original (first differing digest).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import JsonValue
from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.llm import LLMGateway, sql_recorder
from activities.mrp.backends import backend_cpus, file_reader, store_for
from activities.mrp.compiling import (
    check_job_sink,
    compile_error,
    compile_errors,
    config_fingerprint,
    refuse_input_sources,
    resolve_job_inputs,
)
from activities.mrp.host import run_in_host
from activities.mrp.llm import LLMCallStats, call_stats, llm_client_for, record_calls
from activities.mrp.operators import (
    MrpConfig,
    OperatorHandle,
    load_mrp_config,
    phase_handle,
)
from activities.mrp.records import ScanProgress
from activities.mrp.reducing import OutputStream
from activities.mrp.sinks import SinkWriteError, upload_to_s3
from activities.mrp.telemetry import operator_errors, span
from activities.mrp.window import MapWindow, load_ir
from activities.telemetry import meter_add, meter_hist
from keel.digest import digest_bytes
from keel.mrp import steps
from keel.mrp.dsl import URI_RE, destination_problem
from keel.mrp.errors import MrpError
from keel.mrp.ir import JobIR, ir_from_json
from keel.mrp.normalize import FileRef, in_shard_order
from keel.mrp.records import MAX_LISTED_SKIPPED, MalformedRecord, RecordSlice
from keel.mrp.registry import OperatorKind
from keel.mrp.run import (
    ERROR_PHASE,
    ERROR_REPLAY_SOURCE,
    EvaluationRecord,
    ProducedFileRecord,
    ReplayMismatch,
    RunManifest,
    ShardOutputRecord,
    ShardState,
    SkippedRecords,
    first_mismatch,
    run_manifest_from_json,
)
from keel.mrp.sdk import OperatorContext
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
from keel.records import LLMCallLog
from keel.settings import Settings
from store.artifacts import ArtifactStore
from store.db import get_sessionmaker
from store.files import load_models_config
from store.mrp_runs import (
    RunIdTaken,
    finish_run,
    get_run,
    index_run_checkpoints,
    list_shards,
    shard_outcomes,
    shard_outputs,
    start_run,
)

if TYPE_CHECKING:
    from keel.mrp.compiler import CompileResult
    from keel.mrp.dsl import ParsedJob

_In = TypeVar("_In")
_Out = TypeVar("_Out")

#: How often the compile activity heartbeats (its heartbeat timeout, MRP_COMPILE_HEARTBEAT
#: in workflows/common.py, is several times this).
COMPILE_HEARTBEAT_EVERY_S = 5.0
# Shard inputs a compile stores in one ``put_many`` (two file-system syncs each).
INPUTS_PER_PUT = 4096


# ---------------------------------------------------------------------------------------
# Helpers


def _output_root(settings: Settings, job_id: str, run_id: str) -> Path:
    """Where produce writes: ``<data dir>/mrp/output/<job_id>/<run_id>``."""
    return (settings.data_dir / "mrp" / "output" / job_id / _safe(run_id)).resolve()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


# ---------------------------------------------------------------------------------------
# Activities


class MrpActivities:
    """The MRP activities, bound to the worker's settings."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._sessions: sessionmaker[Session] | None = None
        self._llm_model = ""
        self._llm_gateway: LLMGateway | None = None
        self._config_cache: tuple[str, MrpConfig] | None = None

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def llm_model(self) -> str:
        """The default LLM model of the MRP config last read (``config()``)."""
        return self._llm_model

    @property
    def sessions(self) -> sessionmaker[Session]:
        if self._sessions is None:
            self._sessions = get_sessionmaker(self._settings.resolved_database_url)
        return self._sessions

    @property
    def store(self) -> ArtifactStore:
        return store_for(self._settings)

    def config(self) -> MrpConfig:
        """``configs/mrp.yaml`` (or ``KEEL_MRP_CONFIG``), checked on every phase: the
        config file, every ``operator.yaml`` and every operator's code are read and hashed
        again; the parsed config is reused only while all of those bytes are unchanged
        (parsing and schema-checking the operator specs is most of a fresh load)."""
        try:
            fingerprint = config_fingerprint(self._settings)
            cached = self._config_cache
            if cached is not None and cached[0] == fingerprint:
                config = cached[1]
            else:
                config = load_mrp_config(self._settings)
                self._config_cache = (fingerprint, config)
        except MrpError as e:
            raise compile_error(str(e), kind="config") from None
        self._llm_model = config.llm_model
        return config

    def all(self) -> list[Any]:
        """Every activity callable, for ``build_activities``."""
        return [
            self.compile,
            self.map_window,
            self.reduce,
            self.evaluate,
            self.produce,
            self.finalise,
        ]

    # -- compile ---------------------------------------------------------------------------

    @activity.defn(name=steps.COMPILE.name)
    async def compile(self, inp: CompileInput) -> CompiledJob:
        """Compile (or, for a replay, load) the job and store everything it needs,
        heartbeating the scan's progress (a lost worker is noticed after the heartbeat
        timeout, not the whole start-to-close)."""
        progress = ScanProgress()
        return await heartbeating(
            asyncio.to_thread(self._compile, inp, progress),
            every_s=COMPILE_HEARTBEAT_EVERY_S,
            details=progress.heartbeat,
        )

    def _compile(self, inp: CompileInput, progress: ScanProgress | None = None) -> CompiledJob:
        with span("mrp.compile", run_id=inp.run_id, replay=bool(inp.replay_of)):
            if inp.replay_of:
                return self._load_replay(inp)
            store = self.store
            config = self.config()
            job_yaml_digest = store.put_bytes(inp.job_yaml.encode("utf-8"))
            parsed, result, file_digests, malformed = self._compile_job(inp, config, progress)
            ir = result.ir
            # Shard payloads go to the store in the IR's packs, and alone where the IR
            # names no place for them (keel/mrp/ir.py).
            stored = store.put_many(result.input_packs) if result.input_packs else []
            if stored != ir.input_packs:  # pragma: no cover - the compiler digests them
                raise RuntimeError("input packs stored under other digests than the IR's")
            alone = list(
                {
                    t.input_digest: result.shard_inputs[t.input_digest]
                    for t in ir.map_tasks
                    if t.input_at is None
                }.items()
            )
            for i in range(0, len(alone), INPUTS_PER_PUT):
                chunk = alone[i : i + INPUTS_PER_PUT]
                got = store.put_many([p.canonical_bytes() for _, p in chunk])
                if got != [digest for digest, _ in chunk]:  # pragma: no cover
                    raise RuntimeError("a shard input stored under another digest")
            ir_digest = store.put_bytes(result.ir_json())
            manifest_digest = store.put_bytes(result.manifest_json())
            report_digest = store.put_bytes(result.policy_report_json())
            if ir_digest != result.manifest.ir_digest:  # pragma: no cover - both canonical
                raise RuntimeError("IR digest mismatch")
            skipped = SkippedRecords()
            if malformed and parsed.spec.inputs.malformed_policy == "skip":
                listed = [m.model_dump(mode="json", exclude_none=True) for m in malformed]
                skipped = SkippedRecords(count=len(malformed), digest=store.put_json(listed))
            return self._compiled(
                inp,
                ir,
                ir_digest,
                manifest_digest,
                report_digest,
                job_yaml_digest,
                file_digests,
                skipped,
            )

    def _compile_job(
        self, inp: CompileInput, config: MrpConfig, progress: ScanProgress | None
    ) -> tuple[ParsedJob, CompileResult, dict[str, str], list[MalformedRecord]]:
        """Parse the job, check its refs and sink, resolve its input files and compile it:
        the parsed job, the compile result, the input files' digests and the malformed
        records found (errors become compile errors)."""
        with compile_errors():
            from keel.mrp.compiler import compile_parsed
            from keel.mrp.dsl import parse_job

            parsed = parse_job(inp.job_yaml, inp.source)
            config.check_refs(parsed.spec.operator_refs().values())
            check_job_sink(self._settings, parsed, config.caps, inp.run_id)
            resolved: list[FileRef] | None = None
            slices: list[RecordSlice] | None = None
            file_digests: dict[str, str] = {}
            malformed: list[MalformedRecord] = []
            if parsed.spec.inputs.files is not None:
                refuse_input_sources(parsed, config.caps)
                inputs = resolve_job_inputs(
                    parsed, inp.base_dir, self._settings, config, self.store, progress
                )
                resolved, file_digests = inputs.files, inputs.file_digests
                slices, malformed = inputs.slices, inputs.malformed
            # What config.compile_job does, without parsing the job file a second time
            # (refs were checked above).
            result = compile_parsed(
                parsed,
                config.registry,
                config.caps,
                resolved_files=resolved,
                record_slices=slices,
            )
        return parsed, result, file_digests, malformed

    def _compiled(
        self,
        inp: CompileInput,
        ir: JobIR,
        ir_digest: str,
        manifest_digest: str,
        report_digest: str,
        job_yaml_digest: str,
        file_digests: dict[str, str],
        skipped: SkippedRecords,
    ) -> CompiledJob:
        output_root = _output_root(self._settings, ir.job_id, inp.run_id)
        try:
            self._start_run(
                inp, ir, ir_digest, manifest_digest, report_digest, job_yaml_digest, output_root
            )
        except RunIdTaken as e:
            raise compile_error(str(e), kind="run_id") from None
        return CompiledJob(
            run_id=inp.run_id,
            job_id=ir.job_id,
            ir_digest=ir_digest,
            manifest_digest=manifest_digest,
            policy_report_digest=report_digest,
            job_yaml_digest=job_yaml_digest,
            shard_count=len(ir.map_tasks),
            limits=ir.limits,
            budget=ir.budget,
            evaluate=ir.evaluate,
            approval=ir.approval,
            sink=ir.produce.sink,
            output_root=str(output_root),
            input_files_digest=self.store.put_json(file_digests) if file_digests else None,
            replay_of=inp.replay_of,
            map_operator=ir.operators["map"].ref,
            skipped_records=skipped.count,
            skipped_records_digest=skipped.digest,
            backend_cpus=backend_cpus(inp.backend, self.config().caps.max_workers),
        )

    def _start_run(
        self,
        inp: CompileInput,
        ir: JobIR,
        ir_digest: str,
        manifest_digest: str,
        report_digest: str,
        job_yaml_digest: str,
        output_root: Path,
    ) -> None:
        start_run(
            self.sessions,
            run_id=inp.run_id,
            workflow_id=inp.workflow_id,
            job_id=ir.job_id,
            backend=inp.backend,
            replay_of=inp.replay_of,
            ir_digest=ir_digest,
            manifest_digest=manifest_digest,
            policy_report_digest=report_digest,
            job_yaml_digest=job_yaml_digest,
            shard_count=len(ir.map_tasks),
            output_root=str(output_root),
        )

    def _load_replay(self, inp: CompileInput) -> CompiledJob:
        """A replay runs the original run's stored IR on its stored inputs."""
        from keel.mrp.ir import manifest_from_json, verify_manifest

        assert inp.replay_of is not None
        store = self.store
        original = get_run(self.sessions, inp.replay_of)
        if original is None or original.ir_digest is None or original.manifest_digest is None:
            raise ApplicationError(
                f"cannot replay run {inp.replay_of}: no such run with a stored IR",
                type=ERROR_REPLAY_SOURCE,
                non_retryable=True,
            )
        if original.run_manifest_digest is None:
            raise ApplicationError(
                f"cannot replay run {inp.replay_of}: it has not finished (status "
                f"{original.status})",
                type=ERROR_REPLAY_SOURCE,
                non_retryable=True,
            )
        ir = ir_from_json(store.get_bytes(original.ir_digest))
        manifest = manifest_from_json(store.get_bytes(original.manifest_digest))
        try:
            verify_manifest(ir, manifest)
        except ValueError as e:
            raise ApplicationError(
                f"cannot replay run {inp.replay_of}: {e}",
                type=ERROR_REPLAY_SOURCE,
                non_retryable=True,
            ) from None
        config = self.config()
        for role in ir.operators:
            phase_handle(config, ir, role)  # refuses operators whose code changed since
        missing = sorted(d for d in ir.stored_inputs() if not store.exists(d))
        if missing:
            raise ApplicationError(
                f"cannot replay run {inp.replay_of}: shard inputs missing from the store "
                f"({len(missing)} objects, first: {missing[0]})",
                type=ERROR_REPLAY_SOURCE,
                non_retryable=True,
            )
        run_manifest = run_manifest_from_json(store.get_bytes(original.run_manifest_digest))
        return self._compiled(
            inp,
            ir,
            original.ir_digest,
            original.manifest_digest,
            original.policy_report_digest or run_manifest.policy_report_digest,
            original.job_yaml_digest or run_manifest.job_yaml_digest,
            dict(run_manifest.input_file_digests),
            SkippedRecords(
                count=run_manifest.skipped_record_count,
                digest=run_manifest.skipped_records_digest,
            ),
        )

    # -- map -------------------------------------------------------------------------------

    @activity.defn(name=steps.MAP_WINDOW.name)
    async def map_window(self, inp: MapWindowInput) -> MapWindowResult:
        """Run shards ``[start, end)``; see the module docstring."""
        with span(
            "mrp.map_window",
            run_id=inp.run_id,
            start=inp.start,
            end=inp.end,
            backend=inp.backend,
            attempt=activity.info().attempt,
        ) as current:
            result = await MapWindow(self, inp).run()
            current.set_attribute("shards.run", result.counters.run)
            current.set_attribute("shards.skipped", result.counters.skipped)
            current.set_attribute("shards.retried", result.counters.retried)
            return result

    # -- reduce, evaluate, produce ---------------------------------------------------------

    def _ctx(
        self,
        ir: JobIR,
        role: str,
        seed: int,
        inp: PhaseInput,
        handle: OperatorHandle,
        call_logs: list[LLMCallLog],
    ) -> tuple[OperatorContext, LLMCallStats]:
        llm = llm_client_for(
            handle.spec,
            self._settings,
            replay_only=inp.llm_replay_only,
            default_model=self._llm_model,
            workflow_id=inp.workflow_id,
        )
        stats = call_stats(llm)
        # The records outlive a failing operator: the async activity writes them either way.
        stats.logs = call_logs
        ctx = OperatorContext(
            params=dict(ir.operators[role].params),
            seed=seed,
            llm=llm,
            file_reader=file_reader(self.store),
            operator=handle.spec.ref,
            failed_shards=self._failed_shards(ir, inp.run_id),
        )
        return ctx, stats

    def _failed_shards(self, ir: JobIR, run_id: str) -> list[dict[str, JsonValue]]:
        """The shards of a run that went on without them (``min_success_ratio``), with
        their errors, in shard order; empty for every other run."""
        if ir.limits.min_success_ratio is None:
            return []
        return [
            {
                "shard_id": r.shard_id,
                "shard_index": r.shard_index,
                "attempts": r.attempts,
                "error": r.error or "",
            }
            for r in list_shards(self.sessions, run_id, state="failed")
        ]

    @property
    def llm_gateway(self) -> LLMGateway:
        """The gateway MRP's model calls are recorded through (``llm_calls``, metrics)."""
        if self._llm_gateway is None:
            models = load_models_config(self._settings.models_config)
            self._llm_gateway = LLMGateway(models, on_call=sql_recorder(self.sessions))
        return self._llm_gateway

    async def record_llm_calls(self, logs: list[LLMCallLog]) -> None:
        """Record model calls made by operators of this activity's run."""
        if logs:
            await record_calls(self.llm_gateway, logs, activity.metric_meter())

    async def _in_thread_recording_calls(
        self, phase: Callable[[_In, list[LLMCallLog]], _Out], inp: _In
    ) -> _Out:
        """Run a phase off the event loop; its operators' model calls are recorded even
        when it fails (they were made, and paid for)."""
        call_logs: list[LLMCallLog] = []
        try:
            return await asyncio.to_thread(phase, inp, call_logs)
        finally:
            await self.record_llm_calls(call_logs)

    @activity.defn(name=steps.REDUCE.name)
    async def reduce(self, inp: PhaseInput) -> ReduceResult:
        """Reduce every shard output of this run, in shard order, streamed from the store
        to the reducer's host (``activities/mrp/reducing.py``)."""
        return await self._in_thread_recording_calls(self._reduce, inp)

    def _reduce(self, inp: PhaseInput, call_logs: list[LLMCallLog]) -> ReduceResult:
        with span("mrp.reduce", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            handle = phase_handle(self.config(), ir, "reduce")
            # Each output's digest and where its bytes lie (alone, or in a window's pack).
            by_index = shard_outputs(self.sessions, inp.run_id)
            total = len(ir.map_tasks)
            try:
                if ir.limits.min_success_ratio is not None and len(by_index) < total:
                    # min_success_ratio: the shards that succeeded, in shard order, exactly
                    # what a run of only those shards would reduce.
                    if not ir.limits.enough_succeeded(len(by_index), total):
                        raise ValueError(
                            f"{len(by_index)} of {total} shards have an output, under "
                            f"min_success_ratio {ir.limits.min_success_ratio}"
                        )
                    if any(not 0 <= i < total for i in by_index):
                        raise ValueError("a shard output outside the job's shards")
                    outputs = [by_index[i] for i in sorted(by_index)]
                else:
                    outputs = in_shard_order(by_index, total)
            except ValueError as e:
                raise ApplicationError(
                    f"cannot reduce run {inp.run_id}: {e}", type=ERROR_PHASE, non_retryable=True
                ) from None
            ctx, llm = self._ctx(ir, "reduce", ir.reduce.seed, inp, handle, call_logs)
            # The outputs stream to the host as the reducer reads them (reducing.py).
            with operator_errors(), OutputStream(store, outputs) as stream:
                reduced = run_in_host(OperatorKind.REDUCE, handle, None, ctx, outputs=stream)
            return ReduceResult(
                reduce_digest=store.put_json(reduced),
                cost_units=handle.spec.cost_weight + ctx.charged_units,
                cost_usd=llm.cost_usd,
            )

    @activity.defn(name=steps.EVALUATE.name)
    async def evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        """Score the reduced value with the job's evaluator."""
        return await self._in_thread_recording_calls(self._evaluate, inp)

    def _evaluate(self, inp: EvaluateInput, call_logs: list[LLMCallLog]) -> EvaluateResult:
        with span("mrp.evaluate", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            assert ir.evaluate is not None
            handle = phase_handle(self.config(), ir, "evaluate")
            reduced = store.get_json(inp.reduce_digest)
            ctx, llm = self._ctx(ir, "evaluate", ir.evaluate.seed, inp, handle, call_logs)
            with operator_errors():
                ev = run_in_host(OperatorKind.EVALUATE, handle, reduced, ctx)
            digest = store.put_json(ev.model_dump(mode="json"))
            return EvaluateResult(
                evaluation=EvaluationRecord(
                    score=ev.score,
                    min_score=ir.evaluate.min_score,
                    passed=ev.score >= ir.evaluate.min_score,
                    reasons=list(ev.reasons),
                    digest=digest,
                ),
                cost_units=handle.spec.cost_weight + ctx.charged_units,
                cost_usd=llm.cost_usd,
            )

    @activity.defn(name=steps.PRODUCE.name)
    async def produce(self, inp: ProduceInput) -> ProduceOutput:
        """Write the reduced value to the sink under the run's output root."""
        return await self._in_thread_recording_calls(self._produce, inp)

    def _produce(self, inp: ProduceInput, call_logs: list[LLMCallLog]) -> ProduceOutput:
        with span("mrp.produce", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            sink = ir.produce.sink
            problem = destination_problem(sink.destination)
            if problem is not None:  # compile refuses these (MRP-P016); an old IR may not
                raise ApplicationError(problem, type=ERROR_PHASE, non_retryable=True)
            handle = phase_handle(self.config(), ir, "produce")
            reduced = store.get_json(inp.reduce_digest)
            out_dir = Path(inp.output_root)
            ctx, llm = self._ctx(ir, "produce", ir.produce.seed, inp, handle, call_logs)
            with operator_errors():
                result = run_in_host(
                    OperatorKind.PRODUCE, handle, reduced, ctx, sink=sink, out_dir=out_dir
                )
            files = []
            for f in sorted(result.files, key=lambda f: f.path):
                data = (out_dir / f.path).read_bytes()  # the SDK checked; record what is there
                files.append(
                    ProducedFileRecord(path=f.path, digest=digest_bytes(data), size=len(data))
                )
            if URI_RE.match(sink.destination):
                # Staged under the output root; uploaded where the sink says (idempotent).
                try:
                    files = upload_to_s3(
                        self._settings, sink.destination, out_dir, files, inp.run_id
                    )
                except SinkWriteError as e:
                    raise ApplicationError(
                        str(e), type=ERROR_PHASE, non_retryable=not e.retryable
                    ) from None
            return ProduceOutput(
                files=files,
                produce_result_digest=store.put_json(result.model_dump(mode="json")),
                rows=result.rows,
                cost_units=handle.spec.cost_weight + ctx.charged_units,
                cost_usd=llm.cost_usd,
            )

    # -- finalise --------------------------------------------------------------------------

    @activity.defn(name=steps.FINALISE.name)
    async def finalise(self, inp: FinaliseInput) -> FinaliseResult:
        """Store the run manifest, record the run, compare a replay with its original."""
        return await asyncio.to_thread(self._finalise, inp)

    def _finalise(self, inp: FinaliseInput) -> FinaliseResult:
        with span("mrp.finalise", run_id=inp.compiled.run_id, status=inp.status):
            store = self.store
            c = inp.compiled
            ir = load_ir(store, c.ir_digest)
            if not c.replay_of:  # a replay neither reads nor writes checkpoints
                index_run_checkpoints(self.sessions, c.run_id, ir.operators["map"].operator_digest)
            shards = self._shard_outputs(ir, c.run_id)
            counters = inp.counters.model_copy()
            counters.total = len(ir.map_tasks)
            counters.cancelled = sum(1 for s in shards if s.state == "cancelled")
            skipped: list[MalformedRecord] = []
            if c.skipped_records_digest is not None:
                listed = store.get_json(c.skipped_records_digest)
                assert isinstance(listed, list)
                skipped = [MalformedRecord.model_validate(m) for m in listed[:MAX_LISTED_SKIPPED]]
            manifest = RunManifest(
                run_id=c.run_id,
                job_id=c.job_id,
                workflow_id=inp.workflow_id,
                status=inp.status,
                partial=inp.partial,
                backend=inp.backend,
                replay_of=c.replay_of,
                ir_digest=c.ir_digest,
                manifest_digest=c.manifest_digest,
                policy_report_digest=c.policy_report_digest,
                job_yaml_digest=c.job_yaml_digest,
                input_file_digests=self._input_files(c),
                shards=shards,
                skipped_record_count=c.skipped_records,
                skipped_records=skipped,
                skipped_records_digest=c.skipped_records_digest,
                reduce_digest=inp.reduce_digest,
                evaluation=inp.evaluation,
                output_root=c.output_root if inp.produced else None,
                sink_destination=c.sink.destination,
                produced=list(inp.produced),
                produce_result_digest=inp.produce_result_digest,
                counters=counters,
                cost=inp.cost,
                phase_timings=dict(inp.phase_timings),
                error=inp.error,
            )
            digest = store.put_bytes(manifest.to_json())
            finish_run(self.sessions, manifest, digest)
            mismatch = None
            if c.replay_of:
                mismatch = self._compare(c.replay_of, manifest, ir)
            _meter_run(inp)
            return FinaliseResult(
                run_manifest_digest=digest,
                output_digests=manifest.output_digests(),
                counters=counters,
                mismatch=mismatch,
            )

    def _input_files(self, c: CompiledJob) -> dict[str, str]:
        """The run's input files' digests: stored (``input_files_digest``), or inline in a
        compile result recorded before they were stored."""
        if c.input_files_digest is None:
            return dict(c.input_file_digests)
        files = self.store.get_json(c.input_files_digest)
        assert isinstance(files, dict)
        return {str(k): str(v) for k, v in files.items()}

    def _shard_outputs(self, ir: JobIR, run_id: str) -> list[ShardOutputRecord]:
        """Every map task's outcome as recorded for the run (``cancelled`` when it has no
        record). Built without validation (``model_construct``): every value comes from
        the IR or from rows this run wrote, and a run manifest lists every shard."""
        rows = shard_outcomes(self.sessions, run_id)
        shards: list[ShardOutputRecord] = []
        make = ShardOutputRecord.model_construct
        for t in ir.map_tasks:
            row = rows.get(t.shard_index)
            state: ShardState = "cancelled"
            if row is not None:
                state = (
                    "failed"
                    if row.state == "failed"
                    else ("skipped" if row.source == "checkpoint" else "succeeded")
                )
            shards.append(
                make(
                    shard_index=t.shard_index,
                    shard_id=t.shard_id,
                    input_digest=t.input_digest,
                    checkpoint_key=t.checkpoint_key,
                    output_digest=row.output_digest if row is not None else None,
                    state=state,
                    attempts=row.attempts if row is not None else 0,
                    error=row.error if row is not None and state == "failed" else None,
                )
            )
        return shards

    def _compare(
        self, original_run: str, replayed: RunManifest, ir: JobIR
    ) -> ReplayMismatch | None:
        run = get_run(self.sessions, original_run)
        if run is None or run.run_manifest_digest is None:
            return ReplayMismatch(where="run", expected=original_run, got=None)
        original = run_manifest_from_json(self.store.get_bytes(run.run_manifest_digest))
        order = [t.shard_id for t in ir.map_tasks]
        return first_mismatch(original.comparable_digests(), replayed.comparable_digests(), order)


def _meter_run(inp: FinaliseInput) -> None:
    """Count the finished run by status and record its cost (and budget use) metrics."""
    attrs = {"job_id": inp.compiled.job_id, "status": inp.status}
    meter_add("keel_mrp_jobs", "MRP runs by status", 1, attrs)
    meter_hist("keel_mrp_job_cost_units", "MRP run cost", "units", float(inp.cost.units), attrs)
    meter_hist("keel_mrp_job_cost_usd", "MRP run LLM cost", "usd", float(inp.cost.usd), attrs)
    if inp.cost.limit_units > 0:
        meter_hist(
            "keel_mrp_budget_used_ratio",
            "MRP run spend / kill limit (units)",
            "1",
            float(inp.cost.units / inp.cost.limit_units),
            attrs,
        )


__all__ = [
    "CompileInput",
    "CompiledJob",
    "EvaluateInput",
    "EvaluateResult",
    "FinaliseInput",
    "FinaliseResult",
    "MapWindowInput",
    "MapWindowResult",
    "MrpActivities",
    "PhaseInput",
    "ProduceInput",
    "ProduceOutput",
    "ReduceResult",
]
