"""The map window: runs shards ``[start, end)`` of a run on a backend, with checkpoints,
per-shard retries and timeouts, the budget, buffered shard records and heartbeats.

Fixed costs per flush, not per shard (issue 40 §2): an attempt hands back its output's
bytes (up to ``PACK_MEMBER_MAX``) instead of storing them, and each flush stores the
outputs it writes as one packed object (``keel.digest.pack_members``) and records
their rows in one bulk statement (``record_shards``), each row with its output's place in
the pack. A shard keeps its own output digest everywhere; the pack is only where the bytes
lie, read back one member at a time, verified against that digest. A kill loses at most
the shards of the flush under way (their outputs were not recorded, so they run again).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import fanout
from activities.mrp.backends import (
    MAX_BATCH,
    PIPELINE_DEPTH,
    AttemptTimeout,
    RayBackend,
    RaySession,
    ShardAttempt,
    ShardContext,
    ShardItem,
    ShardNotStarted,
    ShardTask,
    get_backend,
)
from activities.mrp.operators import MrpConfig, OperatorHandle, phase_handle
from keel.built import built
from keel.digest import pack_members
from keel.mrp.ir import JobIR, MapTask, ir_from_json
from keel.mrp.ir import checkpoint_key as make_checkpoint_key
from keel.mrp.run import ERROR_SHARD, ShardCounters, ShardRecord
from keel.mrp.steps import MapWindowInput, MapWindowResult
from store.artifacts import ArtifactStore, PackRef
from store.mrp_runs import lookup_checkpoint_outputs, record_shards, shards_with_output

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from keel.records import LLMCallLog
    from keel.settings import Settings

__all__ = ["MapWindow", "WindowHost", "load_ir"]


class WindowHost(Protocol):
    """What a map window needs of the activities that run it (``MrpActivities``)."""

    @property
    def settings(self) -> Settings: ...

    @property
    def sessions(self) -> sessionmaker[Session]: ...

    @property
    def store(self) -> ArtifactStore: ...

    @property
    def llm_model(self) -> str: ...

    def config(self) -> MrpConfig: ...

    async def record_llm_calls(self, logs: list[LLMCallLog]) -> None: ...


# Shard records are buffered and written in one transaction at most this often (and when
# FLUSH_MAX are waiting, and at the window's end); each flush is followed by a heartbeat.
FLUSH_EVERY_S = 0.25
FLUSH_MAX = 256
# Backoff between attempts of one shard: 0.2 s, 0.4 s, ... at most 5 s.
RETRY_BACKOFF_S = 0.2
RETRY_BACKOFF_MAX_S = 5.0


_ir_cache: dict[str, JobIR] = {}
_ir_locks: dict[str, threading.Lock] = {}
_ir_locks_guard = threading.Lock()


def write_batch(
    store: ArtifactStore | None,
    sessions: sessionmaker[Session],
    batch: list[ShardRecord],
    outputs: dict[int, bytes],
    places: dict[int, PackRef],
) -> None:
    """Store ``outputs`` (shard index -> output bytes) as one pack, then record ``batch``
    in one transaction, each output with its place in the pack (``places`` adds those of
    outputs already packed: checkpoints). A pack of one distinct output is that output's
    own object (its digest is the output's), recorded with no place. ``store`` is needed
    only when there are outputs."""
    packs = dict(places)
    if outputs:
        assert store is not None
        order = sorted(outputs)
        pack, spans = pack_members([outputs[i] for i in order])
        pack_digest = store.put_bytes(pack)
        if len(pack) != spans[0][1]:  # more than one distinct member
            for i, (offset, length) in zip(order, spans, strict=True):
                packs[i] = PackRef(pack_digest, offset, length)
    if packs:
        record_shards(sessions, batch, packs=packs)
    else:
        record_shards(sessions, batch)


def load_ir(store: ArtifactStore, digest: str) -> JobIR:
    """The IR stored under ``digest`` (a few parsed IRs are kept per process). Parsed once
    however many windows ask at the same time: windows start together (one ahead of the
    others), and at 100,000 shards each parse of the IR is about a second of CPU."""
    ir = _ir_cache.get(digest)
    if ir is not None:
        return ir
    with _ir_locks_guard:
        lock = _ir_locks.setdefault(digest, threading.Lock())
    with lock:
        ir = _ir_cache.get(digest)
        if ir is None:
            ir = ir_from_json(store.get_bytes(digest))
            with _ir_locks_guard:
                if len(_ir_cache) >= 8:
                    old = next(iter(_ir_cache))
                    _ir_cache.pop(old)
                    _ir_locks.pop(old, None)
                _ir_cache[digest] = ir
    return ir


# ---------------------------------------------------------------------------------------
# One map window


class MapWindow:
    """The state of one map window attempt."""

    def __init__(self, acts: WindowHost, inp: MapWindowInput) -> None:
        self.acts = acts
        self.inp = inp
        self.settings = acts.settings
        self.counters = ShardCounters()
        self.units = Decimal(0)
        self.usd = Decimal(0)
        self.llm_calls = 0
        self.llm_cached = 0
        self.done = 0
        self.stop = False
        self.stopped_by_budget = False
        self.failure: ApplicationError | None = None
        self.failed_shards: list[tuple[int, str]] = []
        self.pending: list[ShardRecord] = []
        # Of pending records, by shard index: outputs still to store (packed by the next
        # flush) and the places of outputs already packed (from checkpoints).
        self.outputs: dict[int, bytes] = {}
        self.places: dict[int, PackRef] = {}
        self.flush_now = asyncio.Event()
        self.flush_lock = asyncio.Lock()
        # Set when the window's shards are over: the flusher ends (see _flusher).
        self.closing = False
        self.session: RaySession | None = None
        self.meter: dict[str, Any] = {}
        # Of computed record shards, the input bytes each read (shard index -> bytes).
        self.input_bytes: dict[int, int] = {}
        # On a Ray session (_run_on_session): shards not settled yet, whether all were
        # queued, set once both are so, and the first error an attempt raised.
        self._open = 0
        self._all_sent = False
        self._settled = asyncio.Event()
        self._crash: BaseException | None = None

    def _instruments(self) -> None:
        """The window's metric instruments, made once (metrics never fail an activity)."""
        with contextlib.suppress(Exception):
            meter = activity.metric_meter()
            self.meter = {
                "latency": meter.create_histogram_float(
                    "keel_mrp_shard_latency_ms", "MRP shard attempt latency", "ms"
                ),
                "shards": meter.create_counter("keel_mrp_shards", "MRP shards by outcome"),
                "retries": meter.create_counter("keel_mrp_shard_retries", "MRP shard retries"),
                "failures": meter.create_counter(
                    "keel_mrp_shard_failures", "MRP shards failed for good"
                ),
            }

    def _metric(self, name: str, value: float, attrs: dict[str, str]) -> None:
        inst = self.meter.get(name)
        if inst is not None:
            with contextlib.suppress(Exception):
                if name == "latency":
                    inst.record(value, attrs)
                else:
                    inst.add(int(value), attrs)

    def _note(self, record: ShardRecord) -> None:
        """Buffer a shard record (written by :meth:`_flush`; the checkpoint index gets the
        run's outputs at its end: ``store.mrp_runs.index_run_checkpoints``)."""
        self.pending.append(record)
        if len(self.pending) >= FLUSH_MAX:
            self.flush_now.set()

    def _take(self) -> tuple[list[ShardRecord], dict[int, bytes], dict[int, PackRef]]:
        """The pending records with their outputs and places, taken out of the buffer."""
        batch, self.pending = self.pending, []
        outputs: dict[int, bytes] = {}
        places: dict[int, PackRef] = {}
        if self.outputs or self.places:
            for record in batch:
                i = record.shard_index
                if i in self.outputs:
                    outputs[i] = self.outputs.pop(i)
                if i in self.places:
                    places[i] = self.places.pop(i)
        return batch, outputs, places

    def _put_back(
        self,
        batch: list[ShardRecord],
        outputs: dict[int, bytes],
        places: dict[int, PackRef],
    ) -> None:
        self.pending[:0] = batch
        self.outputs.update(outputs)
        self.places.update(places)

    async def _flush(self) -> None:
        """Store the buffered outputs as one pack and write the buffered shard records in
        one transaction (``write_batch``), then heartbeat progress."""
        async with self.flush_lock:
            batch, outputs, places = self._take()
            if batch:
                write = asyncio.ensure_future(
                    asyncio.to_thread(
                        write_batch,
                        self.acts.store if outputs else None,
                        self.acts.sessions,
                        batch,
                        outputs,
                        places,
                    )
                )
                try:
                    await asyncio.shield(write)
                except asyncio.CancelledError:
                    # The write goes on in its thread (the window's end cancels the
                    # flusher): wait for it, so the batch is written once, by it, or put
                    # back if it failed. Putting it back at once had the last flush write
                    # it again, and a shard's attempts and executions add up per write.
                    try:
                        await write
                    except Exception:
                        self._put_back(batch, outputs, places)
                    raise
                except BaseException:
                    self._put_back(batch, outputs, places)  # written by the next flush
                    raise
            activity.heartbeat({"done": self.done, "total": self.total})

    async def _flusher(self) -> None:
        """Flush every FLUSH_EVERY_S, or sooner when FLUSH_MAX records wait, until the
        window closes. Not ``asyncio.wait_for``: on Python 3.11 a cancel that comes after
        ``flush_now`` was set (the window's last shards filled a batch in the loop turn
        that ended the window) is swallowed there, and the flusher went on flushing and
        heartbeating ``done N/N`` for good (bench/mrp_scale.py, 5,000 and 100,000 shards).
        ``closing`` ends it even so."""
        while not self.closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_EVERY_S):
                    await self.flush_now.wait()
            self.flush_now.clear()
            await self._flush()

    def _over_budget(self) -> bool:
        inp = self.inp
        return (inp.remaining_units is not None and self.units > inp.remaining_units) or (
            inp.remaining_usd is not None and self.usd > inp.remaining_usd
        )

    async def run(self) -> MapWindowResult:
        t0 = time.monotonic()
        inp = self.inp
        ir = await asyncio.to_thread(load_ir, self.acts.store, inp.ir_digest)
        tasks = ir.map_tasks[inp.start : inp.end]
        self.total = len(tasks)
        config = await asyncio.to_thread(self.acts.config)
        handle = phase_handle(config, ir, "map")
        self._instruments()

        to_run = await self._unfinished(tasks)
        if inp.use_checkpoints and to_run:
            to_run = await self._from_checkpoints(to_run)
        await self._flush()

        backend, parallelism = self._backend(config, ir, handle)
        await self._run_shards(to_run, handle, ir, backend, parallelism)
        if self.failure is not None:
            raise self.failure
        self.counters.total = self.total
        return MapWindowResult(
            start=inp.start,
            end=inp.end,
            counters=self.counters,
            cost_units=self.units,
            cost_usd=self.usd,
            llm_calls=self.llm_calls,
            llm_cached=self.llm_cached,
            stopped_by_budget=self.stopped_by_budget,
            elapsed_s=time.monotonic() - t0,
            failed_shards=[shard for _, shard in sorted(self.failed_shards)],
            input_bytes=sorted(self.input_bytes.items()),
        )

    async def _unfinished(self, tasks: list[MapTask]) -> list[MapTask]:
        """The window's tasks less the shards this run already finished (an earlier attempt
        of this window), which count as done; a task whose checkpoint key does not match
        its operator, input and seed fails the window."""
        own = await asyncio.to_thread(
            shards_with_output, self.acts.sessions, self.inp.run_id, [t.shard_index for t in tasks]
        )
        to_run: list[MapTask] = []
        for t in tasks:
            if t.checkpoint_key != make_checkpoint_key(t.operator_digest, t.input_digest, t.seed):
                raise ApplicationError(
                    f"{t.shard_id}: checkpoint key does not match its operator, input and seed",
                    type=ERROR_SHARD,
                    non_retryable=True,
                )
            mine = own.get(t.shard_index)
            if mine is not None and mine.checkpoint_key == t.checkpoint_key:
                self.counters.skipped += 1
                self.done += 1
            else:
                to_run.append(t)
        return to_run

    async def _from_checkpoints(self, to_run: list[MapTask]) -> list[MapTask]:
        """Record as succeeded (from a checkpoint) the tasks whose checkpoint key has a
        stored output; the others are returned, still to run."""
        store = self.acts.store
        index = await asyncio.to_thread(
            lookup_checkpoint_outputs, self.acts.sessions, [t.checkpoint_key for t in to_run]
        )
        # One existence check per stored object: a pack holds many checkpoints' outputs.
        objects = {
            index[t.checkpoint_key].object_digest for t in to_run if t.checkpoint_key in index
        }
        present = set(await asyncio.to_thread(lambda: [d for d in objects if store.exists(d)]))
        rest = []
        for t in to_run:
            found = index.get(t.checkpoint_key)
            if found is not None and found.object_digest in present:
                if found.pack is not None:
                    self.places[t.shard_index] = found.pack
                self._note(
                    self._record(t, "succeeded", "checkpoint", found.digest, 0, 0, None, None)
                )
                self.counters.skipped += 1
                self.done += 1
                self._metric("shards", 1, {"outcome": "skipped"})
            else:
                rest.append(t)
        return rest

    def _backend(self, config: MrpConfig, ir: JobIR, handle: OperatorHandle) -> tuple[Any, int]:
        """The window's backend and how many shards may run (or be queued) at once; on Ray
        this also opens the window's session (``self.session``)."""
        inp = self.inp
        # On a joined Ray cluster (KEEL_RAY_ADDRESS) the cluster's CPUs bound the actors,
        # not this machine's: the pool may hold up to max_workers of them.
        cpus = config.caps.max_workers
        if inp.backend != "ray" or not fanout.configured_address():
            cpus = min(cpus, os.cpu_count() or 1)
        backend = get_backend(inp.backend, cpus)
        parallelism = inp.parallelism
        if isinstance(backend, RayBackend):
            # At most `parallelism` actors (so shards running at once) for this window; more
            # shards than that are queued so batches and pipelined calls can be formed.
            lanes = min(parallelism, backend.num_cpus)
            context = ShardContext(
                run_id=inp.run_id,
                workflow_id=inp.workflow_id,
                operator=handle,
                params=dict(ir.operators["map"].params),
                llm_replay_only=inp.llm_replay_only,
                llm_model=self.acts.llm_model,
                memory_mb=ir.limits.shard_memory_mb,
            )
            self.session = backend.session(context, self.settings, ir.limits.shard_timeout_s, lanes)
            parallelism = lanes * MAX_BATCH * PIPELINE_DEPTH
            weight = handle.spec.cost_weight
            if inp.remaining_units is not None and weight > 0:
                # Queued shards are committed spend: keep them within the remaining budget.
                parallelism = max(lanes, min(parallelism, int(inp.remaining_units / weight)))
        return backend, parallelism

    async def _run_shards(
        self,
        to_run: list[MapTask],
        handle: OperatorHandle,
        ir: JobIR,
        backend: Any,
        parallelism: int,
    ) -> None:
        """Run the shards, at most ``parallelism`` at once, until done or stopped; then
        close the session and write what finished, even when the window fails."""
        sem = asyncio.Semaphore(parallelism)
        flusher = asyncio.create_task(self._flusher())
        running: list[asyncio.Task[None]] = []
        try:
            if self.session is not None:
                await self._run_on_session(self.session, to_run, handle, ir, sem, running)
            else:
                for t in to_run:
                    await sem.acquire()
                    if self.stop:
                        sem.release()
                        break
                    running.append(asyncio.create_task(self._shard(t, handle, ir, backend, sem)))
                await asyncio.gather(*running)
        except BaseException:
            for r in running:
                r.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(*running, return_exceptions=True)
            raise
        finally:
            self.closing = True
            flusher.cancel()
            with contextlib.suppress(BaseException):
                await flusher
            if self.session is not None:
                await self.session.close()
            # Whatever finished is recorded, even when the window fails or is cancelled.
            await asyncio.shield(self._flush())

    def _record(
        self,
        t: MapTask,
        state: Any,
        source: Any,
        digest: str | None,
        attempts: int,
        executions: int,
        attempt: ShardAttempt | None,
        error: str | None,
        units: Decimal = Decimal(0),
        usd: Decimal = Decimal(0),
    ) -> ShardRecord:
        """The shard's record (built, not validated: every field is the window's own)."""
        return built(
            ShardRecord,
            run_id=self.inp.run_id,
            shard_index=t.shard_index,
            shard_id=t.shard_id,
            input_digest=t.input_digest,
            checkpoint_key=t.checkpoint_key,
            output_digest=digest,
            state=state,
            source=source,
            attempts=attempts,
            executions=executions,
            latency_ms=attempt.latency_ms if attempt is not None else 0.0,
            cost_units=units,
            cost_usd=usd,
            error=error,
            updated_at=datetime.now(UTC),
        )

    async def _run_on_session(
        self,
        session: RaySession,
        to_run: list[MapTask],
        handle: OperatorHandle,
        ir: JobIR,
        sem: asyncio.Semaphore,
        running: list[asyncio.Task[None]],
    ) -> None:
        """The shards on the window's Ray session: each first attempt is queued with a
        callback, not a task of its own. A first attempt that succeeded with no model calls
        to record (most of a big job's) is accounted and recorded by its callback; any
        other goes on in a task as :meth:`_shard` (its retries, its failure). At 100,000
        shards the worker's interpreter was the map's bound (docs/mrp-runtime.md), and a
        task, its coroutines and their wake-ups were most of a shard's time on the loop.
        Returns once every shard settled; raises what a shard's attempt raised (an actor
        lost: the window fails and is retried, as with a task per shard)."""
        attrs = {"backend": self.inp.backend, "operator": handle.spec.ref}
        loop = asyncio.get_running_loop()

        async def go_on(t: MapTask, first: ShardAttempt) -> None:
            # A shard's attempt that raises fails the window, as when every shard had a
            # task: registered before this turn ends, so the wait below sees it.
            try:
                await self._shard(t, handle, ir, None, sem, first=first)
            except asyncio.CancelledError:
                raise
            except BaseException as e:
                self._crashed(e)

        def first_done(t: MapTask, fut: asyncio.Future[ShardAttempt]) -> None:
            settled = False
            try:
                if fut.cancelled():
                    # Only a lane that ended abnormally cancels its calls' attempts (the
                    # window cancels none): the window fails and is retried.
                    self._crashed(RuntimeError(f"{t.shard_id}: its Ray lane ended"))
                    return
                error = fut.exception()
                if isinstance(error, ShardNotStarted):
                    return  # the window stopped before it ran: left "cancelled"
                if isinstance(error, AttemptTimeout):
                    result = self._timed_out(handle, ir, error)
                elif error is not None:
                    self._crashed(error)
                    return
                else:
                    result = fut.result()
                if result.ok and not result.llm_call_logs:
                    self._account_now(result, attrs)
                    self._succeeded(t, 1, result, result.units, result.llm_usd)
                    return
                settled = True  # by the task
                running.append(loop.create_task(go_on(t, result)))
            except BaseException as e:  # never a shard left unsettled
                self._crashed(e)
            finally:
                if not settled:
                    self._settle(sem)

        for t in to_run:
            await sem.acquire()
            if self.stop or self._crash is not None:
                sem.release()
                break
            self._open += 1
            fut = session.submit(self._item(t, ir, 1))
            fut.add_done_callback(lambda f, t=t: first_done(t, f))  # type: ignore[misc]
        self._all_sent = True
        if self._open and self._crash is None:
            await self._settled.wait()
        if self._crash is not None:
            raise self._crash

    def _settle(self, sem: asyncio.Semaphore) -> None:
        """A shard is over (recorded, failed, or never started)."""
        sem.release()
        if self.session is not None:  # counted by _run_on_session
            self._open -= 1
            if self._open <= 0 and self._all_sent:
                self._settled.set()

    def _crashed(self, error: BaseException) -> None:
        """A shard's attempt raised (not a failed attempt: the actor or Ray failed): the
        window stops and raises it."""
        if self._crash is None:
            self._crash = error
        self._stop()
        self._settled.set()

    def _item(self, t: MapTask, ir: JobIR, attempt_no: int) -> ShardItem:
        return ShardItem(
            t.shard_index, t.shard_id, t.input_digest, t.seed, attempt_no, ir.input_place(t)
        )

    def _timed_out(self, handle: OperatorHandle, ir: JobIR, e: AttemptTimeout) -> ShardAttempt:
        """A timeout: a retryable failed attempt that costs the operator's weight."""
        return ShardAttempt(
            ok=False,
            error=str(e),
            retryable=True,
            latency_ms=ir.limits.shard_timeout_s * 1000,
            units=handle.spec.cost_weight,
        )

    async def _shard(
        self,
        t: MapTask,
        handle: OperatorHandle,
        ir: JobIR,
        backend: Any,
        sem: asyncio.Semaphore,
        first: ShardAttempt | None = None,
    ) -> None:
        """A shard's attempts until one succeeds, or it fails for good (``first``: the
        result of its first attempt, made already)."""
        inp = self.inp
        max_attempts = 1 + ir.limits.max_shard_retries
        units = Decimal(0)
        usd = Decimal(0)
        last_error = ""
        attrs = {"backend": inp.backend, "operator": handle.spec.ref}
        try:
            for attempt_no in range(1, max_attempts + 1):
                try:
                    if attempt_no == 1 and first is not None:
                        result = first
                    else:
                        result = await self._attempt(t, handle, ir, backend, attempt_no)
                except ShardNotStarted:
                    return  # the window stopped before this attempt ran: left "cancelled"
                units += result.units
                usd += result.llm_usd
                await self._account(result, attrs)
                if result.ok:
                    self._succeeded(t, attempt_no, result, units, usd)
                    return
                last_error = result.error or "unknown error"
                if not result.retryable or attempt_no == max_attempts:
                    break
                self.counters.retried += 1
                self._metric("retries", 1, attrs)
                await asyncio.sleep(
                    min(RETRY_BACKOFF_MAX_S, RETRY_BACKOFF_S * 2 ** (attempt_no - 1))
                )
            self._failed(t, ir, attempt_no, last_error, units, usd, attrs)
        finally:
            self._settle(sem)

    async def _attempt(
        self, t: MapTask, handle: OperatorHandle, ir: JobIR, backend: Any, attempt_no: int
    ) -> ShardAttempt:
        """Run one attempt of a shard (in the Ray session, or as a task on the backend); a
        timeout is a retryable failed attempt that costs the operator's weight."""
        inp = self.inp
        limits = ir.limits
        try:
            if self.session is not None:
                return await self.session.run(self._item(t, ir, attempt_no))
            task = ShardTask(
                run_id=inp.run_id,
                workflow_id=inp.workflow_id,
                shard_index=t.shard_index,
                shard_id=t.shard_id,
                input_digest=t.input_digest,
                seed=t.seed,
                operator=handle,
                params=dict(ir.operators["map"].params),
                llm_replay_only=inp.llm_replay_only,
                llm_model=self.acts.llm_model,
                attempt=attempt_no,
                memory_mb=limits.shard_memory_mb,
                input_at=ir.input_place(t),
            )
            return await backend.run(task, self.settings, limits.shard_timeout_s)
        except AttemptTimeout as e:
            return self._timed_out(handle, ir, e)

    async def _account(self, result: ShardAttempt, attrs: dict[str, str]) -> None:
        """Add an attempt's cost and LLM calls to the window's, record its LLM calls and
        its latency."""
        await self.acts.record_llm_calls(result.llm_call_logs)
        self._account_now(result, attrs)

    def _account_now(self, result: ShardAttempt, attrs: dict[str, str]) -> None:
        """:meth:`_account` but the recording of model calls."""
        self.units += result.units
        self.usd += result.llm_usd
        self.llm_calls += result.llm_calls
        self.llm_cached += result.llm_cached
        self._metric(
            "latency",
            result.latency_ms,
            {**attrs, "outcome": "ok" if result.ok else "error"},
        )

    def _succeeded(
        self, t: MapTask, attempt_no: int, result: ShardAttempt, units: Decimal, usd: Decimal
    ) -> None:
        """Record a computed shard; stop the window when that spent its budget."""
        assert result.output_digest is not None
        if result.output_bytes is not None:
            self.outputs[t.shard_index] = result.output_bytes
        if result.input_bytes:
            self.input_bytes[t.shard_index] = result.input_bytes
        self._note(
            self._record(
                t,
                "succeeded",
                "computed",
                result.output_digest,
                attempt_no,
                1,
                result,
                None,
                units,
                usd,
            )
        )
        self.counters.run += 1
        self.done += 1
        self._metric("shards", 1, {"outcome": "run"})
        if self._over_budget() and not self.stop:
            self._stop()
            self.stopped_by_budget = True

    def _failed(
        self,
        t: MapTask,
        ir: JobIR,
        attempt_no: int,
        last_error: str,
        units: Decimal,
        usd: Decimal,
        attrs: dict[str, str],
    ) -> None:
        """A shard failed for good: record it, then (unless failures are tolerated) stop
        the window and fail it naming the shard."""
        limits = ir.limits
        max_attempts = 1 + limits.max_shard_retries
        self.counters.failed += 1
        self._metric("failures", 1, attrs)
        self._note(
            self._record(t, "failed", "none", None, attempt_no, 0, None, last_error, units, usd)
        )
        if self.inp.tolerate_failures:
            # map.min_success_ratio < 1: the workflow weighs the failures after the map.
            self.failed_shards.append((t.shard_index, t.shard_id))
            self.done += 1
            return
        if self.failure is None:
            what = (
                f"after {attempt_no} attempts (retry cap {limits.max_shard_retries})"
                if attempt_no == max_attempts
                else f"on attempt {attempt_no} (not retryable)"
            )
            self.failure = ApplicationError(
                f"shard {t.shard_id} failed {what}: {last_error}",
                {"shard_id": t.shard_id, "shard_index": t.shard_index, "attempts": attempt_no},
                type=ERROR_SHARD,
                non_retryable=True,
            )
        self._stop()

    def _stop(self) -> None:
        """Start no more shards (queued Ray attempts are dropped, not run)."""
        self.stop = True
        if self.session is not None:
            self.session.stop()
