"""The ``MRPJob`` activities: compile, map windows, reduce, evaluate, produce, finalise.

Only digests cross into workflow history: the IR, shard inputs and outputs, reduced value,
evaluation and run manifest live in the artifact store; per-shard status and the checkpoint
index live in SQL (``store/mrp_runs.py``).

- ``mrp.compile``: parse and admit the job against ``configs/mrp.yaml`` (operators whose
  code no longer matches their pin are refused), resolve ``inputs.files`` under
  ``base_dir`` and store their bytes, store every shard input, ``IR.json``,
  ``manifest.json``, the policy report and the job file; record the run. For a replay,
  load the original run's IR instead. Failures are non-retryable
  ``ApplicationError(type="MrpCompileError")`` naming the rule or operator.
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
import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from pathlib import Path
from typing import Any

from opentelemetry import trace
from pydantic import JsonValue
from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.mrp_backends import (
    MAX_BATCH,
    PIPELINE_DEPTH,
    AttemptTimeout,
    RayBackend,
    RaySession,
    ShardAttempt,
    ShardContext,
    ShardItem,
    ShardNotStarted,
    ShardTask,
    get_backend,
    llm_client_for,
    store_for,
)
from keel.digest import digest_bytes, digest_json
from keel.mrp.errors import (
    DslError,
    InputsRefused,
    MrpError,
    PolicyViolation,
    RegistryError,
)
from keel.mrp.ir import (
    JobIR,
    MapTask,
    ir_from_json,
)
from keel.mrp.ir import checkpoint_key as make_checkpoint_key
from keel.mrp.normalize import FileRef, glob_regex, in_shard_order
from keel.mrp.operators_io import (
    OPERATOR_FILE,
    MrpConfig,
    OperatorHandle,
    OperatorRefused,
    code_digest,
    load_mrp_config,
    read_config_file,
    resolve_config_path,
)
from keel.mrp.run import (
    ERROR_COMPILE,
    ERROR_PHASE,
    ERROR_REPLAY_SOURCE,
    ERROR_SHARD,
    EvaluationRecord,
    ProducedFileRecord,
    ReplayMismatch,
    RunManifest,
    ShardCounters,
    ShardOutputRecord,
    ShardRecord,
    first_mismatch,
    run_manifest_from_json,
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
from keel.settings import Settings
from store.artifacts import ArtifactStore
from store.db import get_sessionmaker
from store.mrp_runs import (
    RunIdTaken,
    finish_run,
    get_run,
    list_shards,
    lookup_checkpoints,
    record_shards,
    shards_with_output,
    start_run,
)

log = logging.getLogger(__name__)
tracer = trace.get_tracer("keel.mrp")

# Shard records are buffered and written in one transaction at most this often (and when
# FLUSH_MAX are waiting, and at the window's end); each flush is followed by a heartbeat.
FLUSH_EVERY_S = 0.25
FLUSH_MAX = 64
# Backoff between attempts of one shard: 0.2 s, 0.4 s, ... at most 5 s.
RETRY_BACKOFF_S = 0.2
RETRY_BACKOFF_MAX_S = 5.0


# ---------------------------------------------------------------------------------------
# Helpers


def _output_root(settings: Settings, job_id: str, run_id: str) -> Path:
    """Where produce writes: ``<data dir>/mrp/output/<job_id>/<run_id>``."""
    return (settings.data_dir / "mrp" / "output" / job_id / _safe(run_id)).resolve()


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "_"


@contextlib.contextmanager
def _span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    clean = {k: v for k, v in attributes.items() if isinstance(v, str | int | float | bool)}
    with tracer.start_as_current_span(name, attributes=clean) as span:
        yield span


def _compile_error(message: str, **details: Any) -> ApplicationError:
    return ApplicationError(message, details, type=ERROR_COMPILE, non_retryable=True)


def input_root(base_dir: str, roots: list[Path]) -> Path:
    """The folder ``inputs.files`` resolve under, resolved (links too); ``InputsRefused``
    when there is none or it is not allowed.

    An empty or relative ``base_dir`` would mean the worker's own working directory, which
    holds its checkout, ``.venv`` and secrets: a job must name its folder. With
    ``KEEL_MRP_JOB_ROOTS`` set on the worker, the folder must lie inside one of them, so a
    run started around the API (``temporal workflow start``) is held to the same roots.
    """
    if not base_dir:
        raise InputsRefused(
            "inputs.files names files but the run has no base_dir: a job that reads files "
            "must say where they are (POST /mrp/jobs: base_dir inside KEEL_MRP_JOB_ROOTS, "
            "or a job file by path)"
        )
    raw = Path(base_dir)
    if not raw.is_absolute():
        raise InputsRefused(f"base_dir {base_dir!r} must be an absolute path")
    base = raw.resolve()
    if not base.is_dir():
        raise InputsRefused(f"base_dir {base_dir!r} is not a folder")
    resolved_roots = [r.resolve() for r in roots]
    if resolved_roots and not any(base == r or base.is_relative_to(r) for r in resolved_roots):
        raise InputsRefused(f"base_dir {base_dir!r} is outside KEEL_MRP_JOB_ROOTS")
    return base


def _literal_dirs(pattern: str) -> tuple[str, ...]:
    """The folders a pattern names before its first glob segment (where a walk can stay)."""
    parts = pattern.split("/")[:-1]
    out: list[str] = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        out.append(part)
    return tuple(out)


def _resolve_files(
    patterns: list[str], base_dir: Path, store: ArtifactStore, *, max_items: int | None = None
) -> tuple[list[FileRef], dict[str, str]]:
    """List files under ``base_dir`` matching ``patterns`` (the compiler's glob rules), store
    their bytes, and return their refs and ``{path: digest}``.

    The walk never leaves ``base_dir``: patterns with ``..`` or absolute ones are refused,
    linked folders are not entered, and a matching file that is a link out of ``base_dir``
    refuses the job. It stops at the ``max_items + 1``-th match (``InputsRefused``), so a
    glob over a huge tree costs what the cap allows, not the tree's size.
    """
    for p in patterns:
        parts = p.split("/")
        if p.startswith("/") or "\\" in p or ".." in parts:
            raise InputsRefused(f"inputs.files pattern {p!r} must stay inside base_dir")
    regexes = [glob_regex(p) for p in patterns]
    prefixes = [_literal_dirs(p) for p in patterns]
    base = base_dir.resolve()
    refs: list[FileRef] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath).relative_to(base).parts
        # Enter only folders some pattern can reach: ``data/*.txt`` never walks ``.venv``.
        dirnames[:] = sorted(
            d
            for d in dirnames
            if any((*here, d)[: len(pre)] == pre[: len(here) + 1] for pre in prefixes)
        )
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(base).as_posix()
            if not any(rx.match(rel) for rx in regexes):
                continue
            real = full.resolve()
            if not real.is_relative_to(base):
                raise InputsRefused(f"inputs.files: {rel!r} is a link out of base_dir")
            if not real.is_file():
                continue
            if max_items is not None and len(refs) >= max_items:
                raise InputsRefused(
                    f"inputs.files match more than {max_items} files, the most the shard "
                    "cap allows (MRP-P005); listing stopped there"
                )
            data = real.read_bytes()
            digest = store.put_bytes(data)
            refs.append(FileRef(path=rel, digest=digest, size_bytes=len(data)))
    refs.sort(key=lambda r: r.path)
    return refs, {r.path: r.digest for r in refs}


def _config_fingerprint(settings: Settings) -> str:
    """A digest of everything :func:`load_mrp_config` reads: the config file's bytes, and
    for each operator on its search path the ``operator.yaml`` bytes and the code digest
    (the same hash the pin check uses), plus the environment (the prod key check)."""
    path = resolve_config_path(settings)
    cfg = read_config_file(path)
    base = path.resolve().parent
    parts: list[str] = [settings.env, str(path.resolve()), digest_bytes(path.read_bytes())]
    for rel in cfg.operator_paths:
        for yaml_path in sorted((base / rel).resolve().glob(f"*/{OPERATOR_FILE}")):
            parts += [
                str(yaml_path),
                digest_bytes(yaml_path.read_bytes()),
                code_digest(yaml_path.parent),
            ]
    return digest_json(parts)


_ir_cache: dict[str, JobIR] = {}


def load_ir(store: ArtifactStore, digest: str) -> JobIR:
    """The IR stored under ``digest`` (a few parsed IRs are kept per process)."""
    ir = _ir_cache.get(digest)
    if ir is None:
        ir = ir_from_json(store.get_bytes(digest))
        if len(_ir_cache) >= 8:
            _ir_cache.pop(next(iter(_ir_cache)))
        _ir_cache[digest] = ir
    return ir


def _handle(config: MrpConfig, ir: JobIR, role: str) -> OperatorHandle:
    """The operator of ``role``, refused unless its code is the code the IR was compiled
    with (a changed operator mid-run or since the original run fails here)."""
    binding = ir.operators[role]
    try:
        handle = config.handle(binding.ref)
    except RegistryError as e:
        raise ApplicationError(
            f"{role} operator {binding.ref} is refused: {e}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        ) from None
    if handle.spec.code_digest != binding.code_digest:
        raise ApplicationError(
            f"{role} operator {binding.ref}: its code is now {handle.spec.code_digest}, "
            f"but this run was compiled with {binding.code_digest}",
            {"operator": binding.ref},
            type=ERROR_COMPILE,
            non_retryable=True,
        )
    return handle


def _meter_add(name: str, description: str, value: int, attrs: dict[str, str]) -> None:
    with contextlib.suppress(Exception):  # metrics never fail an activity
        activity.metric_meter().create_counter(name, description).add(value, attrs)


def _meter_hist(
    name: str, description: str, unit: str, value: float, attrs: dict[str, str]
) -> None:
    with contextlib.suppress(Exception):
        activity.metric_meter().create_histogram_float(name, description, unit).record(value, attrs)


# ---------------------------------------------------------------------------------------
# Activities


@contextlib.contextmanager
def _operator_errors() -> Iterator[None]:
    """An operator's failure becomes the phase's ``ApplicationError``, retryable when the
    operator says so (reduce, evaluate and produce report it the same way)."""
    from keel.mrp.sdk import OperatorError

    try:
        yield
    except OperatorError as e:
        raise ApplicationError(str(e), type=ERROR_PHASE, non_retryable=not e.retryable) from None


class MrpActivities:
    """The MRP activities, bound to the worker's settings."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._sessions: sessionmaker[Session] | None = None
        self._llm_model = ""
        self._config_cache: tuple[str, MrpConfig] | None = None

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
            fingerprint = _config_fingerprint(self._settings)
            cached = self._config_cache
            if cached is not None and cached[0] == fingerprint:
                config = cached[1]
            else:
                config = load_mrp_config(self._settings)
                self._config_cache = (fingerprint, config)
        except MrpError as e:
            raise _compile_error(str(e), kind="config") from None
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

    @activity.defn(name="mrp.compile")
    async def compile(self, inp: CompileInput) -> CompiledJob:
        """Compile (or, for a replay, load) the job and store everything it needs."""
        return await asyncio.to_thread(self._compile, inp)

    def _compile(self, inp: CompileInput) -> CompiledJob:
        with _span("mrp.compile", run_id=inp.run_id, replay=bool(inp.replay_of)):
            if inp.replay_of:
                return self._load_replay(inp)
            store = self.store
            config = self.config()
            job_yaml_digest = store.put_bytes(inp.job_yaml.encode("utf-8"))
            try:
                from keel.mrp.compiler import compile_parsed
                from keel.mrp.dsl import parse_job

                parsed = parse_job(inp.job_yaml, inp.source)
                config.check_refs(parsed.spec.operator_refs().values())
                resolved: list[FileRef] | None = None
                file_digests: dict[str, str] = {}
                if parsed.spec.inputs.files is not None:
                    base = input_root(inp.base_dir, self._settings.mrp_job_roots)
                    resolved, file_digests = _resolve_files(
                        list(parsed.spec.inputs.files),
                        base,
                        store,
                        max_items=config.caps.max_shards * parsed.spec.inputs.items_per_shard,
                    )
                # What config.compile_job does, without parsing the job file a second time
                # (refs were checked above).
                result = compile_parsed(
                    parsed, config.registry, config.caps, resolved_files=resolved
                )
            except OperatorRefused as e:
                raise _compile_error(
                    str(e), kind="operator", operator=e.operator, reason=e.reason
                ) from None
            except PolicyViolation as e:
                raise _compile_error(str(e), kind="policy", rules=e.rule_ids) from None
            except DslError as e:
                raise _compile_error(
                    str(e), kind="dsl", issues=[i.model_dump() for i in e.issues]
                ) from None
            except InputsRefused as e:
                raise _compile_error(str(e), kind="inputs") from None
            except RegistryError as e:
                raise _compile_error(str(e), kind="registry") from None
            except MrpError as e:
                raise _compile_error(str(e), kind="mrp") from None
            ir = result.ir
            # Shard payloads go to the store under their digests (the IR names them).
            payloads = list(result.shard_inputs.items())
            with ThreadPoolExecutor(max_workers=8) as pool:
                stored = list(pool.map(lambda kv: store.put_json(kv[1].canonical()), payloads))
            for (digest, _), got in zip(payloads, stored, strict=True):
                if digest != got:  # pragma: no cover - the compiler digests canonical()
                    raise RuntimeError(f"shard input stored as {got}, expected {digest}")
            ir_digest = store.put_bytes(result.ir_json())
            manifest_digest = store.put_bytes(result.manifest_json())
            report_digest = store.put_bytes(result.policy_report_json())
            if ir_digest != ir.digest():  # pragma: no cover - both are canonical JSON
                raise RuntimeError("IR digest mismatch")
            return self._compiled(
                inp, ir, ir_digest, manifest_digest, report_digest, job_yaml_digest, file_digests
            )

    def _compiled(
        self,
        inp: CompileInput,
        ir: JobIR,
        ir_digest: str,
        manifest_digest: str,
        report_digest: str,
        job_yaml_digest: str,
        file_digests: dict[str, str],
    ) -> CompiledJob:
        output_root = _output_root(self._settings, ir.job_id, inp.run_id)
        try:
            self._start_run(
                inp, ir, ir_digest, manifest_digest, report_digest, job_yaml_digest, output_root
            )
        except RunIdTaken as e:
            raise _compile_error(str(e), kind="run_id") from None
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
            input_file_digests=file_digests,
            replay_of=inp.replay_of,
            map_operator=ir.operators["map"].ref,
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
            _handle(config, ir, role)  # refuses operators whose code changed since
        missing = [t.shard_id for t in ir.map_tasks if not store.exists(t.input_digest)]
        if missing:
            raise ApplicationError(
                f"cannot replay run {inp.replay_of}: shard inputs missing from the store "
                f"(first: {missing[0]})",
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
        )

    # -- map -------------------------------------------------------------------------------

    @activity.defn(name="mrp.map_window")
    async def map_window(self, inp: MapWindowInput) -> MapWindowResult:
        """Run shards ``[start, end)``; see the module docstring."""
        with _span(
            "mrp.map_window",
            run_id=inp.run_id,
            start=inp.start,
            end=inp.end,
            backend=inp.backend,
            attempt=activity.info().attempt,
        ) as span:
            result = await _Window(self, inp).run()
            span.set_attribute("shards.run", result.counters.run)
            span.set_attribute("shards.skipped", result.counters.skipped)
            span.set_attribute("shards.retried", result.counters.retried)
            return result

    # -- reduce, evaluate, produce ---------------------------------------------------------

    def _ctx(self, ir: JobIR, role: str, seed: int, inp: PhaseInput, handle: OperatorHandle) -> Any:
        from activities.mrp_backends import MeteredLLM, file_reader
        from keel.mrp.sdk import OperatorContext

        llm = MeteredLLM(
            llm_client_for(
                handle.spec,
                self._settings,
                replay_only=inp.llm_replay_only,
                default_model=self._llm_model,
            )
        )
        ctx = OperatorContext(
            params=dict(ir.operators[role].params),
            seed=seed,
            llm=llm,
            file_reader=file_reader(self.store),
            operator=handle.spec.ref,
        )
        return ctx, llm

    @activity.defn(name="mrp.reduce")
    async def reduce(self, inp: PhaseInput) -> ReduceResult:
        """Reduce every shard output of this run, in shard order."""
        return await asyncio.to_thread(self._reduce, inp)

    def _reduce(self, inp: PhaseInput) -> ReduceResult:
        from keel.mrp.sdk import invoke_reduce

        with _span("mrp.reduce", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            handle = _handle(self.config(), ir, "reduce")
            rows = shards_with_output(self.sessions, inp.run_id)
            by_index = {i: r.output_digest for i, r in rows.items() if r.output_digest}
            try:
                digests = in_shard_order(by_index, len(ir.map_tasks))
            except ValueError as e:
                raise ApplicationError(
                    f"cannot reduce run {inp.run_id}: {e}", type=ERROR_PHASE, non_retryable=True
                ) from None
            with ThreadPoolExecutor(max_workers=8) as pool:
                outputs: list[JsonValue] = list(pool.map(store.get_json, digests))
            ctx, llm = self._ctx(ir, "reduce", ir.reduce.seed, inp, handle)
            with _operator_errors():
                reduced = invoke_reduce(handle.spec, handle.load(), outputs, ctx)
            return ReduceResult(
                reduce_digest=store.put_json(reduced),
                cost_units=handle.spec.cost_weight + ctx.charged_units,
                cost_usd=llm.usd,
            )

    @activity.defn(name="mrp.evaluate")
    async def evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        """Score the reduced value with the job's evaluator."""
        return await asyncio.to_thread(self._evaluate, inp)

    def _evaluate(self, inp: EvaluateInput) -> EvaluateResult:
        from keel.mrp.sdk import invoke_evaluate

        with _span("mrp.evaluate", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            assert ir.evaluate is not None
            handle = _handle(self.config(), ir, "evaluate")
            reduced = store.get_json(inp.reduce_digest)
            ctx, llm = self._ctx(ir, "evaluate", ir.evaluate.seed, inp, handle)
            with _operator_errors():
                ev = invoke_evaluate(handle.spec, handle.load(), reduced, ctx)
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
                cost_usd=llm.usd,
            )

    @activity.defn(name="mrp.produce")
    async def produce(self, inp: ProduceInput) -> ProduceOutput:
        """Write the reduced value to the sink under the run's output root."""
        return await asyncio.to_thread(self._produce, inp)

    def _produce(self, inp: ProduceInput) -> ProduceOutput:
        from keel.mrp.sdk import invoke_produce

        with _span("mrp.produce", run_id=inp.run_id):
            store = self.store
            ir = load_ir(store, inp.ir_digest)
            sink = ir.produce.sink
            if "://" in sink.destination:
                raise ApplicationError(
                    f"sink destination {sink.destination}: this runtime writes relative "
                    "destinations under the run's output root only",
                    type=ERROR_PHASE,
                    non_retryable=True,
                )
            handle = _handle(self.config(), ir, "produce")
            reduced = store.get_json(inp.reduce_digest)
            out_dir = Path(inp.output_root)
            ctx, llm = self._ctx(ir, "produce", ir.produce.seed, inp, handle)
            with _operator_errors():
                result = invoke_produce(handle.spec, handle.load(), reduced, sink, out_dir, ctx)
            files = []
            for f in sorted(result.files, key=lambda f: f.path):
                data = (out_dir / f.path).read_bytes()  # the SDK checked; record what is there
                files.append(
                    ProducedFileRecord(path=f.path, digest=digest_bytes(data), size=len(data))
                )
            return ProduceOutput(
                files=files,
                produce_result_digest=store.put_json(result.model_dump(mode="json")),
                rows=result.rows,
                cost_units=handle.spec.cost_weight + ctx.charged_units,
                cost_usd=llm.usd,
            )

    # -- finalise --------------------------------------------------------------------------

    @activity.defn(name="mrp.finalise")
    async def finalise(self, inp: FinaliseInput) -> FinaliseResult:
        """Store the run manifest, record the run, compare a replay with its original."""
        return await asyncio.to_thread(self._finalise, inp)

    def _finalise(self, inp: FinaliseInput) -> FinaliseResult:
        with _span("mrp.finalise", run_id=inp.compiled.run_id, status=inp.status):
            store = self.store
            c = inp.compiled
            ir = load_ir(store, c.ir_digest)
            rows = {r.shard_index: r for r in list_shards(self.sessions, c.run_id)}
            shards: list[ShardOutputRecord] = []
            counters = inp.counters.model_copy()
            for t in ir.map_tasks:
                row = rows.get(t.shard_index)
                state: Any = "cancelled"
                if row is not None:
                    state = (
                        "failed"
                        if row.state == "failed"
                        else ("skipped" if row.source == "checkpoint" else "succeeded")
                    )
                shards.append(
                    ShardOutputRecord(
                        shard_index=t.shard_index,
                        shard_id=t.shard_id,
                        input_digest=t.input_digest,
                        checkpoint_key=t.checkpoint_key,
                        output_digest=row.output_digest if row is not None else None,
                        state=state,
                        attempts=row.attempts if row is not None else 0,
                    )
                )
            counters.total = len(ir.map_tasks)
            counters.cancelled = sum(1 for s in shards if s.state == "cancelled")
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
                input_file_digests=dict(c.input_file_digests),
                shards=shards,
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
            attrs = {"job_id": c.job_id, "status": inp.status}
            _meter_add("keel_mrp_jobs", "MRP runs by status", 1, attrs)
            _meter_hist(
                "keel_mrp_job_cost_units", "MRP run cost", "units", float(inp.cost.units), attrs
            )
            _meter_hist(
                "keel_mrp_job_cost_usd", "MRP run LLM cost", "usd", float(inp.cost.usd), attrs
            )
            if inp.cost.limit_units > 0:
                _meter_hist(
                    "keel_mrp_budget_used_ratio",
                    "MRP run spend / kill limit (units)",
                    "1",
                    float(inp.cost.units / inp.cost.limit_units),
                    attrs,
                )
            return FinaliseResult(
                run_manifest_digest=digest,
                output_digests=manifest.output_digests(),
                counters=counters,
                mismatch=mismatch,
            )

    def _compare(
        self, original_run: str, replayed: RunManifest, ir: JobIR
    ) -> ReplayMismatch | None:
        run = get_run(self.sessions, original_run)
        if run is None or run.run_manifest_digest is None:
            return ReplayMismatch(where="run", expected=original_run, got=None)
        original = run_manifest_from_json(self.store.get_bytes(run.run_manifest_digest))
        order = [t.shard_id for t in ir.map_tasks]
        return first_mismatch(original.comparable_digests(), replayed.comparable_digests(), order)


# ---------------------------------------------------------------------------------------
# One map window


class _Window:
    """The state of one map window attempt."""

    def __init__(self, acts: MrpActivities, inp: MapWindowInput) -> None:
        self.acts = acts
        self.inp = inp
        self.settings = acts._settings
        self.counters = ShardCounters()
        self.units = Decimal(0)
        self.usd = Decimal(0)
        self.llm_calls = 0
        self.llm_cached = 0
        self.done = 0
        self.stop = False
        self.stopped_by_budget = False
        self.failure: ApplicationError | None = None
        self.pending: list[tuple[ShardRecord, bool]] = []
        self.flush_now = asyncio.Event()
        self.flush_lock = asyncio.Lock()
        self.operator_digest = ""
        self.session: RaySession | None = None
        self.meter: dict[str, Any] = {}

    def _instruments(self) -> None:
        """The window's metric instruments, made once (metrics never fail an activity)."""
        with contextlib.suppress(Exception):
            meter = activity.metric_meter()
            self.meter = {
                "latency": meter.create_histogram_float(
                    "keel_mrp_shard_latency_ms", "MRP shard attempt latency", "ms"
                ),
                "shards": meter.create_counter("keel_mrp_shards", "MRP shards by outcome"),
                "retries": meter.create_counter("keel_mrp_shard_retries", "MRP shard retries"),
                "failures": meter.create_counter(
                    "keel_mrp_shard_failures", "MRP shards failed for good"
                ),
            }

    def _metric(self, name: str, value: float, attrs: dict[str, str]) -> None:
        inst = self.meter.get(name)
        if inst is not None:
            with contextlib.suppress(Exception):
                if name == "latency":
                    inst.record(value, attrs)
                else:
                    inst.add(int(value), attrs)

    def _note(self, record: ShardRecord, checkpoint: bool) -> None:
        """Buffer a shard record (written by :meth:`_flush`)."""
        self.pending.append((record, checkpoint))
        if len(self.pending) >= FLUSH_MAX:
            self.flush_now.set()

    async def _flush(self) -> None:
        """Write the buffered shard records in one transaction, then heartbeat progress."""
        async with self.flush_lock:
            batch, self.pending = self.pending, []
            if batch:
                try:
                    await asyncio.to_thread(
                        record_shards,
                        self.acts.sessions,
                        batch,
                        operator_digest=self.operator_digest,
                    )
                except BaseException:
                    self.pending[:0] = batch  # written by the next flush
                    raise
            activity.heartbeat({"done": self.done, "total": self.total})

    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush_now.wait(), FLUSH_EVERY_S)
            self.flush_now.clear()
            await self._flush()

    def _over_budget(self) -> bool:
        inp = self.inp
        return (inp.remaining_units is not None and self.units > inp.remaining_units) or (
            inp.remaining_usd is not None and self.usd > inp.remaining_usd
        )

    async def run(self) -> MapWindowResult:
        t0 = time.monotonic()
        inp = self.inp
        store = self.acts.store
        ir = await asyncio.to_thread(load_ir, store, inp.ir_digest)
        tasks = ir.map_tasks[inp.start : inp.end]
        self.total = len(tasks)
        config = await asyncio.to_thread(self.acts.config)
        handle = _handle(config, ir, "map")
        binding = ir.operators["map"]
        sessions = self.acts.sessions
        self.operator_digest = binding.operator_digest
        self._instruments()

        # Shards this run already finished (an earlier attempt of this window) are done.
        own = await asyncio.to_thread(
            shards_with_output, sessions, inp.run_id, [t.shard_index for t in tasks]
        )
        to_run: list[MapTask] = []
        for t in tasks:
            if t.checkpoint_key != make_checkpoint_key(t.operator_digest, t.input_digest, t.seed):
                raise ApplicationError(
                    f"{t.shard_id}: checkpoint key does not match its operator, input and seed",
                    type=ERROR_SHARD,
                    non_retryable=True,
                )
            mine = own.get(t.shard_index)
            if mine is not None and mine.checkpoint_key == t.checkpoint_key:
                self.counters.skipped += 1
                self.done += 1
            else:
                to_run.append(t)
        if inp.use_checkpoints and to_run:
            index = await asyncio.to_thread(
                lookup_checkpoints, sessions, [t.checkpoint_key for t in to_run]
            )
            found = [index[t.checkpoint_key] for t in to_run if t.checkpoint_key in index]
            present = set(
                await asyncio.to_thread(lambda: [d for d in set(found) if store.exists(d)])
            )
            rest = []
            for t in to_run:
                digest = index.get(t.checkpoint_key)
                if digest is not None and digest in present:
                    self._note(
                        self._record(t, "succeeded", "checkpoint", digest, 0, 0, None, None),
                        False,
                    )
                    self.counters.skipped += 1
                    self.done += 1
                    self._metric("shards", 1, {"outcome": "skipped"})
                else:
                    rest.append(t)
            to_run = rest
        await self._flush()

        backend = get_backend(inp.backend, min(config.caps.max_workers, os.cpu_count() or 1))
        parallelism = inp.parallelism
        if isinstance(backend, RayBackend):
            # At most `parallelism` actors (so shards running at once) for this window; more
            # shards than that are queued so batches and pipelined calls can be formed.
            lanes = min(parallelism, backend.num_cpus)
            context = ShardContext(
                run_id=inp.run_id,
                workflow_id=inp.workflow_id,
                operator=handle,
                params=dict(binding.params),
                llm_replay_only=inp.llm_replay_only,
                llm_model=self.acts._llm_model,
            )
            self.session = backend.session(context, self.settings, ir.limits.shard_timeout_s, lanes)
            parallelism = lanes * MAX_BATCH * PIPELINE_DEPTH
            weight = handle.spec.cost_weight
            if inp.remaining_units is not None and weight > 0:
                # Queued shards are committed spend: keep them within the remaining budget.
                parallelism = max(lanes, min(parallelism, int(inp.remaining_units / weight)))
        sem = asyncio.Semaphore(parallelism)
        flusher = asyncio.create_task(self._flusher())
        running: list[asyncio.Task[None]] = []
        try:
            for t in to_run:
                await sem.acquire()
                if self.stop:
                    sem.release()
                    break
                running.append(asyncio.create_task(self._shard(t, handle, ir, backend, sem)))
            await asyncio.gather(*running)
        except BaseException:
            for r in running:
                r.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
            if self.session is not None:
                await self.session.close()
            # Whatever finished is recorded, even when the window fails or is cancelled.
            await asyncio.shield(self._flush())
        if self.failure is not None:
            raise self.failure
        self.counters.total = self.total
        return MapWindowResult(
            start=inp.start,
            end=inp.end,
            counters=self.counters,
            cost_units=self.units,
            cost_usd=self.usd,
            llm_calls=self.llm_calls,
            llm_cached=self.llm_cached,
            stopped_by_budget=self.stopped_by_budget,
            elapsed_s=time.monotonic() - t0,
        )

    def _record(
        self,
        t: MapTask,
        state: Any,
        source: Any,
        digest: str | None,
        attempts: int,
        executions: int,
        attempt: ShardAttempt | None,
        error: str | None,
        units: Decimal = Decimal(0),
        usd: Decimal = Decimal(0),
    ) -> ShardRecord:
        from datetime import UTC, datetime

        return ShardRecord(
            run_id=self.inp.run_id,
            shard_index=t.shard_index,
            shard_id=t.shard_id,
            input_digest=t.input_digest,
            checkpoint_key=t.checkpoint_key,
            output_digest=digest,
            state=state,
            source=source,
            attempts=attempts,
            executions=executions,
            latency_ms=attempt.latency_ms if attempt is not None else 0.0,
            cost_units=units,
            cost_usd=usd,
            error=error,
            updated_at=datetime.now(UTC),
        )

    async def _shard(
        self, t: MapTask, handle: OperatorHandle, ir: JobIR, backend: Any, sem: asyncio.Semaphore
    ) -> None:
        inp = self.inp
        limits = ir.limits
        max_attempts = 1 + limits.max_shard_retries
        units = Decimal(0)
        usd = Decimal(0)
        last_error = ""
        attrs = {"backend": inp.backend, "operator": handle.spec.ref}
        try:
            for attempt_no in range(1, max_attempts + 1):
                try:
                    if self.session is not None:
                        item = ShardItem(
                            t.shard_index, t.shard_id, t.input_digest, t.seed, attempt_no
                        )
                        result = await self.session.run(item)
                    else:
                        task = ShardTask(
                            run_id=inp.run_id,
                            workflow_id=inp.workflow_id,
                            shard_index=t.shard_index,
                            shard_id=t.shard_id,
                            input_digest=t.input_digest,
                            seed=t.seed,
                            operator=handle,
                            params=dict(ir.operators["map"].params),
                            llm_replay_only=inp.llm_replay_only,
                            llm_model=self.acts._llm_model,
                            attempt=attempt_no,
                        )
                        result = await backend.run(task, self.settings, limits.shard_timeout_s)
                except AttemptTimeout as e:
                    result = ShardAttempt(
                        ok=False,
                        error=str(e),
                        retryable=True,
                        latency_ms=limits.shard_timeout_s * 1000,
                        units=handle.spec.cost_weight,
                    )
                except ShardNotStarted:
                    return  # the window stopped before this attempt ran: left "cancelled"
                units += result.units
                usd += result.llm_usd
                self.units += result.units
                self.usd += result.llm_usd
                self.llm_calls += result.llm_calls
                self.llm_cached += result.llm_cached
                self._metric(
                    "latency",
                    result.latency_ms,
                    {**attrs, "outcome": "ok" if result.ok else "error"},
                )
                if result.ok:
                    assert result.output_digest is not None
                    self._note(
                        self._record(
                            t,
                            "succeeded",
                            "computed",
                            result.output_digest,
                            attempt_no,
                            1,
                            result,
                            None,
                            units,
                            usd,
                        ),
                        inp.use_checkpoints,
                    )
                    self.counters.run += 1
                    self.done += 1
                    self._metric("shards", 1, {"outcome": "run"})
                    if self._over_budget() and not self.stop:
                        self._stop()
                        self.stopped_by_budget = True
                    return
                last_error = result.error or "unknown error"
                if not result.retryable or attempt_no == max_attempts:
                    break
                self.counters.retried += 1
                self._metric("retries", 1, attrs)
                await asyncio.sleep(
                    min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** (attempt_no - 1))
                )
            # Failed for good: record it, stop the window, fail it naming the shard.
            self.counters.failed += 1
            self._metric("failures", 1, attrs)
            self._note(
                self._record(
                    t, "failed", "none", None, attempt_no, 0, None, last_error, units, usd
                ),
                False,
            )
            if self.failure is None:
                what = (
                    f"after {attempt_no} attempts (retry cap {limits.max_shard_retries})"
                    if attempt_no == max_attempts
                    else f"on attempt {attempt_no} (not retryable)"
                )
                self.failure = ApplicationError(
                    f"shard {t.shard_id} failed {what}: {last_error}",
                    {"shard_id": t.shard_id, "shard_index": t.shard_index, "attempts": attempt_no},
                    type=ERROR_SHARD,
                    non_retryable=True,
                )
            self._stop()
        finally:
            sem.release()

    def _stop(self) -> None:
        """Start no more shards (queued Ray attempts are dropped, not run)."""
        self.stop = True
        if self.session is not None:
            self.session.stop()


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
