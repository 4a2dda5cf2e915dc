"""Operator hosts: operator code runs in a child process whose environment holds only the
variables its ``operator.yaml`` declares (``env:``), on every backend.

Why a process: operators on the ``threads`` backend ran inside the worker process, and
reduce, evaluate and produce always did, so ``os.environ`` (and ``/proc/self/environ``)
showed them the worker's model API keys and S3 credentials. One process has one
environment, and ``/proc/self/environ`` shows the block the process was started with, so no
in-process scrubbing can hide a key; a process started with a clean environment can.

- :class:`OperatorHost` is a child (``python -m activities.mrp.host_main``) started with
  ``env`` = the declared variables (values from the worker's environment, when set) and
  nothing else; it serves calls one at a time over a pair of pipes (newline-delimited
  JSON, never pickle: the child runs untrusted code and the parent trusts nothing it sends
  but JSON), imports operators from their folders (hashed against their pins, as before)
  and runs ``invoke_map`` / ``invoke_reduce`` / ``invoke_evaluate`` / ``invoke_produce``
  there, under the egress guard.
- The operator's ``ctx.llm`` and ``ctx.read_file`` are proxies: each call goes to the
  parent, which holds the LLM client (and the keys) and the artifact store (and its
  credentials), and answers. ``ctx.charge``, ``ctx.log``, the seed and ``ctx.rng`` are the
  child's own; charged units and log lines come back with the result.
- Hosts are pooled per process and per declared environment (a Ray actor keeps its own;
  the threads backend one per shard in flight), so a host starts once, not per shard.
  A host whose call failed in the protocol (the process died, wrote garbage) is killed;
  a host ends on EOF of its pipe, and within a second of its parent's end.

Reduce: the shard outputs are not sent with the call; the host asks the parent for them in
batches as the reducer reads (``{"rpc": "outputs", "start": i}``, answered by
``activities.mrp.reducing.OutputStream`` from the artifact store), so neither process
holds them all unless the reducer does (see :class:`~keel.mrp.sdk.StreamingReducerBase`).

Memory: a call with ``memory_mb`` (map shards: ``policy.shard_memory_mb``) runs under a
soft ``RLIMIT_DATA`` of the host's data size before the call plus ``memory_mb``, so what
the call allocates past that fails in the host (``MemoryError``), never in the worker or
in a neighbouring shard's host. Such a call fails as not retryable (the same input needs
the same memory), naming the limit, and its host is stopped rather than pooled again.
The limit is the host's own soft limit: operator code can raise it again (it is a guard
against runaway shards, not against hostile code; ``sandbox/`` is for that).

Not covered: operator code of the same Unix user can still read another process's
``/proc/<pid>/environ`` (the worker's is ``/proc/<parent pid>/environ``); run workers and
operators as different users, or operators under nsjail (``sandbox/``), where that matters.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from pathlib import Path
from typing import IO, Any, NamedTuple, Protocol, overload

from pydantic import JsonValue

from keel.mrp.dsl import SinkSpec
from keel.mrp.errors import MrpError
from keel.mrp.normalize import FileRef
from keel.mrp.registry import OperatorKind
from keel.mrp.sdk import Evaluation, LLMResult, OperatorContext, OperatorError, ProduceResult

REPO_ROOT = Path(__file__).resolve().parents[2]
# Idle hosts kept per environment (more are stopped when released).
MAX_IDLE = 32
# The request pipe's size (at most /proc/sys/fs/pipe-max-size, 1 MiB by default).
PIPE_BYTES = 1 << 20

__all__ = [
    "ArrowShard",
    "HostError",
    "OperatorHost",
    "ParquetShard",
    "declared_env",
    "run_in_host",
    "run_map_batch_in_host",
]


class RemoteOperatorError(OperatorError):
    """An :class:`OperatorError` raised in the host, re-raised in the parent with the same
    message and retryability."""

    def __init__(self, operator: str, message: str, *, retryable: bool) -> None:
        self.operator = operator
        self.retryable = retryable
        MrpError.__init__(self, message)


class HostError(OperatorError):
    """The host process failed (died, or broke the protocol): worth a retry."""

    def __init__(self, operator: str, message: str) -> None:
        super().__init__(operator, message, retryable=True)


class OutputSource(Protocol):
    """Where a reduce's shard outputs come from (``activities.mrp.reducing.OutputStream``)."""

    def __len__(self) -> int: ...

    def answer(self, msg: dict[str, Any]) -> bytes:
        """One protocol line answering an ``outputs`` ask."""
        ...


