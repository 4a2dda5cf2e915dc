"""Client side of the ``RllmApp`` workflow, shared by ``runllm`` and ``POST /rllm/runs``.

Starting a run by type name (no workflow import on the client), reading a finished
run's failure back as an :class:`~keel.rllm.errors.RllmErrorPayload` with its exit code,
and the run's status as one :class:`RllmRunView`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    TimeoutError,
)

from client.temporal import RunStatus, cause_chain, describe_or_none, start_by_type, status_name
from keel.rllm.errors import EXIT_CODES, RllmErrorPayload, error_from_payload
from keel.rllm.failures import internal_failure
from keel.rllm.run import WORKFLOW_TYPE, RllmRunInput, RllmRunResult


class RllmRunView(BaseModel):
    """A run as clients see it: status, and the result or the error payload once it ended."""

    workflow_id: str
    run_id: str | None = None
    status: RunStatus
    result: RllmRunResult | None = None
    error: RllmErrorPayload | None = None
    exit_code: int | None = None


async def start_run(
    client: Client,
    inp: RllmRunInput,
    *,
    workflow_id: str,
    task_queue: str,
    timeout: timedelta | None = None,
    reject_duplicate: bool = False,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle[Any, RllmRunResult]:
    """Start ``RllmApp`` (by type name: no workflow code is imported on the client)."""
    return await start_by_type(
        client,
        WORKFLOW_TYPE,
        inp,
        workflow_id=workflow_id,
        task_queue=task_queue,
        result_type=RllmRunResult,
        execution_timeout=timeout,
        reject_duplicate=reject_duplicate,
        memo=memo,
    )


# Error types of the LLM activities (activities/llm.py ``classify``) that say the model
# endpoint failed: unreachable or overloaded (retry later), or refusing the request.
UPSTREAM_UNAVAILABLE_TYPES = frozenset(
    {"LLMConnectionError", "LLMTimeout", "LLMServerError", "LLMRateLimited", "LLMConflict"}
)
UPSTREAM_REFUSED_TYPES = frozenset({"LLMAuthError", "LLMBadRequest", "LLMError"})


class UpstreamFailure(BaseModel):
    """A run that failed because the model endpoint did (not the app, not Keel)."""

    error_type: str
    retryable: bool
    status_code: int | None = None
    retry_after_s: float | None = None


def upstream_failure(err: BaseException) -> UpstreamFailure | None:
    """The model endpoint's failure that ended a run, or None when something else did."""
    for e in cause_chain(err):
        if not isinstance(e, ApplicationError):
            continue
        kind = e.type or ""
        if kind not in UPSTREAM_UNAVAILABLE_TYPES and kind not in UPSTREAM_REFUSED_TYPES:
            continue
        info = e.details[0] if e.details and isinstance(e.details[0], dict) else {}
        status = info.get("status_code")
        after = info.get("retry_after_s")
        return UpstreamFailure(
            error_type=kind,
            retryable=kind in UPSTREAM_UNAVAILABLE_TYPES,
            status_code=status if isinstance(status, int) else None,
            retry_after_s=float(after) if isinstance(after, int | float) else None,
        )
    return None


def failure_payload(err: BaseException, *, workflow_id: str = "") -> tuple[RllmErrorPayload, int]:
    """The payload and exit code of a failed run (``WorkflowFailureError`` or its causes).

    The workflow (and each child) fails with ``ApplicationError(..., payload, type=...)``;
    the first such error in the cause chain whose detail is an ``.rllm`` payload wins.
    Anything else (a model server that kept failing, a termination, a timeout) becomes
    an internal failure naming the chain.
    """
    chain = cause_chain(err)
    for e in chain:
        if isinstance(e, ApplicationError) and e.details:
            first = e.details[0]
            if isinstance(first, dict) and str(first.get("error_code", "")).startswith("RLLM_"):
                try:
                    rebuilt = error_from_payload(first)
                except ValueError:
                    continue
                return RllmErrorPayload.model_validate(first), EXIT_CODES[type(rebuilt)]
    causes = [
        {
            "type": (e.type if isinstance(e, ApplicationError) and e.type else type(e).__name__),
            "message": str(e),
        }
        for e in chain
        if not isinstance(e, WorkflowFailureError)
    ]
    last = chain[-1]
    kind = "RunFailed"
    if any(isinstance(e, TerminatedError) for e in chain):
        kind = "RunTerminated"
    elif any(isinstance(e, CancelledError) for e in chain):
        kind = "RunCanceled"
    elif any(isinstance(e, TimeoutError) for e in chain):
        kind = "RunTimedOut"
    failure = internal_failure(
        f"the run {workflow_id} failed outside the app: {causes[-1]['type'] if causes else type(last).__name__}: {last}",
        error_type=kind,
        details={"workflow_id": workflow_id, "causes": causes},
        hint="Read details.causes (innermost last) and the worker's log; model server "
        "errors are retried by Temporal before they end a run.",
    )
    return failure.payload, failure.exit_code


async def run_view(client: Client, workflow_id: str) -> RllmRunView | None:
    """The run's status and outcome; None when there is no ``RllmApp`` run with that id."""
    desc = await describe_or_none(client, workflow_id, WORKFLOW_TYPE)
    if desc is None:
        return None
    handle = client.get_workflow_handle(workflow_id, result_type=RllmRunResult)
    status = status_name(desc)
    view = RllmRunView(workflow_id=workflow_id, run_id=desc.run_id, status=status)
    if status == "running":
        return view
    try:
        view.result = await handle.result()
        view.exit_code = 0
    except WorkflowFailureError as err:
        view.error, view.exit_code = failure_payload(err, workflow_id=workflow_id)
    return view
