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
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from pydantic import BaseModel

    from keel.refs import ActivityRef

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
    "rllm.load": Options(RLLM_LOAD_TIMEOUT, RLLM_LOAD_RETRY),
    "rllm.generate": Options(LLM_TIMEOUT, LLM_RETRY),
    "rllm.block": Options(RLLM_BLOCK_TIMEOUT, RLLM_BLOCK_RETRY),
    "rllm.record_stats": Options(RECORD_TIMEOUT, RECORD_RETRY),
    "rllm.ollama_ensure": Options(
        RLLM_OLLAMA_TIMEOUT, RLLM_OLLAMA_RETRY, heartbeat=RLLM_OLLAMA_HEARTBEAT
    ),
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