class ArrowShard(NamedTuple):
    """A map shard's records as one Arrow table, in the Arrow IPC stream format, for a
    ``batch: arrow`` operator (``map_arrow``). It goes to the host as raw bytes after the
    call's JSON line (``{"arrow": <length>}`` in the shard's place), not as JSON.
    ``data`` is any bytes-like object (a ``pyarrow.Buffer``: written as it is, not
    copied into ``bytes`` first)."""

    data: Any

    @property
    def size(self) -> int:
        return memoryview(self.data).nbytes


class ParquetShard(NamedTuple):
    """A map shard's Parquet slice, undecoded, for a ``batch: arrow`` operator: the slice
    (``RecordSlice`` JSON), the file's size and ``(offset, bytes)`` of the footer and the
    slice's column chunks (``activities.mrp.records.slice_chunks``). The host decodes
    them into the shard's table (``{"parquet": {...}}`` in the shard's place, the ranges'
    bytes raw after the call's line)."""

    slice: dict[str, Any]
    size: int
    ranges: list[tuple[int, bytes]]

    @property
    def entry(self) -> dict[str, Any]:
        return {
            "slice": self.slice,
            "size": self.size,
            "ranges": [[offset, len(data)] for offset, data in self.ranges],
        }


def malformed_error(operator: str, bad: Sequence[Any]) -> OperatorError:
    """A shard's failure for its malformed records under ``on_malformed: fail`` (not
    retryable: the bytes will not change), naming the first."""
    more = f" (and {len(bad) - 1} more in this shard)" if len(bad) > 1 else ""
    return OperatorError(
        operator,
        f"malformed record at {bad[0].describe()}{more}; inputs.on_malformed is fail",
        retryable=False,
    )


def declared_env(names: list[str], source: dict[str, str] | None = None) -> dict[str, str]:
    """The declared variables that are set in ``source`` (default: this process)."""
    env = os.environ if source is None else source
    return {n: env[n] for n in sorted(set(names)) if n in env}


# ---------------------------------------------------------------------------------------
# Parent side


