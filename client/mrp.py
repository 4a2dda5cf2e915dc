"""Client side of the ``MRPJob`` workflow, shared by the ``mrp`` CLI and ``/mrp/jobs``.

Starting a run by type name (no workflow code imported on the client), reading why a run
failed (the workflow fails with an ``ApplicationError`` whose ``type`` is one of
:data:`keel.mrp.run.ERROR_TYPES`), and one :class:`MrpJobView` of a run built from the SQL
run records (``store/mrp_runs.py``) and, for what they do not hold yet, from Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import (
    Client,
    WorkflowFailureError,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    TypedSearchAttributes,
)
from temporalio.exceptions import ApplicationError

from client.temporal import (
    ENDED_WITHOUT_RESULT,
    cause_chain,
    describe_or_none,
    start_by_type,
    status_name,
)
from client.waiting import LocalServicesLike, wait_watching, watch_services
from keel.digest import digest_bytes
from keel.mrp.dsl import ParsedJob, parse_job
from keel.mrp.errors import DslError, DslIssue, InputsRefused
from keel.mrp.policy import Caps, input_source_findings
from keel.mrp.run import (
    ERROR_TYPES,
    MAX_JOB_INPUT_BYTES,
    WORKFLOW_TYPE,
    Backend,
    MRPJobInput,
    MRPJobResult,
    RunCost,
    RunManifest,
    ShardCounters,
    run_id_from_workflow_id,
    run_manifest_from_json,
    workflow_id_for,
)
from keel.problems import at_path
from keel.search_attributes import RUN_ID_ATTRIBUTE
from store.artifacts import ArtifactStore
from store.mrp_runs import RunRecord, get_run, list_shards, shard_counts

ViewStatus = Literal[
    "running",
    "succeeded",
    "failed",
    "budget_exceeded",
    "rejected",
    "expired",
    "evaluation_failed",
    "canceled",
    "terminated",
    "timed_out",
]

_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
RUN_ID_KEY = SearchAttributeKey.for_keyword(RUN_ID_ATTRIBUTE)


class MrpJobView(BaseModel):
    """A run as clients see it (``GET /mrp/jobs/{run_id}``, ``mrp run`` progress)."""

    run_id: str
    workflow_id: str
    job_id: str
    status: ViewStatus
    backend: str | None = None
    shards_total: int = 0
    shards_done: int = 0
    counters: ShardCounters = Field(default_factory=ShardCounters)
    cost: RunCost = Field(default_factory=RunCost)
    manifest_digest: str | None = None
    run_manifest_digest: str | None = None
    ir_digest: str | None = None
    reduce_digest: str | None = None
    output_digests: dict[str, str] = Field(default_factory=dict)
    phase_timings: dict[str, float] = Field(default_factory=dict)
    replay_of: str | None = None
    error_type: str | None = None
    error: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


async def start_job(
    client: Client,
    inp: MRPJobInput,
    *,
    workflow_id: str,
    task_queue: str,
    reject_duplicate: bool = False,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle[Any, MRPJobResult]:
    """Start ``MRPJob`` by type name; the same JSON ``temporal workflow start`` sends."""
    return await start_by_type(
        client,
        WORKFLOW_TYPE,
        inp,
        workflow_id=workflow_id,
        task_queue=task_queue,
        result_type=MRPJobResult,
        search_attributes=TypedSearchAttributes(
            [SearchAttributePair(RUN_ID_KEY, run_id_from_workflow_id(workflow_id))]
        ),
        reject_duplicate=reject_duplicate,
        memo=memo,
    )


class FilesNeedBaseDir(ValueError):
    """A job whose ``inputs.files`` names files on the worker, started without a base_dir."""


def job_input(
    text: str,
    source: str,
    base_dir: str,
    *,
    run_id: str = "",
    backend: Backend | None = None,
    window_size: int | None = None,
) -> tuple[MRPJobInput, str, list[str] | None]:
    """The ``MRPJob`` input of job ``text`` (``source``: its file name), its job id, and
    its approval gate's approvers (None: it has no gate). Parsed only: policy and operator
    checks happen in the run's compile step.

    Raises:
        keel.mrp.errors.DslError: ``text`` is not a valid job, or too big a one to start
            (:data:`keel.mrp.run.MAX_JOB_INPUT_BYTES`).
        FilesNeedBaseDir: its ``inputs.files`` names files on the worker and there is no
            ``base_dir``: the worker would resolve them in its own working directory
            (``s3://`` inputs need none: ``caps.allowed_input_prefixes`` decides those).
    """
    spec = parse_job(text, source).spec
    if not base_dir and any("://" not in p for p in spec.inputs.files or []):
        raise FilesNeedBaseDir(f"{source}: inputs.files names files on the worker")
    inp = MRPJobInput(
        job_yaml=text,
        source=source,
        base_dir=base_dir,
        run_id=run_id,
        backend=backend,
        window_size=window_size,
    )
    refuse_oversized(inp)
    approvers = list(spec.approval.approvers) if spec.approval is not None else None
    return inp, spec.job_id, approvers


def refuse_oversized(inp: MRPJobInput) -> None:
    """Raise :class:`DslError` when ``inp`` is too big to start a run
    (:data:`keel.mrp.run.MAX_JOB_INPUT_BYTES`), instead of the server's "Blob data size
    exceeds limit" after the job was checked and accepted."""
    size = len(inp.model_dump_json().encode("utf-8"))
    if size <= MAX_JOB_INPUT_BYTES:
        return
    raise DslError(
        [
            DslIssue(
                path="",
                line=None,
                message=(
                    f"the job is {size:,} bytes as the run's input, over the "
                    f"{MAX_JOB_INPUT_BYTES:,} a Temporal payload may carry here: put long "
                    "item lists in a file (inputs.files, one JSON record a line) instead "
                    "of inputs.items"
                ),
            )
        ],
        inp.source,
    )


def failure_of(err: BaseException) -> tuple[str, str]:
    """``(type, message)`` of a failed run: the first ``ApplicationError`` in the cause chain
    whose type is one of :data:`ERROR_TYPES`, else the innermost error."""
    chain = cause_chain(err)
    for e in chain:
        if isinstance(e, ApplicationError) and e.type in ERROR_TYPES:
            return str(e.type), e.message
    inner = [e for e in chain if not isinstance(e, WorkflowFailureError)] or chain
    last = inner[-1]
    kind = last.type if isinstance(last, ApplicationError) and last.type else type(last).__name__
    return str(kind), str(getattr(last, "message", "") or last)


async def find_workflow_id(client: Client, run_id: str) -> str | None:
    """The workflow id of a run the SQL records do not know yet (compile not finished, or
    compile failed): the newest ``MRPJob`` started with search attribute
    ``KeelMrpRunId = run_id``, in one visibility query.

    One query, no polling: an unknown id is answered at once. Temporal's visibility lags
    a start by a moment, so a run started just now is surely found by its workflow id
    (which ``POST /mrp/jobs`` answers); runs started without the attribute (by hand with
    ``temporal workflow start``) are found once their compile step has written the record.
    """
    if not _RUN_ID.fullmatch(run_id):
        return None  # cannot be a run id, and must not reach the query text
    query = f'WorkflowType = "{WORKFLOW_TYPE}" AND {RUN_ID_ATTRIBUTE} = "{run_id}"'
    async for wf in client.list_workflows(query, limit=1):
        return str(wf.id)
    return None


async def job_view(
    client: Client | None,
    sessions: sessionmaker[Session],
    ref: str,
    store: ArtifactStore | None = None,
) -> MrpJobView | None:
    """The run named by ``ref`` (a run id, or a workflow id ``mrp/<job>/<run>``), or None.

    The SQL record gives digests, counters and cost; while it is running the shard rows
    give progress; the stored run manifest (when ``store`` is given) gives the output
    digests of a finished run; Temporal (when ``client`` is given) gives the outcome of
    runs the records do not cover (a compile failure, a termination).
    """
    run_id = run_id_from_workflow_id(ref)
    record = await asyncio.to_thread(get_run, sessions, run_id)
    workflow_id = record.workflow_id if record is not None else None
    if workflow_id is None and ref.startswith("mrp/"):
        workflow_id = ref
    if workflow_id is None and client is not None:
        workflow_id = await find_workflow_id(client, run_id)
    if record is None and workflow_id is None:
        return None
    desc = (
        await describe_or_none(client, workflow_id, WORKFLOW_TYPE)
        if client is not None and workflow_id
        else None
    )
    if record is not None:
        view = await _record_view(sessions, record, store)
    elif desc is None:
        return None
    else:
        job_id = workflow_id.split("/")[1] if workflow_id and workflow_id.count("/") >= 2 else ""
        view = MrpJobView(
            run_id=run_id, workflow_id=workflow_id or "", job_id=job_id, status="running"
        )
    if client is not None and desc is not None and desc.status is not None:
        await _with_outcome(client, view, status_name(desc))
    return view


async def _record_view(
    sessions: sessionmaker[Session], record: RunRecord, store: ArtifactStore | None
) -> MrpJobView:
    """The view of a run from its SQL record: shards done from the shard rows while it
    runs, output digests from its stored run manifest (when ``store`` is given) after."""
    view = MrpJobView(
        run_id=record.run_id,
        workflow_id=record.workflow_id,
        job_id=record.job_id,
        status=record.status,
        backend=record.backend,
        shards_total=record.shard_count,
        counters=record.counters,
        cost=record.cost,
        manifest_digest=record.manifest_digest,
        run_manifest_digest=record.run_manifest_digest,
        ir_digest=record.ir_digest,
        reduce_digest=record.reduce_digest,
        phase_timings=record.phase_timings,
        replay_of=record.replay_of,
        error=record.error,
        created_at=record.created_at,
        updated_at=record.updated_at,
    )
    if record.status == "running":
        counts = await asyncio.to_thread(shard_counts, sessions, record.run_id)
        view.shards_done = sum(counts.values())
    else:
        view.shards_done = record.shard_count
        if store is not None and record.run_manifest_digest is not None:
            data = await asyncio.to_thread(store.get_bytes, record.run_manifest_digest)
            view.output_digests = run_manifest_from_json(data).output_digests()
    return view


async def _with_outcome(client: Client, view: MrpJobView, status: str) -> None:
    """``view`` updated with what Temporal says of a run that ended with ``status``: the
    result of a completed run, the failure of a failed one (nothing while it runs)."""
    if status == "completed":
        handle = client.get_workflow_handle(view.workflow_id, result_type=MRPJobResult)
        result: MRPJobResult = await handle.result()
        view.status = result.status
        view.output_digests = dict(result.output_digests)
        view.run_manifest_digest = result.run_manifest_digest or view.run_manifest_digest
        view.manifest_digest = result.manifest_digest or view.manifest_digest
        view.counters = result.counters
        view.cost = result.cost
        view.phase_timings = dict(result.phase_timings) or view.phase_timings
        view.shards_total = result.counters.total or view.shards_total
    elif status in ENDED_WITHOUT_RESULT:
        view.status = status  # type: ignore[assignment]
        if status == "failed":
            try:
                await client.get_workflow_handle(view.workflow_id).result()
            except WorkflowFailureError as err:
                view.error_type, view.error = failure_of(err)


def running_cost(sessions: sessionmaker[Session], run_id: str, cost: RunCost) -> RunCost:
    """``cost`` with units and USD added up from the run's shard rows so far (the run
    record holds the total only once the run has finished)."""
    rows = list_shards(sessions, run_id)
    return cost.model_copy(
        update={
            "units": sum((r.cost_units for r in rows), Decimal(0)),
            "usd": sum((r.cost_usd for r in rows), Decimal(0)),
        }
    )


# -- on this machine: what ``mrp compile`` and ``mrp inspect --download`` decide ----------


def refuse_input_sources(parsed: ParsedJob, caps: Caps) -> None:
    """MRP-P015: refuse a job whose ``inputs.files`` name a source ``caps`` do not allow,
    at the first such path (with its line in the job file), before anything is read.

    Raises:
        keel.mrp.errors.InputsRefused: ``MRP-P015 input source not allowed at <path>
            (line N): <why>``.
    """
    refused = input_source_findings(parsed.spec.inputs, caps)
    if refused:
        path, message = refused[0]
        where = at_path(path, parsed.line(path))
        raise InputsRefused(f"MRP-P015 input source not allowed{where}: {message}")


class HashOnlyStore:
    """Stand-in artifact store for a compile on this machine: digests file bytes, keeps
    nothing (``mrp compile`` resolves the input files as the compile activity does)."""

    def put_bytes(self, data: bytes) -> str:
        return digest_bytes(data)


class OutputMissing(LookupError):
    """A run's output cannot be read (its manifest has no output root, or a file is gone)."""


class OutputCorrupted(ValueError):
    """A run's output file no longer has the digest its run manifest records."""


def download_outputs(
    manifest: RunManifest, store: ArtifactStore, dest: Path
) -> list[dict[str, Any]]:
    """Copy a finished run's produced files, each verified against its recorded digest,
    and its manifests (IR, compile manifest, policy report, run manifest) into ``dest``;
    one ``{"path", "digest"[, "size"]}`` per file written, in that order.

    Raises:
        OutputMissing: no output root, or a produced file cannot be read.
        OutputCorrupted: a produced file's bytes no longer have its digest.
    """
    dest.mkdir(parents=True, exist_ok=True)
    got: list[dict[str, Any]] = []
    if manifest.produced and manifest.output_root is None:
        raise OutputMissing("the run manifest has no output root")
    for f in manifest.produced:
        src = Path(manifest.output_root or "") / f.path
        try:
            data = src.read_bytes()
        except OSError as e:
            raise OutputMissing(f"cannot read output {src}: {e.strerror or e}") from None
        if digest_bytes(data) != f.digest:
            raise OutputCorrupted(f"output {src} no longer has digest {f.digest}")
        target = dest / f.path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        got.append({"path": str(target), "digest": f.digest, "size": f.size})
    for name, digest in (
        ("IR.json", manifest.ir_digest),
        ("manifest.json", manifest.manifest_digest),
        ("policy_report.json", manifest.policy_report_digest),
    ):
        (dest / name).write_bytes(store.get_bytes(digest))
        got.append({"path": str(dest / name), "digest": digest})
    (dest / "run-manifest.json").write_bytes(manifest.to_json())
    got.append({"path": str(dest / "run-manifest.json"), "digest": manifest.digest()})
    return got


# -- a run started from this machine (``mrp run``, ``mrp replay``) --------------------------


async def progress_of(
    client: Client, sessions: sessionmaker[Session], run_id: str, workflow_id: str
) -> tuple[MrpJobView | None, dict[str, Any] | None]:
    """A running run's view (its cost so far added up from the shard rows) and the
    workflow's ``progress`` query (None when it does not answer)."""
    progress: dict[str, Any] | None = None
    with contextlib.suppress(Exception):
        progress = await client.get_workflow_handle(workflow_id).query("progress", result_type=dict)
    view = await job_view(None, sessions, run_id)
    if view is not None and view.status == "running":
        view.cost = await asyncio.to_thread(running_cost, sessions, run_id, view.cost)
    return view, progress


Tick = Callable[[], Awaitable[None]]


async def start_and_wait(
    services: LocalServicesLike,
    inp: MRPJobInput,
    job_id: str,
    *,
    task_queue: str,
    wait: bool,
    keep: bool,
    on_started: Callable[[str], None],
    on_dead: Callable[[str], BaseException],
    progress: Callable[[Client, str], tuple[Tick, Callable[[], None]] | None] | None = None,
) -> tuple[str, MRPJobResult | None, BaseException | None]:
    """Start ``MRPJob`` (``services``: the server and a worker on demand) and, with
    ``wait``, its result or its failure (a ``WorkflowFailureError``): ``(workflow id,
    result, failure)``. ``on_started(workflow_id)`` once it is started; ``on_dead(why)``
    is raised when a service ``services`` started dies; ``progress(client, workflow_id)``
    (called once the wait begins) gives a tick run beside the wait and what to call when
    the wait ends. ``services`` are stopped at the end, left running with ``keep``."""
    try:
        client = await services.connect()
        wid = workflow_id_for(job_id, inp.run_id)
        handle = await start_job(client, inp, workflow_id=wid, task_queue=task_queue)
        on_started(wid)
        await services.ensure_worker(wid, "mrp-worker.log")
        if not wait:
            return wid, None, None
        shown = progress(client, wid) if progress is not None else None
        tick, done = shown if shown is not None else (None, None)
        try:
            result = await wait_watching(
                handle.result(), watch_services(services, on_dead=on_dead, tick=tick)
            )
        except WorkflowFailureError as err:
            return wid, None, err
        finally:
            if done is not None:
                done()
        return wid, result, None
    finally:
        await asyncio.to_thread(services.stop, keep)


def replay_input(record: RunRecord, backend: Backend | None, requester: str) -> MRPJobInput:
    """The input of a replay of the finished run ``record``: a new run id
    (``<run id, 40 chars at most>-replay-<8 hex>``), the run's backend unless ``backend``
    names one, and model answers from the request-digest cache only."""
    return MRPJobInput(
        run_id=f"{record.run_id[:40]}-replay-{uuid.uuid4().hex[:8]}",
        backend=backend or record.backend,
        replay_of=record.run_id,
        llm_replay_only=True,
        requester=requester,
    )
