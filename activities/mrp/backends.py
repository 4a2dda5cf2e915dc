"""Where map shards run: ``ray`` (default) or ``threads``, with the same semantics.

A backend runs one *attempt* of one shard: :func:`execute_shard` loads the shard input from
the artifact store, runs the map operator (under the egress guard, through
``activities.mrp.operators.invoke_map``), stores the output and returns a
:class:`ShardAttempt` with its digest and what it cost. Retries, timeouts, checkpoints and
budgets are the map window's job (``activities/mrp/window.py``); a backend only starts an
attempt and cancels it.

- :class:`ThreadsBackend` runs each attempt in its own daemon thread of the worker
  process. A timed-out attempt is abandoned (Python cannot kill a thread): its result is
  ignored, and the thread ends when the operator returns.
- :class:`RayBackend` runs each attempt on a pooled Ray actor (:class:`ShardRunner`) of the
  worker process's local Ray cluster (``activities.fanout``: loopback only, ``num_cpus``
  from the caps, ``PYTHONPATH`` carrying the repository so Ray workers import
  ``activities``, ``operators`` and test operators). An actor is ready before it gets an
  attempt, so the shard timeout counts the operator's own time; a timed-out or cancelled
  attempt's actor (its process) is killed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from activities import fanout
from activities.mrp.host import ArrowShard, ParquetShard, malformed_error, run_map_batch_in_host
from activities.mrp.llm import LLMCallStats, call_stats, llm_client_for
from activities.mrp.operators import OperatorHandle
from activities.mrp.records import read_slice_counted, read_slice_table, slice_chunks
from keel.digest import canonical_json, digest_bytes
from keel.mrp.normalize import FileRef, ShardInput
from keel.mrp.records import RecordSlice
from keel.mrp.sdk import LLMClient, OperatorContext, OperatorError
from keel.records import LLMCallLog
from keel.settings import Settings
from store.artifacts import PackRef

if TYPE_CHECKING:
    from store.artifacts import ArtifactStore


BackendName = Literal["ray", "threads"]


class ShardTask(BaseModel):
    """One attempt of one map shard: everything a Ray worker or thread needs (picklable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    workflow_id: str
    shard_index: int
    shard_id: str
    input_digest: str
    seed: int
    operator: OperatorHandle
    params: dict[str, JsonValue] = Field(default_factory=dict)
    llm_replay_only: bool = False
    llm_model: str = ""
    attempt: int = 1
    # policy.shard_memory_mb: what the operator's host may allocate for the shard.
    memory_mb: int | None = None
    # Where the input lies in its pack (pack digest, offset, length): JobIR.input_place.
    input_at: tuple[str, int, int] | None = None


class ShardContext(BaseModel):
    """What every shard of one map window shares (sent to each Ray actor once per window)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    workflow_id: str
    operator: OperatorHandle
    params: dict[str, JsonValue] = Field(default_factory=dict)
    llm_replay_only: bool = False
    llm_model: str = ""
    # policy.shard_memory_mb: what the operator's host may allocate for one shard.
    memory_mb: int | None = None


class ShardItem(NamedTuple):
    """One attempt of one shard within a :class:`ShardContext` (small: one per shard)."""

    shard_index: int
    shard_id: str
    input_digest: str
    seed: int
    attempt: int
    # Where the input lies in its pack (``JobIR.input_place``); None: alone, by digest.
    input_at: tuple[str, int, int] | None = None


# Outputs up to this size go back to the window to be packed; larger ones are stored alone.
PACK_MEMBER_MAX = 256 * 1024
# A Ray call's shards go to their host in round trips of at most this many bytes of Arrow
# tables (``batch: arrow``; at least one shard a trip), so a call of many large shards does
# not hold all their tables at once in the actor and the host.
ARROW_CALL_BYTES = 64 * 1024 * 1024


class ShardAttempt(BaseModel):
    """What one attempt did. ``retryable`` is False for failures a retry cannot fix
    (schema violations, egress refused)."""

    model_config = ConfigDict(extra="forbid")

    ok: bool
    output_digest: str | None = None
    # The output's canonical JSON when it is at most PACK_MEMBER_MAX bytes: not stored by
    # the attempt but by its window, in one pack with the window's other outputs (a
    # larger output is stored alone, under ``output_digest``, before the attempt ends).
    output_bytes: bytes | None = None
    error: str | None = None
    retryable: bool = True
    latency_ms: float = 0.0
    units: Decimal = Decimal(0)
    llm_usd: Decimal = Decimal(0)
    llm_calls: int = 0
    llm_cached: int = 0
    # The attempt's model calls, for the activity to record (``llm_calls``, metrics).
    llm_call_logs: list[LLMCallLog] = Field(default_factory=list)
    pid: int = 0
    # The Ray node that ran the attempt (empty under threads).
    node_id: str = ""
    # Of a record shard's input file, the bytes the attempt read (a Parquet shard: the
    # footer and its row groups' column chunks; a text shard: its chunk); 0 otherwise.
    input_bytes: int = 0


# ---------------------------------------------------------------------------------------
# One attempt (runs in a Ray worker process or a worker thread)

_cache_lock = threading.Lock()
_stores: dict[str, ArtifactStore] = {}


def store_for(settings: Settings) -> ArtifactStore:
    """The artifact store of ``settings``, one per process and configuration."""
    from store.artifacts import artifact_store_from_settings

    key = f"{settings.artifact_backend}|{settings.artifacts_dir.resolve()}|{settings.s3_bucket}"
    with _cache_lock:
        store = _stores.get(key)
        if store is None:
            store = artifact_store_from_settings(settings)
            _stores[key] = store
        return store


def file_reader(store: ArtifactStore) -> Any:
    """``ctx.read_file``: input files come from the artifact store, verified by digest."""

    def read(ref: FileRef | dict[str, Any]) -> bytes:
        f = ref if isinstance(ref, FileRef) else FileRef.model_validate(ref)
        return store.get_bytes(f.digest)

    return read


#: Read a batch's packed inputs in one range when it is at most this many times the bytes
#: they need (plus 64 KiB): consecutive shards lie together in their pack.
SPAN_SLACK = 2


def read_shard_inputs(
    store: ArtifactStore, items: Sequence[tuple[str, tuple[str, int, int] | None]]
) -> list[bytes | Exception]:
    """The input bytes of each ``(input_digest, input_at)``, each proved by its digest
    (``ArtifactCorrupted`` otherwise), or the exception reading it raised. The members of
    one pack that lie together are read in one ranged read (a batch's shards are
    consecutive), the others one by one; an input with no place is read alone."""
    out: list[bytes | Exception | None] = [None] * len(items)
    by_pack: dict[str, list[int]] = {}
    for i, (digest, at) in enumerate(items):
        if at is None:
            try:
                out[i] = store.get_bytes(digest)
            except Exception as e:
                out[i] = e
        else:
            by_pack.setdefault(at[0], []).append(i)
    for places in by_pack.values():
        refs = [(PackRef(*at), digest) for digest, at in (items[i] for i in places) if at]
        need = sum(r.length for r, _ in refs)
        try:
            datas: list[bytes | Exception] = list(
                store.get_members(refs, SPAN_SLACK * need + 65536)
            )
        except Exception:
            # One member (or the pack) failed: each member alone, so each shard gets
            # its own bytes or its own error.
            datas = []
            for ref, digest in refs:
                try:
                    datas.append(store.get_member(ref, digest))
                except Exception as e:
                    datas.append(e)
        for i, data in zip(places, datas, strict=True):
            out[i] = data
    return [b if b is not None else RuntimeError("input not read") for b in out]


def _refuse_malformed(records: RecordSlice, bad: list[Any], operator: str) -> None:
    """Under ``on_malformed: fail`` a malformed record fails the shard (not retryable: the
    bytes will not change), naming its file and line or row; under ``skip`` it is left
    out (the run manifest lists it)."""
    if bad and records.on_malformed == "fail":
        raise malformed_error(operator, bad)


def _slice_records(
    records: RecordSlice, store: ArtifactStore, operator: str
) -> tuple[list[dict[str, JsonValue]], int]:
    """A record shard's records for the operator (see :func:`_refuse_malformed`) and the
    input bytes read."""
    got = read_slice_counted(records, store)
    _refuse_malformed(records, got.malformed, operator)
    return got.records, got.bytes_read


def _slice_parquet(
    records: RecordSlice, store: ArtifactStore, operator: str
) -> tuple[ParquetShard | ArrowShard, int]:
    """A Parquet shard for a ``batch: arrow`` operator: its footer and column chunks,
    undecoded, for the host to decode (the floor's work, done once, in the host); as an
    Arrow table decoded here where the chunks cannot be told from the footer. And the
    input bytes read."""
    try:
        got = slice_chunks(records, store)
    except ValueError:
        return _slice_arrow(records, store, operator)
    slice_json = records.model_dump(mode="json", exclude_none=True)
    return ParquetShard(slice_json, got.size, got.ranges), got.bytes_read


def _slice_arrow(
    records: RecordSlice, store: ArtifactStore, operator: str
) -> tuple[ArrowShard, int]:
    """A Parquet shard's records as one Arrow table (IPC bytes) for a ``batch: arrow``
    operator, and the input bytes read."""
    import pyarrow as pa

    got = read_slice_table(records, store)
    _refuse_malformed(records, got.malformed, operator)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, got.table.schema) as writer:
        writer.write_table(got.table)
    return ArrowShard(sink.getvalue()), got.bytes_read


def execute_shard(task: ShardTask, settings: Settings) -> ShardAttempt:
    """Run one attempt of one shard and store its output. Never raises for operator
    failures: they come back as ``ok=False`` with ``retryable`` set."""
    context = ShardContext(
        run_id=task.run_id,
        workflow_id=task.workflow_id,
        operator=task.operator,
        params=task.params,
        llm_replay_only=task.llm_replay_only,
        llm_model=task.llm_model,
        memory_mb=task.memory_mb,
    )
    item = ShardItem(
        task.shard_index, task.shard_id, task.input_digest, task.seed, task.attempt, task.input_at
    )
    return execute_item(context, item, settings)


def _node_id() -> str:
    """The Ray node this process runs on, when it is a Ray worker ("" otherwise)."""
    import sys

    if "ray" not in sys.modules:
        return ""
    import ray

    try:
        return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else ""
    except Exception:
        return ""


def execute_item(context: ShardContext, task: ShardItem, settings: Settings) -> ShardAttempt:
    """:func:`execute_shard` for one item of a window's context."""
    return execute_items(context, [task], settings)[0]


def execute_items(
    context: ShardContext, tasks: list[ShardItem], settings: Settings
) -> list[ShardAttempt]:
    """Attempts of ``tasks`` (shards of one window's context), their operator calls made
    in one host round trip (:func:`~activities.mrp.host.run_map_batch_in_host`); each
    attempt as :func:`execute_shard` makes it, in order."""
    attempts = _execute_items(context, tasks, settings)
    node = _node_id()
    for attempt in attempts:
        attempt.node_id = node
    return attempts


def _localised(context: ShardContext) -> ShardContext:
    """The context with its operator folder as found here: on a joined Ray cluster the
    operator folder is read from the shipped code."""
    folder = fanout.local_path(context.operator.folder)
    if folder != context.operator.folder:
        context = context.model_copy(
            update={"operator": context.operator.model_copy(update={"folder": folder})}
        )
    return context


def _shard_items(
    shard_input: ShardInput, store: ArtifactStore, spec: Any
) -> tuple[list[JsonValue] | ArrowShard | ParquetShard, int]:
    """What the operator is given for a shard (its items, its records, or its files; a
    Parquet shard's records as one Arrow table when the operator says ``batch: arrow``)
    and the input bytes read for it."""
    items: list[JsonValue]
    if shard_input.items is not None:
        items = list(shard_input.items)
    elif shard_input.records is not None:
        if shard_input.records.format == "parquet" and spec.batch == "arrow":
            return _slice_parquet(shard_input.records, store, spec.ref)
        records, read = _slice_records(shard_input.records, store, spec.ref)
        return list(records), read
    else:
        items = [f.model_dump(mode="json") for f in shard_input.files or []]
    return items, 0


class _Prepared(NamedTuple):
    """A shard ready for its operator call: its place in the batch, when its attempt
    started, its LLM client, context and operator input, and the input bytes read."""

    place: int
    t0: float
    llm: LLMClient
    ctx: OperatorContext
    values: list[JsonValue] | ArrowShard | ParquetShard
    input_bytes: int = 0


def _execute_items(
    context: ShardContext, tasks: list[ShardItem], settings: Settings
) -> list[ShardAttempt]:
    context = _localised(context)
    spec = context.operator.spec
    attempts: list[ShardAttempt | None] = [None] * len(tasks)
    ready: list[_Prepared] = []
    arrow_bytes = 0
    store: ArtifactStore | None = None
    inputs: list[bytes | Exception] = []
    try:
        store = store_for(settings)
        inputs = read_shard_inputs(store, [(t.input_digest, t.input_at) for t in tasks])
    except Exception as e:  # the store itself: every shard's attempt is worth a retry
        inputs = [e] * len(tasks)
    for i, task in enumerate(tasks):
        t0 = time.perf_counter()
        llm: LLMClient | None = None
        ctx: OperatorContext | None = None
        try:
            data = inputs[i]
            if isinstance(data, Exception):
                raise data
            assert store is not None
            shard_input = ShardInput.model_validate_json(data)
            llm = llm_client_for(
                spec,
                settings,
                replay_only=context.llm_replay_only,
                default_model=context.llm_model,
                workflow_id=context.workflow_id,
            )
            ctx = OperatorContext(
                params=dict(context.params),
                seed=task.seed,
                shard_id=task.shard_id,
                llm=llm,
                file_reader=file_reader(store),
                operator=spec.ref,
            )
            values, read = _shard_items(shard_input, store, spec)
            ready.append(_Prepared(i, t0, llm, ctx, values, read))
            if isinstance(values, ArrowShard):
                arrow_bytes += values.size
            elif isinstance(values, ParquetShard):
                arrow_bytes += sum(len(data) for _, data in values.ranges)
        except OperatorError as e:
            attempts[i] = _failed_attempt(context, str(e), e.retryable, t0, llm, ctx)
        except Exception as e:  # the runtime's own failure (store): worth a retry
            attempts[i] = _failed_attempt(context, f"{type(e).__name__}: {e}", True, t0, llm, ctx)
        if arrow_bytes >= ARROW_CALL_BYTES:
            # A call's Arrow tables are held until its host call: bounded, whatever the
            # batch's shard count.
            _run_ready(context, settings, ready, attempts)
            ready, arrow_bytes = [], 0
    _run_ready(context, settings, ready, attempts)
    return [a for a in attempts if a is not None]


def _run_ready(
    context: ShardContext,
    settings: Settings,
    ready: list[_Prepared],
    attempts: list[ShardAttempt | None],
) -> None:
    """Map the prepared shards in one host round trip; their attempts into ``attempts``."""
    if not ready:
        return
    spec = context.operator.spec
    # In an operator host: a process with only the operator's declared environment
    # (activities/mrp/host.py), which imports the code and checks it against its pin.
    t1 = time.perf_counter()
    outs: list[tuple[Any, float] | OperatorError]
    try:
        outs = run_map_batch_in_host(
            context.operator, [(r.values, r.ctx) for r in ready], memory_mb=context.memory_mb
        )
    except Exception as e:  # starting the host failed: worth a retry
        outs = [OperatorError(spec.ref, f"{type(e).__name__}: {e}", retryable=True)] * len(ready)
    # A shard's latency: its own preparation and its time in the host (a batch's
    # shards share the round trip; the first shards' time in the host is theirs).
    share = (time.perf_counter() - t1) * 1000 / len(ready)
    for r, out in zip(ready, outs, strict=True):
        if isinstance(out, OperatorError):
            attempts[r.place] = _failed_attempt(
                context, str(out), out.retryable, r.t0, r.llm, r.ctx, latency_ms=share
            )
        else:
            attempts[r.place] = _succeeded(context, settings, r, out[0], max(out[1], share))


def _succeeded(
    context: ShardContext, settings: Settings, r: _Prepared, output: Any, host_ms: float
) -> ShardAttempt:
    """The attempt of a shard whose operator returned ``output`` (stored when too large
    to be packed with the window's outputs)."""
    data = canonical_json(output)
    packed = len(data) <= PACK_MEMBER_MAX
    try:
        digest = digest_bytes(data) if packed else store_for(settings).put_bytes(data)
    except Exception as e:  # the store failed: worth a retry
        return _failed_attempt(
            context, f"{type(e).__name__}: {e}", True, r.t0, r.llm, r.ctx, latency_ms=host_ms
        )
    stats = call_stats(r.llm)
    return ShardAttempt(
        ok=True,
        output_digest=digest,
        output_bytes=data if packed else None,
        latency_ms=host_ms,
        units=context.operator.spec.cost_weight + r.ctx.charged_units,
        llm_usd=stats.cost_usd,
        llm_calls=stats.calls + stats.cache_hits,
        llm_cached=stats.cache_hits,
        llm_call_logs=list(stats.logs),
        pid=os.getpid(),
        input_bytes=r.input_bytes,
    )


def _failed_attempt(
    context: ShardContext,
    error: str,
    retryable: bool,
    t0: float,
    llm: LLMClient | None,
    ctx: OperatorContext | None,
    latency_ms: float | None = None,
) -> ShardAttempt:
    """A failed attempt, started at ``t0`` (or that took ``latency_ms``), with what it
    spent."""
    stats = call_stats(llm) if llm is not None else LLMCallStats()
    return ShardAttempt(
        ok=False,
        error=error[:4000],
        retryable=retryable,
        latency_ms=(time.perf_counter() - t0) * 1000 if latency_ms is None else latency_ms,
        # A failed attempt still spent its weight: the operator ran.
        units=(context.operator.spec.cost_weight + (ctx.charged_units if ctx else Decimal(0))),
        llm_usd=stats.cost_usd,
        llm_calls=stats.calls + stats.cache_hits,
        llm_cached=stats.cache_hits,
        llm_call_logs=list(stats.logs),
        pid=os.getpid(),
    )


# ---------------------------------------------------------------------------------------
# Backends


class AttemptTimeout(Exception):
    """The attempt ran past the shard timeout and was cancelled (or abandoned)."""


class Backend(ABC):
    """Runs shard attempts; one instance per worker process and backend kind."""

    name: BackendName

    @abstractmethod
    async def run(self, task: ShardTask, settings: Settings, timeout_s: float) -> ShardAttempt:
        """One attempt; raises :class:`AttemptTimeout` past ``timeout_s``. Cancelling the
        awaiting task cancels the attempt."""


class ThreadsBackend(Backend):
    """Each attempt in its own daemon thread of the worker process."""

    name: BackendName = "threads"

    async def run(self, task: ShardTask, settings: Settings, timeout_s: float) -> ShardAttempt:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ShardAttempt] = loop.create_future()

        def target() -> None:
            try:
                result = execute_shard(task, settings)
            except BaseException as e:  # pragma: no cover - execute_shard catches operator errors
                loop.call_soon_threadsafe(_set_exception, fut, e)
            else:
                loop.call_soon_threadsafe(_set_result, fut, result)

        thread = threading.Thread(
            target=target, name=f"mrp-{task.shard_id}-a{task.attempt}", daemon=True
        )
        thread.start()
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise AttemptTimeout(f"attempt ran past the shard timeout of {timeout_s:g}s") from None


def _set_result(fut: asyncio.Future[ShardAttempt], value: ShardAttempt) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future[ShardAttempt], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


# -- Ray -----------------------------------------------------------------------------------


class ShardRunner:
    """A Ray actor that runs shard attempts one at a time.

    Actors are started (and their imports done) before an attempt is handed to them, so
    the shard timeout measures the operator's run, not Ray starting a worker process; an
    actor whose attempt timed out or was cancelled is killed, never reused.
    """

    def __init__(self) -> None:
        # Window contexts this actor was sent: {key: (context, settings)}, a few kept.
        self._contexts: dict[str, tuple[ShardContext, Settings]] = {}

    def ready(self) -> int:
        return os.getpid()

    def run(self, task: ShardTask, settings: Settings) -> ShardAttempt:
        return execute_shard(task, settings)

    def run_batch(
        self,
        key: str,
        context: tuple[ShardContext, Settings] | None,
        items: list[ShardItem],
    ) -> list[ShardAttempt]:
        """Run ``items`` one after the other in the window context ``key`` (sent with the
        actor's first call for that window, then only named)."""
        if context is not None:
            if len(self._contexts) >= 8:
                self._contexts.pop(next(iter(self._contexts)))
            self._contexts[key] = context
        shard_context, settings = self._contexts[key]
        return execute_items(shard_context, items, settings)


class RayBackend(Backend):
    """Each attempt on a pooled :class:`ShardRunner` actor (``activities.fanout``)."""

    name: BackendName = "ray"

    def __init__(self, num_cpus: int) -> None:
        self.num_cpus = num_cpus
        self.pool = fanout.ActorPool(ShardRunner, num_cpus)
        # Slowest attempt seen (ms) per operator code digest, for batch sizes.
        self.slowest_ms: dict[str, float] = {}
        # The Ray node of each shard's last completed attempt ({shard_id: node_id}).
        self.shard_nodes: dict[str, str] = {}

    def session(
        self, context: ShardContext, settings: Settings, timeout_s: float, lanes: int
    ) -> RaySession:
        """A window's batching, pipelining session on this pool (see :class:`RaySession`)."""
        return RaySession(self, context, settings, timeout_s, min(lanes, self.num_cpus))

    async def run(self, task: ShardTask, settings: Settings, timeout_s: float) -> ShardAttempt:
        actor = await self.pool.acquire()
        fut = fanout.as_future(actor.handle.run.remote(task, settings))
        try:
            result: ShardAttempt = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            self.pool.discard(actor, [fut])
            raise AttemptTimeout(f"attempt ran past the shard timeout of {timeout_s:g}s") from None
        except BaseException:  # cancelled, or the actor died
            self.pool.discard(actor, [fut])
            raise
        self.pool.release(actor)
        self.shard_nodes[task.shard_id] = result.node_id
        return result


class ShardNotStarted(Exception):
    """A queued shard attempt that the window's session dropped before any actor ran it
    (the window is stopping: budget spent or a shard failed for good)."""


# Ray batching: a batch holds at most this many shards, and is sized so that it should
# take at most BATCH_SHARE of the shard timeout (from the slowest attempt seen so far);
# each lane (one actor) keeps PIPELINE_DEPTH calls in flight so its actor never waits.
# Shards a Ray call carries at most (fewer when attempts are slow: BATCH_SHARE). 128 over 32:
# bench/mrp_scale.py --shards 20000, warm map 7.440 and 6.905 s against 9.673 s (256: 9.219 s).
MAX_BATCH = 128
BATCH_SHARE = 0.1
PIPELINE_DEPTH = 2


class _Call:
    __slots__ = ("batch", "fut", "started")

    def __init__(self, batch: list[tuple[ShardItem, asyncio.Future[ShardAttempt], bool]]) -> None:
        self.batch = batch
        self.fut: asyncio.Future[Any] | None = None
        self.started = 0.0


class RaySession:
    """One map window's use of the Ray backend: shard attempts are queued by the window's
    shard coroutines and sent to pooled actors in batches by one lane per actor.

    - The window context (settings, operator handle, params) goes to each actor once;
      later calls carry only the shards (:class:`ShardItem`).
    - A batch has one shard until attempts are seen to be fast, then up to
      :data:`MAX_BATCH` shards sized to take at most :data:`BATCH_SHARE` of the shard
      timeout. Per-shard timeout: a call that runs past ``timeout_s`` gets its actor
      killed; a single-shard call's shard gets :class:`AttemptTimeout` (an attempt, as
      before), a batch's shards are queued again one shard per call without counting an
      attempt, so a shard times out only when it alone runs past ``timeout_s``.
    - Each lane keeps :data:`PIPELINE_DEPTH` calls in flight on its actor; a call's clock
      starts when the call before it on that actor returned.
    """

    def __init__(
        self,
        backend: RayBackend,
        context: ShardContext,
        settings: Settings,
        timeout_s: float,
        lanes: int,
    ) -> None:
        import uuid

        self.backend = backend
        self.key = uuid.uuid4().hex
        self.context = (context, settings)
        self.timeout_s = timeout_s
        self.lanes_max = max(1, lanes)
        self.queue: collections.deque[tuple[ShardItem, asyncio.Future[ShardAttempt], bool]] = (
            collections.deque()
        )
        self.wake = asyncio.Event()
        self.lanes: list[asyncio.Task[None]] = []
        # Start from what earlier windows of this operator's code saw (one-shard calls
        # until an attempt has been seen).
        self.code_digest = context.operator.spec.code_digest
        self.slowest_ms = backend.slowest_ms.get(self.code_digest, 0.0)
        self.batch_size = 1
        if self.code_digest in backend.slowest_ms:
            self._size()
        self.stopped = False

    async def run(self, item: ShardItem) -> ShardAttempt:
        """One attempt of one shard (raises :class:`AttemptTimeout`,
        :class:`ShardNotStarted`, or the actor's failure)."""
        return await self.submit(item)

    def submit(self, item: ShardItem) -> asyncio.Future[ShardAttempt]:
        """Queue one attempt of one shard; its future is :meth:`run`'s outcome."""
        fut: asyncio.Future[ShardAttempt] = asyncio.get_running_loop().create_future()
        if self.stopped:
            # A retry after the stop (its backoff ran past it): no lane would take it.
            fut.set_exception(ShardNotStarted())
            return fut
        self.queue.append((item, fut, False))
        if len(self.lanes) < self.lanes_max:
            self.lanes.append(asyncio.create_task(self._lane()))
        self.wake.set()
        return fut

    def stop(self) -> None:
        """Start nothing more: queued attempts fail with :class:`ShardNotStarted`."""
        self.stopped = True
        self._not_started()
        self.wake.set()

    def _fail_queued(self, error: Exception) -> None:
        """Fail the queued attempts with ``error``."""
        while self.queue:
            _, fut, _ = self.queue.popleft()
            _set_exception(fut, error)

    def _not_started(self) -> None:
        """Fail the queued attempts with :class:`ShardNotStarted`."""
        self._fail_queued(ShardNotStarted())

    async def close(self) -> None:
        """End the lanes (their calls in flight are cancelled: actors killed)."""
        self.stop()
        for lane in self.lanes:
            lane.cancel()
        with contextlib.suppress(BaseException):
            await asyncio.gather(*self.lanes, return_exceptions=True)
        self.lanes.clear()

    def _take(self) -> list[tuple[ShardItem, asyncio.Future[ShardAttempt], bool]]:
        # Share what is queued evenly between the calls the lanes can have in flight, so
        # no actor ends the window with a long batch while the others are idle.
        share = -(-len(self.queue) // (self.lanes_max * PIPELINE_DEPTH))
        size = max(1, min(self.batch_size, share))
        batch: list[tuple[ShardItem, asyncio.Future[ShardAttempt], bool]] = []
        while self.queue and len(batch) < size:
            entry = self.queue[0]
            if entry[1].done():  # its shard coroutine was cancelled
                self.queue.popleft()
                continue
            if entry[2] and batch:  # "alone": after a batch timed out
                break
            self.queue.popleft()
            batch.append(entry)
            if entry[2]:
                break
        return batch

    def _learn(self, results: list[ShardAttempt]) -> None:
        self.slowest_ms = max([self.slowest_ms, *(r.latency_ms for r in results)])
        self.backend.slowest_ms[self.code_digest] = self.slowest_ms
        self._size()

    def _size(self) -> None:
        budget_ms = self.timeout_s * 1000 * BATCH_SHARE
        self.batch_size = max(1, min(MAX_BATCH, int(budget_ms / max(self.slowest_ms, 0.5))))

    async def _lane(self) -> None:
        """One lane: send batches off the queue to its actor (at most PIPELINE_DEPTH calls
        in flight) and settle each shard's future with its result, or with the failure."""
        pool = self.backend.pool
        actor: fanout.PooledActor | None = None
        calls: collections.deque[_Call] = collections.deque()
        try:
            while True:
                while not self.stopped and len(calls) < PIPELINE_DEPTH and self.queue:
                    if actor is None:
                        try:
                            actor = await pool.acquire()
                        except Exception as e:
                            # No actor could start (its creation task failed: an import
                            # error on its node, a cluster gone). The lane ended here and
                            # the queued attempts waited for good (a window heartbeating
                            # "done 0"); now they fail with the error, and the lane tries
                            # again for the next ones.
                            self._fail_queued(e)
                            break
                    batch = self._take()
                    if not batch:
                        break
                    calls.append(self._call(actor, batch))
                if not calls:
                    if actor is not None:
                        pool.release(actor)
                        actor = None
                    if self.stopped:
                        # What this lane queued again after the stop (the calls behind a
                        # killed actor's, a timed-out batch's shards) will not run either:
                        # left waiting, their shard coroutines kept the window open.
                        self._not_started()
                        return
                    self.wake.clear()
                    await self.wake.wait()
                    continue
                head = calls[0]
                assert head.fut is not None
                left = head.started + self.timeout_s - time.monotonic()
                try:
                    # Not asyncio.wait_for: on Python 3.11 it swallows a cancel (close())
                    # that comes after the call returned, and the lane went on waiting for
                    # its next call in flight, up to a shard timeout.
                    async with asyncio.timeout(max(0.0, left)):
                        results = await asyncio.shield(head.fut)
                except TimeoutError:
                    assert actor is not None
                    self._drop(actor, calls)
                    actor = None
                    self._timed_out(head)
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # the actor died (or Ray failed the call)
                    assert actor is not None
                    self._drop(actor, calls)
                    actor = None
                    for _, fut, _ in head.batch:
                        _set_exception(fut, e)
                    continue
                calls.popleft()
                if calls:
                    calls[0].started = max(calls[0].started, time.monotonic())
                self._learn(results)
                for (item, fut, _), result in zip(head.batch, results, strict=True):
                    self.backend.shard_nodes[item.shard_id] = result.node_id
                    _set_result(fut, result)
        except BaseException:
            self._abandon(actor, calls)
            raise

    def _call(
        self,
        actor: fanout.PooledActor,
        batch: list[tuple[ShardItem, asyncio.Future[ShardAttempt], bool]],
    ) -> _Call:
        """Send a batch to the actor (with the window's context, the first time)."""
        call = _Call(batch)
        send = None if self.key in actor.contexts else self.context
        actor.contexts.add(self.key)
        ref = actor.handle.run_batch.remote(self.key, send, [b[0] for b in batch])
        call.fut = fanout.as_future(ref)
        call.started = time.monotonic()
        return call

    def _drop(self, actor: fanout.PooledActor, calls: collections.deque[_Call]) -> None:
        """Kill the actor (its calls in flight with it); the calls behind the head one are
        queued again and the lane's calls cleared."""
        self.backend.pool.discard(actor, [c.fut for c in calls if c.fut is not None])
        calls.popleft()
        self._requeue(calls)
        calls.clear()

    def _timed_out(self, head: _Call) -> None:
        """A call ran past the shard timeout: a lone shard's attempt times out; a batch's
        shards are queued again, each to run alone (batches stop for this operator)."""
        if len(head.batch) == 1:
            _set_exception(
                head.batch[0][1],
                AttemptTimeout(f"attempt ran past the shard timeout of {self.timeout_s:g}s"),
            )
        else:
            # Batches stop for this operator: a shard can take that long.
            self.slowest_ms = max(self.slowest_ms, self.timeout_s * 1000)
            self.backend.slowest_ms[self.code_digest] = self.slowest_ms
            self.batch_size = 1
            self.queue.extendleft((i, f, True) for i, f, _ in reversed(head.batch))

    def _abandon(self, actor: fanout.PooledActor | None, calls: collections.deque[_Call]) -> None:
        """The lane ends abnormally: give back (or kill, with calls in flight) its actor and
        cancel the shards of its calls."""
        pool = self.backend.pool
        if actor is not None:
            if calls:
                pool.discard(actor, [c.fut for c in calls if c.fut is not None])
            else:
                pool.release(actor)
        for call in calls:
            for _, fut, _ in call.batch:
                if not fut.done():
                    fut.cancel()

    def _requeue(self, calls: collections.deque[_Call]) -> None:
        """Calls queued behind a killed actor's call never ran: queue their shards again."""
        for call in reversed(calls):
            self.queue.extendleft(reversed(call.batch))
        self.wake.set()


def backend_cpus(name: BackendName, max_workers: int) -> int:
    """The CPUs that shards of backend ``name`` run on: a joined Ray cluster's
    (``KEEL_RAY_ADDRESS``: its ``CPU`` resources, joining it if this process has not yet;
    ``max_workers`` when it cannot be asked), else this machine's (the local Ray cluster
    and the threads backend run here)."""
    if name == "ray" and fanout.configured_address():
        try:
            import ray

            fanout.ray_init(max_workers)
            cpus = int(ray.cluster_resources().get("CPU", 0))
        except Exception:
            cpus = 0
        return cpus if cpus > 0 else max(1, max_workers)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


_backends: dict[str, Backend] = {}


def get_backend(name: BackendName, num_cpus: int) -> Backend:
    """The process's backend of kind ``name`` (Ray is started on first use)."""
    with _cache_lock:
        backend = _backends.get(name)
        if backend is None:
            backend = RayBackend(num_cpus) if name == "ray" else ThreadsBackend()
            _backends[name] = backend
        return backend


__all__ = [
    "AttemptTimeout",
    "Backend",
    "BackendName",
    "RayBackend",
    "RaySession",
    "ShardAttempt",
    "ShardContext",
    "ShardItem",
    "ShardNotStarted",
    "ShardTask",
    "ThreadsBackend",
    "backend_cpus",
    "execute_item",
    "execute_shard",
    "get_backend",
    "store_for",
]