class OperatorHost:
    """One child process serving operator calls; see the module docstring."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = dict(env)
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        # Requests may carry megabytes (Arrow shards): a 1 MiB pipe, not 64 KiB, cuts the
        # writer's and reader's wake-ups 16-fold (Linux; the default stays elsewhere).
        with contextlib.suppress(OSError, AttributeError):
            import fcntl

            fcntl.fcntl(req_w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        try:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "activities.mrp.host_main",
                    str(req_r),
                    str(resp_w),
                    str(os.getpid()),
                    ",".join(sorted(self.env)),
                ],
                env=self.env,
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(req_r, resp_w),
                close_fds=True,
            )
        finally:
            os.close(req_r)
            os.close(resp_w)
        self._out: IO[bytes] = os.fdopen(req_w, "wb")
        self._in: IO[bytes] = os.fdopen(resp_r, "rb")
        self.broken = False

    @property
    def alive(self) -> bool:
        return not self.broken and self.proc.poll() is None

    def call(
        self,
        request: dict[str, Any],
        llm: Callable[[dict[str, Any]], dict[str, Any]],
        read_file: Callable[[dict[str, Any]], bytes],  # given the whole ask
        operator: str,
        outputs: OutputSource | None = None,
        payload: Sequence[Any] = (),
    ) -> dict[str, Any]:
        """Send one call (and ``payload``, bytes-like parts written raw after its line: a
        batch's Arrow shards); serve its ``llm``, ``read_file`` and ``outputs`` requests; return its
        reply."""
        try:
            self._send(request)
            for part in payload:
                self._out.write(memoryview(part).cast("B"))
            if payload:
                self._out.flush()
            while True:
                msg = self._receive(operator)
                rpc = msg.get("rpc")
                if rpc is None:
                    return msg
                if rpc == "llm":
                    self._send(llm(msg))
                elif rpc == "outputs" and outputs is not None:
                    self._out.write(outputs.answer(msg))
                    self._out.flush()
                elif rpc == "read_file":
                    try:
                        data = read_file(msg)
                        self._send({"ok": True, "data": base64.b64encode(data).decode("ascii")})
                    except OperatorError as e:
                        self._send({"ok": False, "error": str(e), "retryable": e.retryable})
                    except Exception as e:
                        self._send(
                            {"ok": False, "error": f"{type(e).__name__}: {e}", "retryable": True}
                        )
                else:
                    raise HostError(operator, f"operator process sent an unknown request {rpc!r}")
        except (OSError, ValueError) as e:
            self.kill()
            raise HostError(operator, f"operator process failed: {e}") from None
        except HostError:
            self.kill()
            raise

    def _send(self, msg: dict[str, Any]) -> None:
        self._out.write(json.dumps(msg, separators=(",", ":")).encode("utf-8") + b"\n")
        self._out.flush()

    def _receive(self, operator: str) -> dict[str, Any]:
        line = self._in.readline()
        if not line:
            code = self.proc.wait(timeout=5)
            raise HostError(operator, f"operator process exited (code {code}) during the call")
        msg = json.loads(line)
        if not isinstance(msg, dict):
            raise HostError(operator, "operator process sent something other than a message")
        return msg

    def kill(self) -> None:
        """Stop the process (by its own PID) and close the pipes."""
        self.broken = True
        with contextlib.suppress(Exception):
            self._out.close()
        with contextlib.suppress(Exception):
            self._in.close()
        if self.proc.poll() is None:
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)


_pool_lock = threading.Lock()
_idle: dict[tuple[tuple[str, str], ...], list[OperatorHost]] = {}


@contextlib.contextmanager
def _host(env: dict[str, str]) -> Iterator[OperatorHost]:
    key = tuple(sorted(env.items()))
    with _pool_lock:
        idle = _idle.setdefault(key, [])
        host = None
        while idle and host is None:
            candidate = idle.pop()
            if candidate.alive:
                host = candidate
            else:
                candidate.kill()
    if host is None:
        host = OperatorHost(env)
    try:
        yield host
    finally:
        with _pool_lock:
            idle = _idle.setdefault(key, [])
            if host.alive and len(idle) < MAX_IDLE:
                idle.append(host)
                host = None
        if host is not None:
            host.kill()


def stop_hosts() -> None:
    """Stop every idle host of this process (``keel worker`` at shutdown; tests)."""
    with _pool_lock:
        hosts = [h for group in _idle.values() for h in group]
        _idle.clear()
    for h in hosts:
        h.kill()


def _llm_handler(ctx: OperatorContext) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def handle(msg: dict[str, Any]) -> dict[str, Any]:
        try:
            result = ctx.llm.complete(msg.get("messages", ""), **dict(msg.get("params") or {}))
        except OperatorError as e:
            return {"ok": False, "error": str(e), "retryable": e.retryable}
        except Exception as e:
            return {"ok": False, "error": f"{type(e).__name__}: {e}", "retryable": True}
        return {"ok": True, "result": result.model_dump(mode="json")}

    return handle


def _host_request(
    kind: OperatorKind,
    handle: Any,
    value: Any,
    ctx: OperatorContext,
    sink: SinkSpec | None,
    out_dir: Path | None,
    memory_mb: int | None,
    outputs: OutputSource | None,
) -> dict[str, Any]:
    """What :func:`run_in_host` sends the host for one call (a streamed reduce's
    ``value`` is not sent)."""
    request = {
        "kind": kind.value,
        "handle": handle.model_dump(mode="json"),
        "value": value,
        "params": ctx.params,
        "seed": ctx.seed,
        "shard_id": ctx.shard_id,
        "failed_shards": ctx.failed_shards,
        "sink": sink.model_dump(mode="json") if sink is not None else None,
        "out_dir": str(out_dir) if out_dir is not None else None,
        "memory_mb": memory_mb,
        "stream": len(outputs) if outputs is not None else None,
    }
    if outputs is not None:
        request["value"] = None
    return request


def run_in_host(
    kind: OperatorKind,
    handle: Any,
    value: Any,
    ctx: OperatorContext,
    *,
    sink: SinkSpec | None = None,
    out_dir: Path | None = None,
    memory_mb: int | None = None,
    outputs: OutputSource | None = None,
) -> Any:
    """Run one operator call in a host whose environment is the operator's declared
    ``env``; the result as the matching ``invoke_*`` returns it. ``ctx`` is the parent's
    context: its LLM client and file reader answer the host, and it receives the
    charged units and log lines. With ``memory_mb`` the call may allocate at most that
    much in the host (see the module docstring). A reduce gets its shard outputs from
    ``outputs`` as the host asks for them (``value`` is then not sent)."""
    spec = handle.spec
    env = declared_env(list(spec.env))
    request = _host_request(kind, handle, value, ctx, sink, out_dir, memory_mb, outputs)
    with _host(env) as host:
        reply = host.call(
            request,
            _llm_handler(ctx),
            lambda msg: ctx.read_file(FileRef.model_validate(msg["ref"])),
            spec.ref,
            outputs,
        )
        if reply.get("discard"):
            host.kill()  # it ran out of memory: not pooled for another call
    result = _settle(reply, ctx, spec.ref)
    if kind is OperatorKind.EVALUATE:
        return Evaluation.model_validate(result)
    if kind is OperatorKind.PRODUCE:
        return ProduceResult.model_validate(result)
    return result


def _settle(reply: dict[str, Any], ctx: OperatorContext, operator: str) -> Any:
    """A host's reply for one call or shard: its log lines and charged units go to
    ``ctx``; its result, or its failure raised."""
    for line in reply.get("logs") or []:
        ctx.log(str(line))
    charged = Decimal(str(reply.get("charged_units", "0")))
    if charged:
        ctx.charged_units += charged
    if not reply.get("ok"):
        raise RemoteOperatorError(
            operator,
            str(reply.get("error", "operator failed")),
            retryable=bool(reply.get("retryable", True)),
        )
    return reply.get("result")


def _shard_entry(value: Any, ctx: OperatorContext) -> dict[str, Any]:
    """A map batch's shard in the request line (an Arrow or Parquet shard's bytes follow
    the line)."""
    entry: dict[str, Any] = {"seed": ctx.seed, "shard_id": ctx.shard_id}
    if isinstance(value, ArrowShard):
        entry["arrow"] = value.size
    elif isinstance(value, ParquetShard):
        entry["parquet"] = value.entry
    else:
        entry["value"] = value
    return entry


def run_map_batch_in_host(
    handle: Any,
    shards: Sequence[tuple[Any, OperatorContext]],
    *,
    memory_mb: int | None = None,
) -> list[tuple[Any, float] | OperatorError]:
    """Run map shards (each its ``value`` and parent context) one after the other in one
    host, in one round trip: the operator handle is sent and checked once, not per shard
    (the pipe's round trip and the handle's check were most of a small shard's cost).
    Each shard's result, with the milliseconds the host spent on it, or its failure, in
    order. Each shard may allocate ``memory_mb`` over what the host held before the batch. A
    shard that runs out of memory ends the host's batch (the host is stopped); the shards
    after it run in a new host. A host that dies (or breaks the protocol) mid-batch
    leaves no way to tell which shard killed it: the batch's unfinished shards then run
    again one per call, so only that shard fails."""
    spec = handle.spec
    env = declared_env(list(spec.env))
    out: list[tuple[Any, float] | OperatorError] = []
    rest = list(shards)
    while rest:
        ctxs = [ctx for _, ctx in rest]
        request = {
            "kind": "map_batch",
            "handle": handle.model_dump(mode="json"),
            "params": ctxs[0].params,
            "memory_mb": memory_mb,
            "shards": [_shard_entry(value, ctx) for value, ctx in rest],
        }
        payload: list[Any] = []
        for value, _ in rest:
            if isinstance(value, ArrowShard):
                payload.append(value.data)
            elif isinstance(value, ParquetShard):
                payload.extend(data for _, data in value.ranges)

        def llm(msg: dict[str, Any], ctxs: list[OperatorContext] = ctxs) -> dict[str, Any]:
            return _llm_handler(ctxs[int(msg.get("shard") or 0)])(msg)

        def read(msg: dict[str, Any], ctxs: list[OperatorContext] = ctxs) -> bytes:
            return ctxs[int(msg.get("shard") or 0)].read_file(FileRef.model_validate(msg["ref"]))

        try:
            with _host(env) as host:
                reply = host.call(request, llm, read, spec.ref, payload=payload)
                if reply.get("discard"):
                    host.kill()  # a shard ran out of memory: not pooled for another call
        except HostError as e:
            if len(rest) == 1:
                out.append(e)  # the shard that killed its host: its attempt failed
                return out
            for value, ctx in rest:  # one per call: only the shard that kills its host fails
                if isinstance(value, ArrowShard | ParquetShard):
                    out.extend(run_map_batch_in_host(handle, [(value, ctx)], memory_mb=memory_mb))
                    continue
                try:
                    out.append((run_in_host(OperatorKind.MAP, handle, value, ctx,
                                            memory_mb=memory_mb), 0.0))  # fmt: skip
                except OperatorError as e:
                    out.append(e)
            return out
        results = reply.get("results")
        if not reply.get("ok") or not isinstance(results, list):
            # The handle or the operator's import failed: every shard of the batch fails so.
            error = RemoteOperatorError(
                spec.ref,
                str(reply.get("error", "operator failed")),
                retryable=bool(reply.get("retryable", True)),
            )
            out.extend(error for _ in rest)
            return out
        for one, (_, ctx) in zip(results, rest, strict=False):
            try:
                out.append((_settle(one, ctx, spec.ref), float(one.get("ms") or 0.0)))
            except RemoteOperatorError as e:
                out.append(e)
        rest = rest[len(results) :]
    return out


# ---------------------------------------------------------------------------------------
# Child side


class _Channel:
    def __init__(self, rfd: int, wfd: int) -> None:
        self.r = os.fdopen(rfd, "rb")
        self.w = os.fdopen(wfd, "wb")
        self.lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        self.w.write(json.dumps(msg, separators=(",", ":")).encode("utf-8") + b"\n")
        self.w.flush()

    def receive(self) -> dict[str, Any] | None:
        line = self.r.readline()
        if not line:
            return None
        msg = json.loads(line)
        assert isinstance(msg, dict)
        return msg

    def read_exact(self, n: int) -> bytes:
        data = self.r.read(n)
        if len(data) != n:
            raise SystemExit(0)  # the parent is gone mid-message
        return data

    def ask(self, msg: dict[str, Any]) -> dict[str, Any]:
        # Operator threads share the channel: one request and its answer at a time.
        with self.lock:
            self.send(msg)
            reply = self.receive()
        if reply is None:
            raise SystemExit(0)
        return reply


class _ProxyLLM:
    def __init__(self, channel: _Channel, operator: str, shard: int = 0) -> None:
        self.channel = channel
        self.operator = operator
        self.shard = shard

    def complete(self, messages: list[dict[str, str]] | str, **params: Any) -> LLMResult:
        ask = {"rpc": "llm", "messages": messages, "params": params, "shard": self.shard}
        reply = self.channel.ask(ask)
        if not reply.get("ok"):
            raise RemoteOperatorError(
                self.operator, str(reply.get("error")), retryable=bool(reply.get("retryable"))
            )
        return LLMResult.model_validate(reply["result"])


def _file_reader(channel: _Channel, operator: str, shard: int = 0) -> Callable[[Any], bytes]:
    def read_file(ref: FileRef | dict[str, Any]) -> bytes:
        f = ref if isinstance(ref, FileRef) else FileRef.model_validate(ref)
        ask = {"rpc": "read_file", "ref": f.model_dump(mode="json"), "shard": shard}
        reply = channel.ask(ask)
        if not reply.get("ok"):
            raise RemoteOperatorError(
                operator, str(reply.get("error")), retryable=bool(reply.get("retryable"))
            )
        return base64.b64decode(reply["data"])

    return read_file


def _data_bytes() -> int:
    """This process's data segment (``VmData``: heap and private writable mappings, what
    ``RLIMIT_DATA`` counts), in bytes."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmData in /proc/self/status")  # pragma: no cover - Linux has it


