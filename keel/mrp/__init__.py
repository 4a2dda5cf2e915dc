"""MRP jobs (Map -> Reduce -> Produce): the pure compiler, policy and accounting.

A job is a YAML file (DSL v0.1, ``docs/mrp-dsl.md``). :func:`compile_job` turns it into an
IR of map tasks, one reduce task and one produce task, a manifest and a policy report, or
fails closed with :class:`DslError` or :class:`PolicyViolation`. Nothing here does I/O:
the ``MRPJob`` workflow and its activities read files, run operators and store outputs.
"""

from keel.mrp.budget import (
    BudgetLimits,
    BudgetState,
    BudgetTracker,
    CostEstimate,
    CostLine,
    estimate_cost,
    kill_limits,
)
from keel.mrp.compiler import CompileResult, compile_job, compile_parsed
from keel.mrp.dsl import DSL_VERSION, JobSpec, ParsedJob, SinkKind, parse_job
from keel.mrp.errors import (
    BudgetExceeded,
    DslError,
    DslIssue,
    MrpError,
    RegistryError,
)
from keel.mrp.ir import (
    IR_VERSION,
    JobIR,
    Manifest,
    MapTask,
    ProduceTask,
    ReduceTask,
    checkpoint_key,
    ir_from_json,
    manifest_from_json,
    verify_manifest,
)
from keel.mrp.normalize import (
    FileRef,
    NormalizedJob,
    ShardInput,
    decimal_mean,
    decimal_sum,
    derive_job_seed,
    derive_seed,
    float_mean,
    float_sum,
    in_shard_order,
    normalize_job,
    shard_seed,
)
from keel.mrp.policy import RULES, Caps, PolicyReport, PolicyViolation, Violation, admit
from keel.mrp.records import MalformedRecord, RecordSlice
from keel.mrp.registry import AllowEntry, LlmEstimate, OperatorKind, OperatorSpec, Registry

__all__ = [
    "DSL_VERSION",
    "IR_VERSION",
    "RULES",
    "AllowEntry",
    "BudgetExceeded",
    "BudgetLimits",
    "BudgetState",
    "BudgetTracker",
    "Caps",
    "CompileResult",
    "CostEstimate",
    "CostLine",
    "DslError",
    "DslIssue",
    "FileRef",
    "JobIR",
    "JobSpec",
    "LlmEstimate",
    "MalformedRecord",
    "Manifest",
    "MapTask",
    "MrpError",
    "NormalizedJob",
    "OperatorKind",
    "OperatorSpec",
    "ParsedJob",
    "PolicyReport",
    "PolicyViolation",
    "ProduceTask",
    "RecordSlice",
    "ReduceTask",
    "Registry",
    "RegistryError",
    "ShardInput",
    "SinkKind",
    "Violation",
    "admit",
    "checkpoint_key",
    "compile_job",
    "compile_parsed",
    "decimal_mean",
    "decimal_sum",
    "derive_job_seed",
    "derive_seed",
    "estimate_cost",
    "float_mean",
    "float_sum",
    "in_shard_order",
    "ir_from_json",
    "kill_limits",
    "manifest_from_json",
    "normalize_job",
    "parse_job",
    "shard_seed",
    "verify_manifest",
]
