"""The compiled job: IR (what to run) and manifest (what it was compiled from).

``IR.json`` is the contract between the compiler and the runtime: map tasks with their
seeds and checkpoint keys, the reduce, evaluate, approval and produce steps, runtime limits
and the budget. ``manifest.json`` snapshots provenance (operator versions and digests,
input digests, seeds, DSL version, IR digest) for audit and ``mrp replay``. Both serialise
to canonical JSON, so their BLAKE3 digests name them.

Shard payloads are not in the IR: each map task names its input by digest, and the compile
activity stores the payloads in the artifact store, which keeps the IR (and workflow
history) small. Consecutive shards' payloads go in one pack (``input_packs``: up to
``INPUTS_PER_PACK`` of them, at most ``INPUT_PACK_BYTES``), a task naming its payload's
place in it (``input_at``: the pack's number, the payload's offset and length, some 20
bytes a task); a payload read from its pack is still proved by its own digest. A payload
over ``INPUT_MEMBER_MAX`` bytes, or a pack of one distinct payload, is stored alone under
its digest, with no ``input_at`` (as every payload was before packs: such an IR
serialises, and so digests, as it did).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from keel.digest import canonical_json, canonical_text, digest_bytes, digest_json
from keel.mrp.budget import BudgetLimits, CostEstimate
from keel.mrp.dsl import SinkSpec
from keel.mrp.registry import OperatorKind, OperatorSpec

IR_VERSION: Literal["mrp-ir/0.1"] = "mrp-ir/0.1"
MANIFEST_VERSION: Literal["mrp-manifest/0.1"] = "mrp-manifest/0.1"
COMPILER_ID = "keel.mrp.compiler/0.1"
CHECKPOINT_KEY_KIND = "keel.mrp.checkpoint/v1"

Role = Literal["map", "reduce", "evaluate", "produce"]
ROLE_KINDS: dict[str, OperatorKind] = {
    "map": OperatorKind.MAP,
    "reduce": OperatorKind.REDUCE,
    "evaluate": OperatorKind.EVALUATE,
    "produce": OperatorKind.PRODUCE,
}


def checkpoint_key(operator_digest: str, input_digest: str, seed: int) -> str:
    """The key a map shard's output is checkpointed under.

    Equal keys mean the same configured operator ran on the same input with the same seed,
    so a retry (or a re-run) can reuse a stored output instead of recomputing it. It is
    the digest of the canonical JSON of ``{"kind", "operator_digest", "input_digest",
    "seed"}``, written out (one is made per shard; ``json.dumps`` of the dict was most of
    its cost)."""
    text = (
        f'{{"input_digest":{canonical_text(input_digest)},'
        f'"kind":"{CHECKPOINT_KEY_KIND}",'
        f'"operator_digest":{canonical_text(operator_digest)},'
        f'"seed":{int(seed)}}}'
    )
    return digest_bytes(text.encode("utf-8"))


def operator_digest(spec: OperatorSpec, params: dict[str, JsonValue]) -> str:
    """Digest of an operator *as configured*: its identity, code, entrypoint and params.

    Cost and description are left out on purpose: they do not change what the operator
    computes, so editing them must not throw away checkpoints.
    """
    return digest_json(
        {
            "ref": spec.ref,
            "code_digest": spec.code_digest,
            "entrypoint": spec.entrypoint,
            "params": params,
        }
    )


def shard_id(index: int) -> str:
    """Stable, sortable name of shard ``index``."""
    return f"shard-{index:06d}"


class _IRModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class OperatorBinding(_IRModel):
    """A resolved operator as a step uses it."""

    role: Role
    ref: str
    kind: OperatorKind
    entrypoint: str
    code_digest: str
    operator_digest: str
    params: dict[str, JsonValue]
    egress: list[str]


#: Consecutive shards whose payloads share one pack, and the most bytes one pack holds.
INPUTS_PER_PACK = 1000
INPUT_PACK_BYTES = 64 * 1024 * 1024
#: A payload larger than this is stored alone, under its own digest.
INPUT_MEMBER_MAX = 256 * 1024


def _unset(value: Any) -> bool:
    return value is None or value == []


class MapTask(_IRModel):
    """One map shard: run ``operator_ref`` over the input named ``input_digest``, whose
    bytes lie in pack ``input_at[0]`` of the IR's ``input_packs`` at offset
    ``input_at[1]``, ``input_at[2]`` bytes long (or, with no ``input_at``, alone under
    ``input_digest``)."""

    shard_index: int = Field(ge=0)
    shard_id: str
    input_digest: str
    item_count: int = Field(ge=1)
    operator_ref: str
    operator_digest: str
    seed: int
    checkpoint_key: str
    input_at: tuple[int, int, int] | None = Field(default=None, exclude_if=_unset)


class ReduceTask(_IRModel):
    """Reduce all shard outputs, in ``shard_index`` order, with the numeric policy."""

    operator_ref: str
    operator_digest: str
    seed: int
    shard_count: int = Field(ge=1)
    input_order: Literal["shard_index"] = "shard_index"


class EvaluateTask(_IRModel):
    """Score the reduced output; produce runs only when ``score >= min_score``."""

    operator_ref: str
    operator_digest: str
    seed: int
    min_score: Decimal


class ApprovalTask(_IRModel):
    """Open an ``ApprovalGate`` before produce."""

    gate: str
    approvers: list[str]
    expires_in_s: float


class ProduceTask(_IRModel):
    """Write the (evaluated, approved) output to the sink; the only external write."""

    operator_ref: str
    operator_digest: str
    seed: int
    sink: SinkSpec


class RuntimeLimits(_IRModel):
    """Limits the runtime enforces, as admitted. ``min_success_ratio`` is set only when
    below 1 (``map.min_success_ratio``); the IR of a job without it is what it was."""

    max_workers: int
    shard_timeout_s: float
    shard_memory_mb: int
    max_shard_retries: int
    egress: list[str]
    min_success_ratio: Decimal | None = None

    @model_serializer(mode="wrap")
    def _omit_unset_ratio(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and self.min_success_ratio is None:
            data.pop("min_success_ratio", None)
        return data

    def enough_succeeded(self, succeeded: int, total: int) -> bool:
        """Whether ``succeeded`` of ``total`` shards meet the ratio (exact arithmetic)."""
        ratio = self.min_success_ratio if self.min_success_ratio is not None else Decimal(1)
        return total > 0 and succeeded > 0 and Decimal(succeeded) >= ratio * total


class BudgetPlan(_IRModel):
    """The compile-time estimate and the kill limits derived from it."""

    estimate: CostEstimate
    limits: BudgetLimits
    budget_units: Decimal | None
    budget_usd: Decimal | None


class JobIR(_IRModel):
    """The whole compiled job (``IR.json``)."""

    ir_version: Literal["mrp-ir/0.1"] = IR_VERSION
    dsl_version: str
    job_id: str
    job_digest: str
    inputs_digest: str
    job_seed: int
    operators: dict[str, OperatorBinding]
    map_tasks: list[MapTask]
    reduce: ReduceTask
    evaluate: EvaluateTask | None
    approval: ApprovalTask | None
    produce: ProduceTask
    limits: RuntimeLimits
    budget: BudgetPlan
    input_packs: list[str] = Field(default_factory=list, exclude_if=_unset)

    def digest(self) -> str:
        """BLAKE3 digest of ``IR.json``."""
        return digest_json(self)

    def input_place(self, task: MapTask) -> tuple[str, int, int] | None:
        """Where ``task``'s payload lies: its pack's digest, offset and length; ``None``
        when it is stored alone under ``task.input_digest``."""
        if task.input_at is None:
            return None
        pack, offset, length = task.input_at
        return self.input_packs[pack], offset, length

    def stored_inputs(self) -> set[str]:
        """The objects that hold the map tasks' payloads: the packs and the payloads
        stored alone."""
        alone = {t.input_digest for t in self.map_tasks if t.input_at is None}
        return alone | set(self.input_packs)

    def to_json(self) -> bytes:
        """``IR.json``: canonical JSON bytes."""
        return canonical_json(self)


class ManifestOperator(_IRModel):
    """Provenance of one operator."""

    role: Role
    ref: str
    name: str
    version: str
    kind: OperatorKind
    code_digest: str
    spec_digest: str
    operator_digest: str
    signed: bool


class ManifestSeeds(_IRModel):
    """Every seed the run uses."""

    job: int
    reduce: int
    evaluate: int | None
    produce: int
    shards: list[int]


class Manifest(_IRModel):
    """Provenance of a compiled job (``manifest.json``)."""

    manifest_version: Literal["mrp-manifest/0.1"] = MANIFEST_VERSION
    compiler: str = COMPILER_ID
    dsl_version: str
    ir_version: str
    job_id: str
    job_digest: str
    inputs_digest: str
    input_digests: list[str]
    operators: list[ManifestOperator]
    seeds: ManifestSeeds
    ir_digest: str
    policy_report_digest: str

    def digest(self) -> str:
        """BLAKE3 digest of ``manifest.json``."""
        return digest_json(self)

    def to_json(self) -> bytes:
        """``manifest.json``: canonical JSON bytes."""
        return canonical_json(self)


def ir_from_json(data: bytes | str) -> JobIR:
    """Parse ``IR.json``."""
    return JobIR.model_validate_json(data)


def manifest_from_json(data: bytes | str) -> Manifest:
    """Parse ``manifest.json``."""
    return Manifest.model_validate_json(data)


def verify_manifest(ir: JobIR, manifest: Manifest) -> None:
    """Check that ``manifest`` describes ``ir``; :class:`ValueError` names the first mismatch.

    A replay loads both from the artifact store and calls this before running anything.
    """
    if manifest.ir_digest != ir.digest():
        raise ValueError(f"manifest names IR {manifest.ir_digest}, but the IR is {ir.digest()}")
    checks: list[tuple[str, object, object]] = [
        ("job_id", manifest.job_id, ir.job_id),
        ("dsl_version", manifest.dsl_version, ir.dsl_version),
        ("job_digest", manifest.job_digest, ir.job_digest),
        ("inputs_digest", manifest.inputs_digest, ir.inputs_digest),
        ("input_digests", manifest.input_digests, [t.input_digest for t in ir.map_tasks]),
        ("seeds.job", manifest.seeds.job, ir.job_seed),
        ("seeds.shards", manifest.seeds.shards, [t.seed for t in ir.map_tasks]),
        (
            "operators",
            {o.role: o.operator_digest for o in manifest.operators},
            {r: b.operator_digest for r, b in ir.operators.items()},
        ),
    ]
    for name, in_manifest, in_ir in checks:
        if in_manifest != in_ir:
            raise ValueError(f"manifest and IR disagree on {name}")