@contextlib.contextmanager
def memory_limit(memory_mb: int | None) -> Iterator[Callable[[], None]]:
    """While inside, this process may allocate at most ``memory_mb`` MiB more (soft
    ``RLIMIT_DATA`` over what it holds now); the old limit is put back after, or sooner by
    the callable it gives (a batch lifts it for the reply of a shard that ran out of
    memory, whose frames still hold what it allocated)."""
    if not memory_mb:
        yield lambda: None
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _data_bytes() + memory_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)

    def lift() -> None:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))

    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield lift
    finally:
        lift()


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is, or was raised from, a ``MemoryError``."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, MemoryError):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


class _RemoteOutputs(Sequence[JsonValue]):
    """A reduce's shard outputs in the host: read from the parent a batch at a time."""

    def __init__(self, channel: _Channel, count: int, operator: str) -> None:
        self.channel = channel
        self.total = count
        self.operator = operator

    def __len__(self) -> int:
        return self.total

    def _batch(self, start: int, count: int | None = None) -> list[JsonValue]:
        ask: dict[str, Any] = {"rpc": "outputs", "start": start}
        if count is not None:
            ask["count"] = count
        reply = self.channel.ask(ask)
        if not reply.get("ok"):
            raise RemoteOperatorError(
                self.operator, str(reply.get("error")), retryable=bool(reply.get("retryable"))
            )
        items = reply.get("items")
        if not isinstance(items, list) or not items:
            raise RemoteOperatorError(
                self.operator, f"no shard output {start} of {self.total}", retryable=True
            )
        return items

    def __iter__(self) -> Iterator[JsonValue]:
        i = 0
        while i < self.total:
            batch = self._batch(i)
            i += len(batch)
            yield from batch
            del batch

    @overload
    def __getitem__(self, index: int) -> JsonValue: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[JsonValue]: ...

    def __getitem__(self, index: int | slice) -> JsonValue | Sequence[JsonValue]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.total))]
        i = index + self.total if index < 0 else index
        if not 0 <= i < self.total:
            raise IndexError(f"shard output {index} of {self.total}")
        return self._batch(i, 1)[0]


