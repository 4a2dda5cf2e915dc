"""Timeouts and retry policies for every activity call: the one place they live."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

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
