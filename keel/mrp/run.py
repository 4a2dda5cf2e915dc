"""The ``MRPJob`` workflow's contract: its input, its result and the run manifest.

Pure models shared by the workflow (``workflows/mrp.py``), its activities
(``activities/mrp.py``), the ``mrp`` CLI and the API. Nothing here does I/O.

- :class:`MRPJobInput` starts a run. Workflow id: :func:`workflow_id_for` ->
  ``mrp/<job_id>/<run_id>``; when ``run_id`` is empty the workflow takes the last segment of
  its workflow id.
- :class:`MRPJobResult` is what the workflow returns for every *decided* end (succeeded,
  budget_exceeded, rejected, expired, evaluation_failed). A compile failure, a shard over
  its retry cap or a replay mismatch fails the workflow with a non-retryable
  ``ApplicationError`` whose message names the rule, operator or shard; ``type`` is one of
  :data:`ERROR_TYPES`.
- :class:`RunManifest` (``run-manifest.json`` in the artifact store) lists every digest of a
  run: IR, compile manifest, policy report, each shard's input and output, the reduce
  output, the evaluation, the produced files. Partial for runs that stopped early.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from keel.digest import canonical_json, digest_json
from keel.mrp.records import MalformedRecord

#: Temporal workflow type name of the runtime.
WORKFLOW_TYPE = "MRPJob"
#: Shards per map window (one heartbeating activity) when neither input nor config says.
DEFAULT_WINDOW_SIZE = 100
#: Largest accepted window.
MAX_WINDOW_SIZE = 10_000
RUN_MANIFEST_VERSION: Literal["mrp-run/0.1"] = "mrp-run/0.1"
#: The most bytes an ``MRPJob`` input may take as JSON (its job text is most of it).
#: Temporal refuses a payload over 2 MiB by default ("Blob data size exceeds limit", the
#: dev server and Temporal Cloud alike), and the job's text goes on to the compile
#: activity with a few more fields, hence the margin. A job's inline ``inputs.items`` are
#: what grows it: 100,000 short items are about 1.2 MB; longer lists belong in a file.
MAX_JOB_INPUT_BYTES = 2 * 1024 * 1024 - 64 * 1024

Backend = Literal["ray", "threads"]
RunStatus = Literal[
    "succeeded", "failed", "budget_exceeded", "rejected", "expired", "evaluation_failed"
]
Phase = Literal["compile", "map", "reduce", "evaluate", "approval", "produce", "finalise"]
ShardState = Literal["succeeded", "skipped", "failed", "cancelled"]

#: ``ApplicationError.type`` values the workflow fails with.
ERROR_COMPILE = "MrpCompileError"  # DSL error, policy violation, operator refused
ERROR_SHARD = "MrpShardFailed"  # a shard passed its retry cap or failed non-retryably
ERROR_REPLAY_MISMATCH = "MrpReplayMismatch"  # replay produced a different digest
ERROR_REPLAY_SOURCE = "MrpReplaySourceMissing"  # replay_of names no stored run
ERROR_PHASE = "MrpPhaseFailed"  # reduce/evaluate/produce operator raised
ERROR_TYPES = (ERROR_COMPILE, ERROR_SHARD, ERROR_REPLAY_MISMATCH, ERROR_REPLAY_SOURCE, ERROR_PHASE)


def workflow_id_for(job_id: str, run_id: str) -> str:
    """The workflow id of a run: ``mrp/<job_id>/<run_id>``."""
    return f"mrp/{job_id}/{run_id}"


def run_id_from_workflow_id(workflow_id: str) -> str:
    """``run_id`` of ``mrp/<job_id>/<run_id>``; any other id is its own run id."""
    if workflow_id.startswith("mrp/") and workflow_id.count("/") >= 2:
        return workflow_id.rsplit("/", 1)[1]
    return workflow_id


class _RunModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MRPJobInput(_RunModel):
    """Input of the ``MRPJob`` workflow (plain JSON works with ``temporal workflow start``).

    ``base_dir`` is where ``inputs.files`` patterns resolve, on the worker: an absolute
    folder, inside ``KEEL_MRP_JOB_ROOTS`` when the worker has it set (empty: a job with
    ``inputs.files`` is refused at compile, never resolved in the worker's own directory). ``backend`` None means the configured default (``ray``).
    ``replay_of`` names a finished run whose stored IR, inputs and LLM answers are re-used;
    the run then recomputes every shard and fails on the first digest that differs.
    ``llm_replay_only`` answers LLM calls from the cache only (implied by ``replay_of``).
    ``requester`` opens the approval gate (and so may not decide it).
    """

    job_yaml: str = ""
    source: str = ""
    base_dir: str = ""
    run_id: str = ""
    backend: Backend | None = None
    window_size: int | None = Field(default=None, ge=1, le=MAX_WINDOW_SIZE)
    replay_of: str | None = None
    llm_replay_only: bool = False
    requester: str = "mrp"


class ShardCounters(_RunModel):
    """What the map phase did. ``run`` counts operator executions that finished (first
    try or retry); ``skipped`` shards were found in the checkpoint index; ``retried`` counts
    extra attempts; ``failed`` shards passed their retry cap."""

    total: int = 0
    run: int = 0
    skipped: int = 0
    retried: int = 0
    failed: int = 0
    cancelled: int = 0


class RunCost(_RunModel):
    """Spend against the budget (units from operators' ``cost_weight``, USD from LLM calls)."""

    units: Decimal = Decimal(0)
    usd: Decimal = Decimal(0)
    llm_usd: Decimal = Decimal(0)
    limit_units: Decimal = Decimal(0)
    limit_usd: Decimal = Decimal(0)
    estimate_units: Decimal = Decimal(0)
    estimate_usd: Decimal = Decimal(0)
    tripped: str | None = None
    llm_calls: int = 0
    llm_cached: int = 0


class ProducedFileRecord(_RunModel):
    """A file the produce phase wrote, relative to the run's output directory; ``uri`` is
    where it was uploaded for an ``s3://`` sink (``s3://bucket/prefix/<path>``)."""

    path: str
    digest: str
    size: int = Field(ge=0)
    uri: str | None = None


class ShardOutputRecord(_RunModel):
    """One shard of the run manifest."""

    shard_index: int = Field(ge=0)
    shard_id: str
    input_digest: str
    checkpoint_key: str
    output_digest: str | None = None
    state: ShardState = "succeeded"
    attempts: int = 0
    error: str | None = None  # why a failed shard failed (its last attempt's error)


class SkippedRecords(_RunModel):
    """Malformed input records a job with ``on_malformed: skip`` left out: how many, and
    the digest of their full list (``MalformedRecord`` JSON) in the artifact store."""

    count: int = Field(default=0, ge=0)
    digest: str | None = None


class EvaluationRecord(_RunModel):
    """The evaluator's verdict."""

    score: Decimal
    min_score: Decimal
    passed: bool
    reasons: list[str] = Field(default_factory=list)
    digest: str


class RunManifest(_RunModel):
    """``run-manifest.json``: every digest of one run (stored in the artifact store)."""

    run_manifest_version: Literal["mrp-run/0.1"] = RUN_MANIFEST_VERSION
    run_id: str
    job_id: str
    workflow_id: str
    status: RunStatus
    partial: bool = False
    backend: Backend
    replay_of: str | None = None
    ir_digest: str
    manifest_digest: str
    policy_report_digest: str
    job_yaml_digest: str
    input_file_digests: dict[str, str] = Field(default_factory=dict)
    shards: list[ShardOutputRecord] = Field(default_factory=list)
    # Malformed records skipped (``inputs.on_malformed: skip``): the count, the first
    # ``MAX_LISTED_SKIPPED`` by file and line or row, and the full list's digest.
    skipped_record_count: int = Field(default=0, ge=0)
    skipped_records: list[MalformedRecord] = Field(default_factory=list)
    skipped_records_digest: str | None = None
    reduce_digest: str | None = None
    evaluation: EvaluationRecord | None = None
    output_root: str | None = None
    sink_destination: str | None = None
    produced: list[ProducedFileRecord] = Field(default_factory=list)
    produce_result_digest: str | None = None
    counters: ShardCounters = Field(default_factory=ShardCounters)
    cost: RunCost = Field(default_factory=RunCost)
    phase_timings: dict[str, float] = Field(default_factory=dict)
    error: str | None = None

    def digest(self) -> str:
        """BLAKE3 digest of ``run-manifest.json``."""
        return digest_json(self)

    def to_json(self) -> bytes:
        """``run-manifest.json``: canonical JSON bytes."""
        return canonical_json(self)

    def failed_shards(self) -> list[ShardOutputRecord]:
        """The shards that failed for good, in shard order (each with its error)."""
        return sorted((s for s in self.shards if s.state == "failed"), key=_index)

    def shard_output_digests(self) -> dict[str, str]:
        """``shard-NNNNNN`` -> output digest, for every shard that has an output."""
        return {s.shard_id: s.output_digest for s in self.shards if s.output_digest is not None}

    def shard_outputs_digest(self) -> str:
        """One digest over every shard's output digest in shard order (``None`` for a
        shard without output), so two runs' map phases compare in one string."""
        return digest_json([s.output_digest for s in sorted(self.shards, key=_index)])

    def output_digests(self) -> dict[str, str]:
        """The compact digests a result carries: ``shards`` (:meth:`shard_outputs_digest`),
        ``reduce`` and ``produced:<path>`` per file."""
        out: dict[str, str] = {"shards": self.shard_outputs_digest()}
        if self.reduce_digest is not None:
            out["reduce"] = self.reduce_digest
        for f in self.produced:
            out[f"produced:{f.path}"] = f.digest
        return out

    def comparable_digests(self) -> dict[str, str]:
        """What replay compares: every shard's output, ``reduce`` and produced files."""
        out = self.shard_output_digests()
        if self.reduce_digest is not None:
            out["reduce"] = self.reduce_digest
        for f in self.produced:
            out[f"produced:{f.path}"] = f.digest
        return out

    def replay_comparison(self, replayed: RunManifest | None) -> list[dict[str, str | bool | None]]:
        """One row per digest a replay of this run compares, in canonical order (shards by
        index, ``reduce``, produced files by path): ``{"what", "original", "replay",
        "same"}``; without a ``replayed`` manifest every replay digest is None."""
        a = self.comparable_digests()
        b = replayed.comparable_digests() if replayed is not None else {}
        order = [s.shard_id for s in sorted(self.shards, key=_index)]
        keys = [k for k in order if k in a or k in b]
        keys += ["reduce"] if "reduce" in a or "reduce" in b else []
        keys += sorted(k for k in set(a) | set(b) if k.startswith("produced:"))
        return [
            {"what": k, "original": a.get(k), "replay": b.get(k), "same": a.get(k) == b.get(k)}
            for k in keys
        ]


def _index(s: ShardOutputRecord) -> int:
    return s.shard_index


def run_manifest_from_json(data: bytes | str) -> RunManifest:
    """Parse ``run-manifest.json``."""
    return RunManifest.model_validate_json(data)


class MRPJobResult(_RunModel):
    """Result of the ``MRPJob`` workflow.

    ``output_digests`` is :meth:`RunManifest.output_digests`: ``shards`` (one digest over
    every shard output digest in order, so the result stays small for 10k shards),
    ``reduce`` and ``produced:<path>``; the per-shard digests are in the stored run
    manifest that ``run_manifest_digest`` names (``None`` only if compile failed).
    """

    run_id: str
    job_id: str
    workflow_id: str
    status: RunStatus
    backend: Backend
    run_manifest_digest: str | None = None
    ir_digest: str | None = None
    manifest_digest: str | None = None
    reduce_digest: str | None = None
    output_digests: dict[str, str] = Field(default_factory=dict)
    produced: list[ProducedFileRecord] = Field(default_factory=list)
    output_root: str | None = None
    counters: ShardCounters = Field(default_factory=ShardCounters)
    cost: RunCost = Field(default_factory=RunCost)
    phase_timings: dict[str, float] = Field(default_factory=dict)
    evaluation: EvaluationRecord | None = None
    replay_of: str | None = None
    replay_matched: bool | None = None
    message: str = ""


class ReplayMismatch(_RunModel):
    """The first digest a replay did not reproduce (``where`` is a shard id, ``reduce`` or
    ``produced:<path>``)."""

    where: str
    expected: str | None
    got: str | None


def first_mismatch(
    original: dict[str, str], replayed: dict[str, str], shard_order: list[str]
) -> ReplayMismatch | None:
    """Compare output digests in canonical order: shards by index, then ``reduce``, then
    produced files by path. ``None`` when every digest matches."""
    keys = [*shard_order, "reduce"]
    keys += sorted(k for k in set(original) | set(replayed) if k.startswith("produced:"))
    for key in keys:
        a, b = original.get(key), replayed.get(key)
        if a != b:
            return ReplayMismatch(where=key, expected=a, got=b)
    return None


__all__ = [
    "DEFAULT_WINDOW_SIZE",
    "ERROR_COMPILE",
    "ERROR_PHASE",
    "ERROR_REPLAY_MISMATCH",
    "ERROR_REPLAY_SOURCE",
    "ERROR_SHARD",
    "ERROR_TYPES",
    "WORKFLOW_TYPE",
    "Backend",
    "EvaluationRecord",
    "MRPJobInput",
    "MRPJobResult",
    "Phase",
    "ProducedFileRecord",
    "ReplayMismatch",
    "RunCost",
    "RunManifest",
    "RunRecord",
    "RunStatus",
    "ShardCounters",
    "ShardOutputRecord",
    "ShardRecord",
    "ShardSource",
    "first_mismatch",
    "run_id_from_workflow_id",
    "run_manifest_from_json",
    "workflow_id_for",
]


# ---------------------------------------------------------------------------------------
# SQL records (store/mrp_runs.py reads and writes these)

ShardSource = Literal["computed", "checkpoint", "none"]


class RunRecord(_RunModel):
    """A row of ``mrp_runs``: what ``mrp inspect`` shows first."""

    run_id: str
    workflow_id: str
    job_id: str
    status: RunStatus | Literal["running"]
    backend: Backend
    replay_of: str | None = None
    ir_digest: str | None = None
    manifest_digest: str | None = None
    policy_report_digest: str | None = None
    job_yaml_digest: str | None = None
    run_manifest_digest: str | None = None
    reduce_digest: str | None = None
    output_root: str | None = None
    shard_count: int = 0
    counters: ShardCounters = Field(default_factory=ShardCounters)
    cost: RunCost = Field(default_factory=RunCost)
    phase_timings: dict[str, float] = Field(default_factory=dict)
    error: str | None = None
    created_at: AwareDatetime
    updated_at: AwareDatetime


class ShardRecord(_RunModel):
    """A row of ``mrp_shards``: one map shard of one run.

    ``source`` is ``computed`` (the operator ran in this run), ``checkpoint`` (the output
    came from the checkpoint index) or ``none`` (no output: failed). ``executions`` counts
    operator runs that finished in this run; ``attempts`` counts every try, failed ones too.
    """

    run_id: str
    shard_index: int = Field(ge=0)
    shard_id: str
    input_digest: str
    checkpoint_key: str
    output_digest: str | None = None
    state: Literal["succeeded", "failed"]
    source: ShardSource
    attempts: int = 0
    executions: int = 0
    latency_ms: float = 0.0
    cost_units: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)
    error: str | None = None
    updated_at: AwareDatetime