def _serve(channel: _Channel) -> None:
    from activities.mrp.operators import OperatorHandle

    while True:
        request = channel.receive()
        if request is None:
            return
        if request.get("kind") == "map_batch":
            channel.send(_serve_map_batch(channel, request))
            continue
        ctx: OperatorContext | None = None
        memory_mb = request.get("memory_mb")
        try:
            handle = OperatorHandle.model_validate(request["handle"])
            spec = handle.spec

            ctx = _context(channel, spec.ref, request, request.get("params") or {})
            instance = handle.load()
            kind = OperatorKind(request["kind"])
            value: Any = request.get("value")
            if request.get("stream") is not None:
                value = _RemoteOutputs(channel, int(request["stream"]), spec.ref)
            with memory_limit(memory_mb):
                result = _invoke(kind, handle, instance, value, ctx, request)
            reply: dict[str, Any] = {"ok": True, "result": result}
        except Exception as e:
            reply = _failure(e, memory_mb)
        channel.send(_spent(reply, ctx))


def _context(
    channel: _Channel,
    operator: str,
    call: dict[str, Any],
    params: dict[str, Any],
    shard: int = 0,
    env: dict[str, str] | None = None,
) -> OperatorContext:
    """The host's context for a call (or a batch's shard ``shard``): its seed, shard id
    and failed shards from ``call``, proxies that answer for it."""
    return OperatorContext(
        params=dict(params),
        seed=int(call.get("seed") or 0),
        shard_id=call.get("shard_id"),
        llm=_ProxyLLM(channel, operator, shard),
        file_reader=_file_reader(channel, operator, shard),
        operator=operator,
        failed_shards=call.get("failed_shards") or [],
        env=dict(os.environ) if env is None else env,
    )


