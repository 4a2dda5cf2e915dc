"""MRP's activities as a workflow sees them: their inputs, outputs and references.

``workflows/mrp.py`` calls each through its reference (``workflows.common.call``);
``activities/mrp`` implements each under the same name. Pure models: no I/O.
"""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field

from keel.mrp.dsl import SinkSpec
from keel.mrp.ir import ApprovalTask, BudgetPlan, EvaluateTask, RuntimeLimits
from keel.mrp.run import (
    Backend,
    EvaluationRecord,
    ProducedFileRecord,
    ReplayMismatch,
    RunCost,
    RunStatus,
    ShardCounters,
)
from keel.refs import ActivityRef


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CompileInput(_Model):
    job_yaml: str
    source: str = ""
    base_dir: str = ""
    run_id: str
    workflow_id: str
    backend: Backend
    replay_of: str | None = None


class CompiledJob(_Model):
    """What the workflow needs from compile: digests, limits, budget, the steps it has."""

    run_id: str
    job_id: str
    ir_digest: str
    manifest_digest: str
    policy_report_digest: str
    job_yaml_digest: str
    shard_count: int
    limits: RuntimeLimits
    budget: BudgetPlan
    evaluate: EvaluateTask | None
    approval: ApprovalTask | None
    sink: SinkSpec
    output_root: str
    # The input files' digests (path -> digest). Results since 2026-12-08 leave this empty
    # and name the same mapping stored as one JSON object instead (``input_files_digest``):
    # at 100 bytes a file, a job of 20,000 files put 2 MB in this result, and again in
    # finalise's input, over what Temporal takes in one payload.
    input_file_digests: dict[str, str] = Field(default_factory=dict)
    input_files_digest: str | None = None
    replay_of: str | None = None
    map_operator: str
    # Malformed records left out under ``inputs.on_malformed: skip`` (full list in the
    # store), for the run manifest.
    skipped_records: int = 0
    skipped_records_digest: str | None = None
    # CPUs the run's backend has where compile ran (a joined Ray cluster's CPU resources,
    # else the worker machine's): how many map windows the workflow keeps in flight
    # (patch mrp-windows-per-cpu). None in histories recorded before it.
    backend_cpus: int | None = Field(default=None, ge=1)


class MapWindowInput(_Model):
    run_id: str
    workflow_id: str
    ir_digest: str
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    backend: Backend
    parallelism: int = Field(ge=1)
    remaining_units: Decimal | None = None
    remaining_usd: Decimal | None = None
    use_checkpoints: bool = True
    llm_replay_only: bool = False
    # map.min_success_ratio < 1 (patch mrp-min-success-ratio): a shard that fails for good
    # is recorded and the window goes on, instead of failing the window.
    tolerate_failures: bool = False


class MapWindowResult(_Model):
    start: int
    end: int
    counters: ShardCounters
    cost_units: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)
    llm_calls: int = 0
    llm_cached: int = 0
    stopped_by_budget: bool = False
    elapsed_s: float = 0.0
    # With tolerate_failures: the shards that failed for good (ids; errors are in SQL).
    failed_shards: list[str] = Field(default_factory=list)
    # Record shards computed by this window: (shard index, bytes of its input file the
    # shard read: a Parquet shard's footer and column chunks, a text shard's chunk).
    input_bytes: list[tuple[int, int]] = Field(default_factory=list)


class PhaseInput(_Model):
    run_id: str
    workflow_id: str
    ir_digest: str
    llm_replay_only: bool = False


class ReduceResult(_Model):
    reduce_digest: str
    cost_units: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)


class EvaluateInput(PhaseInput):
    reduce_digest: str


class EvaluateResult(_Model):
    evaluation: EvaluationRecord
    cost_units: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)


class ProduceInput(PhaseInput):
    reduce_digest: str
    output_root: str


class ProduceOutput(_Model):
    files: list[ProducedFileRecord]
    produce_result_digest: str
    rows: int
    cost_units: Decimal = Decimal(0)
    cost_usd: Decimal = Decimal(0)


class FinaliseInput(_Model):
    compiled: CompiledJob
    workflow_id: str
    backend: Backend
    status: RunStatus
    partial: bool = False
    counters: ShardCounters
    cost: RunCost
    phase_timings: dict[str, float] = Field(default_factory=dict)
    reduce_digest: str | None = None
    evaluation: EvaluationRecord | None = None
    produced: list[ProducedFileRecord] = Field(default_factory=list)
    produce_result_digest: str | None = None
    error: str | None = None


class FinaliseResult(_Model):
    run_manifest_digest: str
    output_digests: dict[str, str]
    counters: ShardCounters
    mismatch: ReplayMismatch | None = None


COMPILE: ActivityRef[CompileInput, CompiledJob] = ActivityRef(
    "mrp.compile", CompileInput, CompiledJob
)
MAP_WINDOW: ActivityRef[MapWindowInput, MapWindowResult] = ActivityRef(
    "mrp.map_window", MapWindowInput, MapWindowResult
)
REDUCE: ActivityRef[PhaseInput, ReduceResult] = ActivityRef("mrp.reduce", PhaseInput, ReduceResult)
EVALUATE: ActivityRef[EvaluateInput, EvaluateResult] = ActivityRef(
    "mrp.evaluate", EvaluateInput, EvaluateResult
)
PRODUCE: ActivityRef[ProduceInput, ProduceOutput] = ActivityRef(
    "mrp.produce", ProduceInput, ProduceOutput
)
FINALISE: ActivityRef[FinaliseInput, FinaliseResult] = ActivityRef(
    "mrp.finalise", FinaliseInput, FinaliseResult
)
