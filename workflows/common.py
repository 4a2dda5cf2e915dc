"""How workflows call activities: one ``call``, and the timeouts and retry policies of
every activity in one table (``OPTIONS``), keyed by the activity's name.

A workflow names an activity by its :class:`keel.refs.ActivityRef` (declared beside the
family's models in ``keel/``), so it never imports the module that implements it. A call
site says only what is its own: the input, the summary shown in the Web UI, and, where a
limit is computed from the input (an MRP window), that limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from keel.design.steps import ERROR_DESIGN_CONFIG, ERROR_DESIGN_CONFLICT, ERROR_DESIGN_INPUT
    from keel.mrp.run import ERROR_COMPILE, ERROR_PHASE, ERROR_REPLAY_SOURCE, ERROR_SHARD
    from keel.refs import ActivityRef
    from keel.srl.steps import ERROR_SRL_TASKS

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")

RECORD_TIMEOUT = timedelta(seconds=30)
RECORD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # a record must land: SQL outages are waited out
)

WEBHOOK_TIMEOUT = timedelta(seconds=20)
WEBHOOK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(minutes=1),
    maximum_attempts=6,
    non_retryable_error_types=["WebhookRejected", "WebhookMisconfigured"],
)

# A look at the worker's own settings (``notify.has_target``): nothing to wait out.
CONFIG_TIMEOUT = timedelta(seconds=10)
CONFIG_RETRY = RetryPolicy(maximum_attempts=3)

LLM_TIMEOUT = timedelta(minutes=3)
LLM_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
)

# .rllm apps (workflows/rllm.py). Loading reads files and imports nothing slow.
RLLM_LOAD_TIMEOUT = timedelta(seconds=60)
RLLM_LOAD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
# A block's own limits (configs/sandbox.yaml) end it well before this.
RLLM_BLOCK_TIMEOUT = timedelta(minutes=2)
RLLM_BLOCK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=3,
)
# Pulling an Ollama model can take many minutes; progress comes as heartbeats.
RLLM_OLLAMA_TIMEOUT = timedelta(hours=1)
RLLM_OLLAMA_HEARTBEAT = timedelta(minutes=2)
RLLM_OLLAMA_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)

# MRP jobs (workflows/mrp.py). Their own errors (compile refused, shard over its retry
# cap, phase failed) are final; anything else (a worker lost, a store outage) is retried.
MRP_COMPILE_TIMEOUT = timedelta(minutes=10)
# Compile heartbeats while it scans the inputs (activities/mrp/activities.py, every 5 s).
MRP_COMPILE_HEARTBEAT = timedelta(seconds=30)
MRP_COMPILE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_COMPILE, ERROR_REPLAY_SOURCE],
)
# A window's start-to-close depends on its job (workflows/mrp.py ``window_timeout``) and
# is passed by the call; this one applies only to a call that passes none.
MRP_WINDOW_TIMEOUT = timedelta(minutes=30)
MRP_WINDOW_HEARTBEAT = timedelta(seconds=10)
MRP_WINDOW_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=[ERROR_SHARD, ERROR_COMPILE],
)
# reduce, evaluate, produce.
MRP_PHASE_TIMEOUT = timedelta(minutes=30)
MRP_PHASE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_PHASE, ERROR_COMPILE],
)
MRP_FINALISE_TIMEOUT = timedelta(minutes=5)
MRP_FINALISE_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # the record must land
)

# SRL (workflows/srl.py). A task file that does not validate is final; a model or actor
# outage is waited out with backoff, and a step's record must land.
SRL_WINDOW_TIMEOUT = timedelta(minutes=2)
SRL_WINDOW_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_SRL_TASKS],
)
SRL_GENERATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=10,
    non_retryable_error_types=[ERROR_SRL_TASKS],  # the gateway marks its own final errors
)
SRL_APPLY_TIMEOUT = timedelta(minutes=5)
# Both step activities heartbeat every 2 s (activities/srl/episode.py): a lost worker's
# step is retried elsewhere after this, not after the whole start-to-close limit.
SRL_HEARTBEAT = timedelta(seconds=10)
SRL_APPLY_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,
    non_retryable_error_types=[ERROR_SRL_TASKS],
)
# ``srl.episodes`` (a batch of episodes, keel/srl/batch.py): a step's answer and scoring,
# at most twice (the batch's calls wait for the worker's call gate), for each of
# ``max_steps`` (the workflow passes ``SRL_EPISODES_STEP_TIMEOUT * max_steps``; the row's
# limit is one step's); a lost worker is found by its heartbeat. A model down for long
# fails the batch after its attempts: its episodes count as failed, as their children
# would (their recorded steps stay for a run again).
SRL_EPISODES_STEP_TIMEOUT = 2 * (LLM_TIMEOUT + SRL_APPLY_TIMEOUT)
SRL_EPISODES_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_SRL_TASKS],
)

# Design pipelines (workflows/design/). Bad configs/design data or a bad input is final;
# the intake retries only a model it cannot reach (a reply that does not fit is re-asked
# in the activity, then becomes questions: activities/design/pipeline.py).
DESIGN_LOAD_TIMEOUT = timedelta(seconds=30)
DESIGN_LOAD_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_DESIGN_CONFIG, ERROR_DESIGN_INPUT],
)
DESIGN_INTAKE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=5,
    non_retryable_error_types=[ERROR_DESIGN_INPUT],
)
# Rendering is quick; a provider that writes the repository with a model is not.
DESIGN_CODEGEN_TIMEOUT = timedelta(minutes=10)
DESIGN_CODEGEN_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
    non_retryable_error_types=[ERROR_DESIGN_INPUT],
)
# The validators run the generated repository's ruff, mypy and pytest in the sandbox.
DESIGN_VALIDATE_TIMEOUT = timedelta(minutes=15)
DESIGN_VALIDATE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=2),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
DESIGN_HEARTBEAT = timedelta(seconds=30)
DESIGN_PERSIST_TIMEOUT = timedelta(minutes=2)
DESIGN_PERSIST_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=500),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=0,  # the record must land; a lost version race is final
    non_retryable_error_types=[ERROR_DESIGN_CONFLICT],
)


@dataclass(frozen=True, slots=True)
class Options:
    """Limits of one activity: start-to-close, retry policy, heartbeat (long ones only)."""

    start_to_close: timedelta
    retry: RetryPolicy
    heartbeat: timedelta | None = None


#: Every activity's limits, by activity name. A family adds its rows here (see
#: docs/architecture.md); ``call`` refuses a name that has none.
OPTIONS: dict[str, Options] = {
    "llm.complete": Options(LLM_TIMEOUT, LLM_RETRY),
    "records.gate_event": Options(RECORD_TIMEOUT, RECORD_RETRY),
    "notify.webhook": Options(WEBHOOK_TIMEOUT, WEBHOOK_RETRY),
    "notify.has_target": Options(CONFIG_TIMEOUT, CONFIG_RETRY),
    "rllm.load": Options(RLLM_LOAD_TIMEOUT, RLLM_LOAD_RETRY),
    "rllm.generate": Options(LLM_TIMEOUT, LLM_RETRY),
    "rllm.block": Options(RLLM_BLOCK_TIMEOUT, RLLM_BLOCK_RETRY),
    "rllm.record_stats": Options(RECORD_TIMEOUT, RECORD_RETRY),
    "rllm.ollama_ensure": Options(
        RLLM_OLLAMA_TIMEOUT, RLLM_OLLAMA_RETRY, heartbeat=RLLM_OLLAMA_HEARTBEAT
    ),
    "mrp.compile": Options(MRP_COMPILE_TIMEOUT, MRP_COMPILE_RETRY, heartbeat=MRP_COMPILE_HEARTBEAT),
    "mrp.map_window": Options(MRP_WINDOW_TIMEOUT, MRP_WINDOW_RETRY, heartbeat=MRP_WINDOW_HEARTBEAT),
    "mrp.reduce": Options(MRP_PHASE_TIMEOUT, MRP_PHASE_RETRY),
    "mrp.evaluate": Options(MRP_PHASE_TIMEOUT, MRP_PHASE_RETRY),
    "mrp.produce": Options(MRP_PHASE_TIMEOUT, MRP_PHASE_RETRY),
    "mrp.finalise": Options(MRP_FINALISE_TIMEOUT, MRP_FINALISE_RETRY),
    "srl.window": Options(SRL_WINDOW_TIMEOUT, SRL_WINDOW_RETRY),
    "srl.generate": Options(LLM_TIMEOUT, SRL_GENERATE_RETRY, heartbeat=SRL_HEARTBEAT),
    "srl.apply": Options(SRL_APPLY_TIMEOUT, SRL_APPLY_RETRY, heartbeat=SRL_HEARTBEAT),
    "srl.episodes": Options(SRL_EPISODES_STEP_TIMEOUT, SRL_EPISODES_RETRY, heartbeat=SRL_HEARTBEAT),
    "design.load": Options(DESIGN_LOAD_TIMEOUT, DESIGN_LOAD_RETRY),
    "design.intake_extract": Options(LLM_TIMEOUT, DESIGN_INTAKE_RETRY),
    "design.agent": Options(LLM_TIMEOUT, DESIGN_INTAKE_RETRY),
    "design.codegen": Options(
        DESIGN_CODEGEN_TIMEOUT, DESIGN_CODEGEN_RETRY, heartbeat=DESIGN_HEARTBEAT
    ),
    "design.validate": Options(
        DESIGN_VALIDATE_TIMEOUT, DESIGN_VALIDATE_RETRY, heartbeat=DESIGN_HEARTBEAT
    ),
    "design.repair": Options(
        DESIGN_CODEGEN_TIMEOUT, DESIGN_CODEGEN_RETRY, heartbeat=DESIGN_HEARTBEAT
    ),
    "design.persist": Options(DESIGN_PERSIST_TIMEOUT, DESIGN_PERSIST_RETRY),
}


def options_of(ref: ActivityRef[In, Out]) -> Options:
    try:
        return OPTIONS[ref.name]
    except KeyError:
        raise KeyError(f"no limits for activity {ref.name!r}: add a row to OPTIONS") from None


async def call(
    ref: ActivityRef[In, Out],
    arg: In,
    *,
    summary: str | None = None,
    local: bool = False,
    start_to_close: timedelta | None = None,
    cancellation_type: ActivityCancellationType = ActivityCancellationType.TRY_CANCEL,
) -> Out:
    """Run the activity ``ref`` with its limits from ``OPTIONS`` and return its result.

    ``local`` runs it as a local activity (a step that only reads files or writes one
    row, where the extra round trip through the server is most of its cost).
    ``start_to_close`` replaces the table's limit for a call whose limit depends on its
    input.
    """
    opts = options_of(ref)
    timeout = start_to_close or opts.start_to_close
    if local:
        return await workflow.execute_local_activity(
            ref.name,
            arg,
            result_type=ref.output,
            start_to_close_timeout=timeout,
            retry_policy=opts.retry,
            cancellation_type=cancellation_type,
            summary=summary,
        )
    return await workflow.execute_activity(
        ref.name,
        arg,
        result_type=ref.output,
        start_to_close_timeout=timeout,
        retry_policy=opts.retry,
        heartbeat_timeout=opts.heartbeat,
        cancellation_type=cancellation_type,
        summary=summary,
    )


def failure_cause(err: BaseException) -> ApplicationError | None:
    """The ``ApplicationError`` an activity or child workflow failed with, if any.

    ``err`` itself when it is one; ``None`` for a timeout, a cancel or a lost worker,
    which have no type or payload of the family's to pass on.
    """
    cause = err.cause if isinstance(err, ActivityError | ChildWorkflowError) else err
    return cause if isinstance(cause, ApplicationError) else None
