"""The one way Keel processes talk to Temporal, whatever the family.

:func:`connect` (the pydantic converter always, OpenTelemetry tracing whenever an exporter
is configured), :func:`start_by_type` (no workflow code imported on the client),
:func:`describe_or_none`, :func:`cause_chain` (why a run failed) and :func:`status_name`.
"""

from __future__ import annotations

import sys
from typing import Any, Literal, TypeVar

from temporalio.client import (
    Client,
    Interceptor,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from keel.settings import Settings

R = TypeVar("R")

RunStatus = Literal["running", "completed", "failed", "canceled", "terminated", "timed_out"]

_STATUS: dict[WorkflowExecutionStatus, RunStatus] = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "canceled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    # A run that continued as new goes on under the same workflow id.
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
}

#: Ends that are neither a result nor still running.
ENDED_WITHOUT_RESULT: frozenset[RunStatus] = frozenset(
    {"failed", "canceled", "terminated", "timed_out"}
)

# How far :func:`cause_chain` follows causes: deeper chains are a loop or a bug.
MAX_CAUSES = 16


async def connect(
    settings: Settings, *, address: str | None = None, runtime: Runtime | None = None
) -> Client:
    """Connect to the configured Temporal server (the embedded dev server by default)."""
    kwargs = {"runtime": runtime} if runtime is not None else {}
    interceptors: list[Interceptor] = []
    # Tracing is on when an exporter is configured (workers.telemetry installs the provider)
    # or the process installed an OpenTelemetry SDK provider itself (an embedding app, the
    # tests). Otherwise every span would be dropped, and the import alone costs each CLI
    # call 75-150 ms (bench/cli_latency.py).
    if settings.otel_exporter != "none" or "opentelemetry.sdk.trace" in sys.modules:
        from temporalio.contrib.opentelemetry import TracingInterceptor

        interceptors.append(TracingInterceptor())
    return await Client.connect(
        address or settings.resolved_temporal_address,
        namespace=settings.temporal_namespace,
        data_converter=pydantic_data_converter,
        interceptors=interceptors,
        **kwargs,  # type: ignore[arg-type]
    )


def status_name(desc: WorkflowExecutionDescription) -> RunStatus:
    """The run's status as Keel's clients name it (``running`` while Temporal has none)."""
    return _STATUS.get(desc.status, "running") if desc.status is not None else "running"


async def start_by_type(
    client: Client,
    workflow_type: str,
    arg: Any,
    *,
    workflow_id: str,
    task_queue: str,
    result_type: type[R],
    reject_duplicate: bool = False,
    memo: dict[str, Any] | None = None,
    search_attributes: TypedSearchAttributes | None = None,
    **kwargs: Any,
) -> WorkflowHandle[Any, R]:
    """Start ``workflow_type`` by name: the same JSON ``temporal workflow start`` sends,
    with no workflow code imported on the client."""
    if search_attributes is not None:
        kwargs["search_attributes"] = search_attributes
    return await client.start_workflow(
        workflow_type,
        arg,
        id=workflow_id,
        task_queue=task_queue,
        result_type=result_type,
        id_reuse_policy=(
            WorkflowIDReusePolicy.REJECT_DUPLICATE
            if reject_duplicate
            else WorkflowIDReusePolicy.ALLOW_DUPLICATE
        ),
        memo=memo,
        **kwargs,
    )


async def describe_or_none(
    client: Client, workflow_id: str, workflow_type: str | None = None
) -> WorkflowExecutionDescription | None:
    """``describe()`` of the workflow, or None when there is none with that id (or, with
    ``workflow_type``, none of that type)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        # INVALID_ARGUMENT: an id Temporal cannot even look up (too long, bad characters).
        if err.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            return None
        raise
    if workflow_type is not None and desc.workflow_type != workflow_type:
        return None
    return desc


def cause_chain(err: BaseException) -> list[BaseException]:
    """``err`` and its causes, outermost first: Temporal's ``.cause`` (a workflow's failure,
    an activity's error inside it) or else Python's ``__cause__``."""
    out: list[BaseException] = []
    cur: BaseException | None = err
    while cur is not None and len(out) < MAX_CAUSES:
        out.append(cur)
        cur = getattr(cur, "cause", None) or cur.__cause__
    return out
