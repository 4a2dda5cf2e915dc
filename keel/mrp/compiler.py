"""``compile_job``: job YAML -> IR, manifest and policy report, failing closed.

The steps, each pure:

1. parse and validate the YAML (:func:`keel.mrp.dsl.parse_job`), errors with lines;
2. normalise: canonical inputs, shards, digests (:func:`keel.mrp.normalize.normalize_job`);
3. admit against the registry and caps (:func:`keel.mrp.policy.admit`); any violation
   raises :class:`~keel.mrp.policy.PolicyViolation`;
4. check inline items and params against the operators' JSON Schemas;
5. derive seeds and checkpoint keys and build the IR and the manifest.

The compile activity calls this with the files it resolved and stores ``IR.json``,
``manifest.json`` and the shard payloads in the artifact store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, JsonValue, PrivateAttr

from keel.built import built
from keel.digest import canonical_json, digest_bytes, pack_members
from keel.mrp.budget import CostEstimate, kill_limits
from keel.mrp.dsl import JobSpec, ParsedJob, parse_job, path_of
from keel.mrp.errors import DslError, DslIssue
from keel.mrp.ir import (
    INPUT_MEMBER_MAX,
    INPUT_PACK_BYTES,
    INPUTS_PER_PACK,
    ApprovalTask,
    BudgetPlan,
    EvaluateTask,
    JobIR,
    Manifest,
    ManifestOperator,
    ManifestSeeds,
    MapTask,
    OperatorBinding,
    ProduceTask,
    ReduceTask,
    RuntimeLimits,
    checkpoint_key,
    operator_digest,
    shard_id,
)
from keel.mrp.normalize import (
    FileRef,
    NormalizedJob,
    Shard,
    ShardInput,
    derive_job_seed,
    derive_seed,
    normalize_job,
    shard_seed,
)
from keel.mrp.policy import ROLE_PATHS, Caps, PolicyReport, PolicyViolation, admit
from keel.mrp.records import RecordSlice
from keel.mrp.registry import OperatorSpec, Registry


class CompileResult(BaseModel):
    """The compiler's output: IR, manifest, policy report and the shard payloads.

    ``shard_inputs`` maps each map task's ``input_digest`` to its payload; identical shards
    share one entry. ``input_packs`` are the bytes of the IR's ``input_packs``, in order
    (the compile activity stores them, and alone each payload of a task with no
    ``input_at``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    ir: JobIR
    manifest: Manifest
    policy_report: PolicyReport
    shard_inputs: dict[str, ShardInput]
    input_packs: list[bytes] = Field(default_factory=list)
    _ir_json: bytes | None = PrivateAttr(default=None)

    def ir_json(self) -> bytes:
        """``IR.json`` bytes (canonical JSON; serialised once)."""
        if self._ir_json is None:
            self._ir_json = self.ir.to_json()
        return self._ir_json

    def manifest_json(self) -> bytes:
        """``manifest.json`` bytes (canonical JSON)."""
        return self.manifest.to_json()

    def policy_report_json(self) -> bytes:
        """``policy_report.json`` bytes (canonical JSON)."""
        return canonical_json(self.policy_report)


def _params(spec: JobSpec, role: str) -> dict[str, JsonValue]:
    call = {
        "map": spec.map,
        "reduce": spec.reduce,
        "evaluate": spec.evaluator,
        "produce": spec.produce,
    }[role]
    if call is None:
        raise ValueError(f"the job has no {role} step")
    return dict(call.params)


def check_schemas(parsed: ParsedJob, specs: dict[str, OperatorSpec]) -> None:
    """Validate params against each operator's params schema and inline items against the
    map operator's input schema; :class:`DslError` with lines for every mismatch."""
    issues: list[DslIssue] = []
    spec = parsed.spec

    def add(base: str, where: tuple[str | int, ...], message: str) -> None:
        path = path_of([*base.split("."), *where])
        issues.append(DslIssue(path=path, line=parsed.line(path), message=message))

    for role, op in specs.items():
        for problem in op.schema_errors("params", _params(spec, role)):
            add(f"{ROLE_PATHS[role]}.params", problem.path, problem.message)
    items = spec.inputs.items
    if items is not None:
        mapper = specs["map"]
        for i, item in enumerate(items):
            for problem in mapper.schema_errors("input", item, limit=3):
                add(
                    f"inputs.items[{i}]",
                    problem.path,
                    f"does not match the {mapper.ref} input schema: {problem.message}",
                )
            if len(issues) >= 50:
                # A wholly wrong item list would otherwise report every item.
                break
    if issues:
        raise DslError(issues, parsed.source)


def _bindings(spec: JobSpec, specs: dict[str, OperatorSpec]) -> dict[str, OperatorBinding]:
    """Each role's operator bound to its params, with the operator digest they give."""
    return {
        role: OperatorBinding(
            role=role,  # type: ignore[arg-type]
            ref=op.ref,
            kind=op.kind,
            entrypoint=op.entrypoint,
            code_digest=op.code_digest,
            operator_digest=operator_digest(op, _params(spec, role)),
            params=_params(spec, role),
            egress=list(op.egress),
        )
        for role, op in specs.items()
    }


class InputPacks(NamedTuple):
    """The shards' payloads packed (``JobIR.input_packs``): each pack's bytes and digest,
    and each packed shard's place (``MapTask.input_at``) by shard index."""

    packs: list[bytes]
    digests: list[str]
    at: dict[int, tuple[int, int, int]]


def pack_inputs(shards: Sequence[Shard]) -> InputPacks:
    """Consecutive shards' payloads (canonical JSON), ``INPUTS_PER_PACK`` at most to a
    pack and ``INPUT_PACK_BYTES`` at most in it; a payload over ``INPUT_MEMBER_MAX`` is
    left out (stored alone), and so is a pack of one distinct payload (its bytes are that
    payload's, stored under its own digest)."""
    out = InputPacks([], [], {})
    group: list[tuple[int, bytes]] = []
    size = 0

    def close() -> None:
        if len({data for _, data in group}) > 1:
            pack, spans = pack_members([data for _, data in group])
            number = len(out.packs)
            out.packs.append(pack)
            out.digests.append(digest_bytes(pack))
            for (index, _), (offset, length) in zip(group, spans, strict=True):
                out.at[index] = (number, offset, length)
        group.clear()

    for shard in shards:
        data = shard.payload or shard.input.canonical_bytes()
        if len(data) > INPUT_MEMBER_MAX:
            continue
        if group and (len(group) >= INPUTS_PER_PACK or size + len(data) > INPUT_PACK_BYTES):
            close()
            size = 0
        group.append((shard.index, data))
        size += len(data) + 1
    close()
    return out


def _map_tasks(
    job: NormalizedJob,
    job_seed: int,
    mapper: OperatorBinding,
    at: dict[int, tuple[int, int, int]],
) -> list[MapTask]:
    """One map task per shard, seeded from the job seed and the shard's input digest
    (built, not validated: every field is computed here, and a shard holds at least one
    item, file or record)."""
    map_tasks = []
    for shard in job.shards:
        seed = shard_seed(job_seed, shard.input_digest)
        map_tasks.append(
            built(
                MapTask,
                shard_index=shard.index,
                shard_id=shard_id(shard.index),
                input_digest=shard.input_digest,
                item_count=shard.input.item_count,
                operator_ref=mapper.ref,
                operator_digest=mapper.operator_digest,
                seed=seed,
                checkpoint_key=checkpoint_key(mapper.operator_digest, shard.input_digest, seed),
                input_at=at.get(shard.index),
            )
        )
    return map_tasks


def _evaluate_task(
    spec: JobSpec, job_seed: int, bindings: dict[str, OperatorBinding]
) -> EvaluateTask | None:
    if spec.evaluator is None:
        return None
    return EvaluateTask(
        operator_ref=bindings["evaluate"].ref,
        operator_digest=bindings["evaluate"].operator_digest,
        seed=derive_seed(job_seed, "evaluate"),
        min_score=spec.evaluator.min_score,
    )


def _approval_task(spec: JobSpec) -> ApprovalTask | None:
    if spec.approval is None:
        return None
    return ApprovalTask(
        gate=spec.approval.gate,
        approvers=list(spec.approval.approvers),
        expires_in_s=spec.approval.expires_in_s,
    )


def _limits(spec: JobSpec) -> RuntimeLimits:
    policy = spec.policy
    return RuntimeLimits(
        max_workers=policy.max_workers,
        shard_timeout_s=policy.shard_timeout_s,
        shard_memory_mb=policy.shard_memory_mb,
        max_shard_retries=policy.max_shard_retries,
        egress=list(policy.egress),
        min_success_ratio=spec.map.success_ratio,
    )


def _budget(spec: JobSpec, estimate: CostEstimate, caps: Caps) -> BudgetPlan:
    """The admitted estimate with the kill limits the policy's budgets set."""
    policy = spec.policy
    return BudgetPlan(
        estimate=estimate,
        limits=kill_limits(
            estimate,
            budget_units=policy.budget_units,
            budget_usd=policy.budget_usd,
            kill_ratio=caps.kill_ratio,
        ),
        budget_units=policy.budget_units,
        budget_usd=policy.budget_usd,
    )


def build_ir(
    job: NormalizedJob,
    specs: dict[str, OperatorSpec],
    caps: Caps,
    report: PolicyReport,
    packed: InputPacks | None = None,
) -> JobIR:
    """Build the IR of an admitted job (its payloads' places in ``packed``, when given)."""
    if report.estimate is None or not report.admitted:
        raise ValueError("build_ir needs an admitted job with an estimate")
    spec = job.spec
    job_seed = derive_job_seed(
        spec.dsl_version, spec.job_id, job.inputs_digest, spec.operator_refs()
    )
    bindings = _bindings(spec, specs)
    map_tasks = _map_tasks(job, job_seed, bindings["map"], packed.at if packed else {})
    return JobIR(
        dsl_version=spec.dsl_version,
        job_id=spec.job_id,
        job_digest=job.job_digest,
        inputs_digest=job.inputs_digest,
        job_seed=job_seed,
        operators=bindings,
        map_tasks=map_tasks,
        reduce=ReduceTask(
            operator_ref=bindings["reduce"].ref,
            operator_digest=bindings["reduce"].operator_digest,
            seed=derive_seed(job_seed, "reduce"),
            shard_count=len(map_tasks),
        ),
        evaluate=_evaluate_task(spec, job_seed, bindings),
        approval=_approval_task(spec),
        produce=ProduceTask(
            operator_ref=bindings["produce"].ref,
            operator_digest=bindings["produce"].operator_digest,
            seed=derive_seed(job_seed, "produce"),
            sink=spec.produce.sink,
        ),
        limits=_limits(spec),
        budget=_budget(spec, report.estimate, caps),
        input_packs=packed.digests if packed else [],
    )


def build_manifest(
    ir: JobIR,
    specs: dict[str, OperatorSpec],
    report: PolicyReport,
    ir_digest: str | None = None,
) -> Manifest:
    """Build the manifest of a compiled job (``ir_digest``: the IR's, when known)."""
    operators = [
        ManifestOperator(
            role=binding.role,
            ref=binding.ref,
            name=specs[role].name,
            version=specs[role].version,
            kind=binding.kind,
            code_digest=binding.code_digest,
            spec_digest=specs[role].spec_digest(),
            operator_digest=binding.operator_digest,
            signed=specs[role].signature is not None,
        )
        for role, binding in sorted(ir.operators.items())
    ]
    return Manifest(
        dsl_version=ir.dsl_version,
        ir_version=ir.ir_version,
        job_id=ir.job_id,
        job_digest=ir.job_digest,
        inputs_digest=ir.inputs_digest,
        input_digests=[t.input_digest for t in ir.map_tasks],
        operators=operators,
        seeds=ManifestSeeds(
            job=ir.job_seed,
            reduce=ir.reduce.seed,
            evaluate=ir.evaluate.seed if ir.evaluate is not None else None,
            produce=ir.produce.seed,
            shards=[t.seed for t in ir.map_tasks],
        ),
        ir_digest=ir_digest or ir.digest(),
        policy_report_digest=report.digest(),
    )


def compile_parsed(
    parsed: ParsedJob,
    registry: Registry,
    caps: Caps,
    *,
    resolved_files: Iterable[FileRef] | None = None,
    record_slices: Iterable[RecordSlice] | None = None,
) -> CompileResult:
    """:func:`compile_job` for a job that is already parsed."""
    job = normalize_job(parsed, resolved_files, record_slices)
    report = admit(job, registry, caps, parsed.lines)
    if not report.admitted:
        raise PolicyViolation(report)
    specs = {role: registry.get(ref) for role, ref in job.spec.operator_refs().items()}
    check_schemas(parsed, specs)
    packed = pack_inputs(job.shards)
    ir = build_ir(job, specs, caps, report, packed)
    ir_json = ir.to_json()
    manifest = build_manifest(ir, specs, report, ir_digest=digest_bytes(ir_json))
    result = CompileResult(
        ir=ir,
        manifest=manifest,
        policy_report=report,
        shard_inputs={s.input_digest: s.input for s in job.shards},
        input_packs=packed.packs,
    )
    result._ir_json = ir_json
    return result


def compile_job(
    yaml_text: str,
    registry: Registry,
    caps: Caps,
    *,
    resolved_files: Iterable[FileRef] | None = None,
    record_slices: Iterable[RecordSlice] | None = None,
    source: str = "",
) -> CompileResult:
    """Compile a job file; fails closed.

    Raises :class:`~keel.mrp.errors.DslError` (bad YAML, schema or item, with lines) or
    :class:`~keel.mrp.policy.PolicyViolation` (naming every rule that fired). ``source``
    names the file in error messages; ``resolved_files`` is required for ``inputs.files``
    and ``record_slices`` (``keel.mrp.records.RecordSlice``) for ``inputs.format``.
    """
    return compile_parsed(
        parse_job(yaml_text, source),
        registry,
        caps,
        resolved_files=resolved_files,
        record_slices=record_slices,
    )