def _spent(reply: dict[str, Any], ctx: OperatorContext | None) -> dict[str, Any]:
    """``reply`` with what the call charged and logged."""
    if ctx is not None:
        reply["charged_units"] = str(ctx.charged_units)
        reply["logs"] = list(ctx.logs)
    return reply


def _serve_map_batch(channel: _Channel, request: dict[str, Any]) -> dict[str, Any]:
    """A ``map_batch`` call: the handle checked and the operator loaded once, then each
    shard mapped with its own context (seed, shard id, proxies that name its place) under
    its own memory limit; a shard out of memory ends the batch (``discard``)."""
    from activities.mrp.operators import OperatorHandle, invoke_map, invoke_map_arrow

    memory_mb = request.get("memory_mb")
    shards = request.get("shards") or []
    # Arrow shards' bytes follow the line, in shard order: read them all first, so the
    # channel is at the next message whatever happens to the batch.
    tables: dict[int, bytes] = {}
    chunks: dict[int, list[tuple[int, bytes]]] = {}
    for i, shard in enumerate(shards):
        if shard.get("arrow") is not None:
            tables[i] = channel.read_exact(int(shard["arrow"]))
        elif shard.get("parquet") is not None:
            chunks[i] = [
                (int(offset), channel.read_exact(int(length)))
                for offset, length in shard["parquet"]["ranges"]
            ]
    try:
        handle = OperatorHandle.model_validate(request["handle"])
        instance = handle.load()
    except Exception as e:
        return _failure(e, None)
    spec = handle.spec
    params = request.get("params") or {}
    env = dict(os.environ)
    results: list[dict[str, Any]] = []
    # One limit for the batch, set once: each shard may allocate memory_mb over what the
    # host held before the batch (what a limit per shard over that base was, without two
    # setrlimit calls a shard); a shard out of memory ends the batch.
    with memory_limit(memory_mb) as lift:
        for i, shard in enumerate(shards):
            t0 = time.perf_counter()
            ctx = _context(channel, spec.ref, shard, params, i, env)
            try:
                if i in tables:
                    result = invoke_map_arrow(spec, instance, _arrow_table(tables.pop(i)), ctx)
                elif i in chunks:
                    table = _parquet_table(spec.ref, shard["parquet"], chunks.pop(i))
                    result = invoke_map_arrow(spec, instance, table, ctx)
                else:
                    result = invoke_map(spec, instance, shard.get("value"), ctx)
                reply: dict[str, Any] = {"ok": True, "result": result}
            except Exception as e:
                if _out_of_memory(e):
                    lift()  # the batch ends here (discard)
                reply = _failure(e, memory_mb)
            _spent(reply, ctx)["ms"] = (time.perf_counter() - t0) * 1000
            results.append(reply)
            if reply.get("discard"):
                return {"ok": True, "results": results, "discard": True}
    return {"ok": True, "results": results}


