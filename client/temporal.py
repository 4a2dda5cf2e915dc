"""The one way Keel processes talk to Temporal, whatever the family.

:func:`connect` (the pydantic converter always, OpenTelemetry tracing whenever an exporter
is configured), :func:`start_by_type` (no workflow code imported on the client),
:func:`describe_or_none`, :func:`cause_chain` (why a run failed) and :func:`status_name`.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from temporalio.client import (
    Client,
    Interceptor,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RPCError, RPCStatusCode

from keel.access import ACCESS_MEMO, RunAccess, readers_of
from keel.search_attributes import READERS_ATTRIBUTE
from keel.settings import Settings

R = TypeVar("R")

#: Who may read a workflow over the API (``keel.access.readers_of``), a KeywordList.
READERS_KEY = SearchAttributeKey.for_keyword_list(READERS_ATTRIBUTE)

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


def readers_pair(access: RunAccess) -> SearchAttributePair[Sequence[str]]:
    """The ``KeelReaders`` search attribute of a workflow with ``access``."""
    return SearchAttributePair(READERS_KEY, readers_of(access))


def with_readers(
    search_attributes: TypedSearchAttributes | None, memo: dict[str, Any] | None
) -> TypedSearchAttributes | None:
    """``search_attributes`` plus ``KeelReaders`` from the access record in ``memo``
    (:data:`keel.access.ACCESS_MEMO`), so visibility can answer "the caller's runs" in one
    query; unchanged when the memo holds none (a run only ``admin`` reads)."""
    access = (memo or {}).get(ACCESS_MEMO)
    if isinstance(access, dict):
        access = RunAccess.model_validate(access)
    if not isinstance(access, RunAccess):
        return search_attributes
    pairs = [p for p in (search_attributes or TypedSearchAttributes.empty) if p.key != READERS_KEY]
    return TypedSearchAttributes([*pairs, readers_pair(access)])


def quoted(value: str) -> str:
    """``value`` as a visibility query string literal."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def readers_clause(terms: Sequence[str] | None) -> str | None:
    """The visibility filter for a caller whose rows carry one of ``terms`` in
    ``KeelReaders`` (``keel.access.reader_terms``); None (no filter) for ``admin``."""
    if terms is None:
        return None
    return f"{READERS_ATTRIBUTE} IN ({', '.join(quoted(t) for t in terms)})"


class BadPageToken(ValueError):
    """A ``page_token`` that is not one this API handed out."""


def encode_page_token(token: bytes | None) -> str | None:
    """Temporal's next-page token as the API hands it out (opaque URL-safe base64)."""
    return base64.urlsafe_b64encode(token).decode().rstrip("=") if token else None


def decode_page_token(text: str | None) -> bytes | None:
    """The Temporal token behind an API ``page_token``.

    Raises:
        BadPageToken: not base64, or empty.
    """
    if not text:
        return None
    try:
        token = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        raise BadPageToken("page_token is not one this API handed out") from None
    # Temporal's visibility stores (SQL and Elasticsearch) hand out a JSON object; anything
    # else is refused here, since the server answers some garbage only after its retries.
    try:
        if not isinstance(json.loads(token), dict):
            raise ValueError(token)
    except ValueError:
        raise BadPageToken("page_token is not one this API handed out") from None
    return token


async def list_page(
    client: Client, query: str, *, page_size: int, page_token: bytes | None = None
) -> tuple[Sequence[WorkflowExecution], bytes | None]:
    """One page of visibility rows for ``query`` and the token of the next (None: last).

    Raises:
        BadPageToken: the server refused ``page_token``.
    """
    rows = client.list_workflows(query, page_size=page_size, next_page_token=page_token)
    try:
        await rows.fetch_next_page()
    except RPCError as err:
        refused = (RPCStatusCode.INVALID_ARGUMENT, RPCStatusCode.UNKNOWN)
        if page_token is not None and err.status in refused:
            raise BadPageToken("page_token is not one this API handed out") from None
        raise
    return rows.current_page or [], rows.next_page_token


def status_name(desc: WorkflowExecution) -> RunStatus:
    """The run's status as Keel's clients name it (``running`` while Temporal has none): a
    description's or a visibility row's (``GET /runs``), from the one table of every
    Temporal status above."""
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
    with no workflow code imported on the client. An access record in ``memo`` is also set
    as the ``KeelReaders`` search attribute (:func:`with_readers`)."""
    search_attributes = with_readers(search_attributes, memo)
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