def _parquet_table(operator: str, entry: dict[str, Any], ranges: list[tuple[int, bytes]]) -> Any:
    """A Parquet shard's table, decoded here from its footer and column chunks; its
    malformed rows left out, or (``on_malformed: fail``) the shard's failure."""
    from activities.mrp.records import table_of_chunks
    from keel.mrp.records import RecordSlice

    s = RecordSlice.model_validate(entry["slice"])
    got = table_of_chunks(s, int(entry["size"]), ranges)
    if got.malformed and s.on_malformed == "fail":
        raise malformed_error(operator, got.malformed)
    return got.table


def _arrow_table(data: bytes) -> Any:
    """An Arrow IPC stream's table."""
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def _failure(e: Exception, memory_mb: int | None) -> dict[str, Any]:
    """The reply for a call that raised ``e``."""
    if memory_mb and _out_of_memory(e):
        # The same input would need the same memory: not retryable; and the host, which
        # failed to allocate, is not trusted with another call.
        return {
            "ok": False,
            "error": f"went over its memory limit of {memory_mb} MB (policy.shard_memory_mb): {e}",
            "retryable": False,
            "discard": True,
        }
    if isinstance(e, OperatorError):
        return {"ok": False, "error": str(e), "retryable": e.retryable}
    # Loading the operator, a bad request: worth a retry.
    return {"ok": False, "error": f"{type(e).__name__}: {e}", "retryable": True}


def _invoke(
    kind: OperatorKind,
    handle: Any,
    instance: Any,
    value: Any,
    ctx: OperatorContext,
    request: dict[str, Any],
) -> JsonValue:
    from activities.mrp.operators import (
        invoke_evaluate,
        invoke_map,
        invoke_produce,
        invoke_reduce,
    )

    spec = handle.spec
    if kind is OperatorKind.MAP:
        return invoke_map(spec, instance, value, ctx)
    if kind is OperatorKind.REDUCE:
        return invoke_reduce(spec, instance, value, ctx)
    if kind is OperatorKind.EVALUATE:
        return invoke_evaluate(spec, instance, value, ctx).model_dump(mode="json")
    sink = SinkSpec.model_validate(request["sink"])
    produced = invoke_produce(spec, instance, value, sink, Path(request["out_dir"]), ctx)
    return produced.model_dump(mode="json")  # type: ignore[no-any-return]


def _die_with_parent(parent_pid: int) -> None:
    # Not PR_SET_PDEATHSIG: it fires when the parent *thread* that started the host ends
    # (a threads-backend attempt's thread), not the parent process. A watchdog thread
    # ends the host when its parent is gone, even while operator code hangs.
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def main(argv: list[str]) -> None:
    rfd, wfd, parent_pid = int(argv[0]), int(argv[1]), int(argv[2])
    declared = set(filter(None, argv[3].split(","))) if len(argv) > 3 else set()
    _die_with_parent(parent_pid)
    # Python itself may add variables after exec (LC_CTYPE for locale coercion): the
    # operator sees exactly what was declared.
    for name in list(os.environ):
        if name not in declared:
            del os.environ[name]
    # Operator prints must not reach the protocol; fd 1 becomes stderr.
    os.dup2(2, 1)
    _serve(_Channel(rfd, wfd))
