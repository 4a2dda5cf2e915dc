"""The reduce's shard outputs, streamed from the artifact store to the operator host.

The reduce used to read every shard output into the worker, send them to the host in one
message, and have the host parse them all: memory grew with the shard count on both
sides. Now the host asks for them (``{"rpc": "outputs", "start": i}``) as the reducer
reads, and :class:`OutputStream` answers each ask with the next batch, read from the
store in shard order: at most :data:`BATCH_MAX` outputs and about :data:`BATCH_BYTES`
(read :data:`READ_AHEAD` at a time, so a batch ends at most that many outputs past the
byte mark). The stored bytes are canonical JSON; they go into the answer as they are, not
parsed in the worker. What the worker holds for a reduce is one batch and the list of
digests, whatever the shard count; the host holds one batch and the reducer's own state
(a :class:`~keel.mrp.sdk.StreamingReducerBase`) or every output (any other reducer, as
before).

An output is stored alone or is a member of a map window's pack
(``store.mrp_runs.StoredOutput``). A batch's members of one pack are read with one ranged
read spanning them (at most :data:`SPAN_MAX` bytes; a wider span is read member by
member), so a pack written in shard order is read about once, a batch at a time; each
member is checked against its own digest.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from store.artifacts import ArtifactStore
from store.mrp_runs import StoredOutput, read_output

__all__ = ["BATCH_BYTES", "BATCH_MAX", "READ_AHEAD", "SPAN_MAX", "OutputStream"]

BATCH_BYTES = 1024 * 1024
# A round trip to the host per batch: 2,048 small outputs (was 256, 391 round trips at
# 100,000 shards); BATCH_BYTES still bounds what a batch holds.
BATCH_MAX = 2048
READ_AHEAD = 8
SPAN_MAX = 4 * BATCH_BYTES
# Outputs stored alone that a stream keeps once read (equal outputs are read once).
ALONE_KEPT = 256
ALONE_MAX = 64 * 1024


class OutputStream:
    """The outputs ``outputs`` (digests, or :class:`StoredOutput` for packed ones), in
    that order, served in batches to a host."""

    def __init__(self, store: ArtifactStore, outputs: Sequence[str | StoredOutput]) -> None:
        self.store = store
        self.outputs = [o if isinstance(o, StoredOutput) else StoredOutput(o) for o in outputs]
        self._pool = ThreadPoolExecutor(max_workers=READ_AHEAD, thread_name_prefix="mrp-reduce")
        # Outputs stored alone, by digest, as read: equal outputs (a pack of one distinct
        # output is that output's own object, so a job whose shards all answer the same
        # has every output alone, under one digest) are read once, not once a shard.
        self._alone: dict[str, bytes] = {}
        # For tests and telemetry: batches served, and the most bytes one batch held.
        self.batches = 0
        self.largest_batch = 0

    @property
    def digests(self) -> list[str]:
        return [o.digest for o in self.outputs]

    def __len__(self) -> int:
        return len(self.outputs)

    def __enter__(self) -> OutputStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    @staticmethod
    def _one_line(data: bytes) -> bytes:
        # Canonical JSON has no raw newline (the protocol's separator); anything else
        # stored under an output digest is re-encoded on one line.
        return data if b"\n" not in data else json.dumps(json.loads(data)).encode("utf-8")

    def _read(self, output: StoredOutput) -> bytes:
        return self._one_line(read_output(self.store, output))

    def _read_span(self, members: list[StoredOutput]) -> list[bytes]:
        """Members of one pack, with one ranged read over them (or one read each when
        they lie too far apart), each verified against its digest."""
        refs = [m.pack for m in members if m.pack is not None]
        if len(members) == 1 or len(refs) != len(members):
            return [self._read(m) for m in members]
        pairs = [(r, m.digest) for m, r in zip(members, refs, strict=True)]
        return [self._one_line(data) for data in self.store.get_members(pairs, SPAN_MAX)]

    def _chunk_end(self, i: int, room: int, room_bytes: int) -> int:
        """Where the next read of the batch ends: at most ``room`` outputs, READ_AHEAD of
        them stored alone, packed ones up to ``room_bytes`` (their sizes are known)."""
        total = len(self.outputs)
        j = i
        alone = 0
        planned = 0
        new: set[str] = set()
        while j < total and j - i < room:
            ref = self.outputs[j].pack
            if ref is None:
                digest = self.outputs[j].digest
                kept = self._alone.get(digest)
                if kept is not None:  # read already: its size is known
                    if j > i and planned + len(kept) > room_bytes:
                        break
                    planned += len(kept)
                elif digest not in new:
                    if alone == READ_AHEAD:
                        break
                    alone += 1
                    new.add(digest)
            else:
                if j > i and planned + ref.length > room_bytes:
                    break
                planned += ref.length
            j += 1
        return j

    def _read_chunk(self, chunk: list[StoredOutput]) -> list[bytes]:
        """The chunk's outputs in order: those of one pack in one read, the others each
        alone, in parallel."""
        groups: dict[str, list[int]] = {}
        jobs: list[list[int]] = []
        out: list[bytes] = [b""] * len(chunk)
        same: dict[str, list[int]] = {}
        for k, o in enumerate(chunk):
            if o.pack is None:
                if o.digest in self._alone:
                    out[k] = self._alone[o.digest]
                elif o.digest in same:
                    same[o.digest].append(k)
                else:
                    same[o.digest] = [k]
                    jobs.append([k])
            else:
                if o.pack.pack not in groups:
                    groups[o.pack.pack] = []
                    jobs.append(groups[o.pack.pack])
                groups[o.pack.pack].append(k)
        for ks, datas in zip(
            jobs,
            self._pool.map(lambda ks: self._read_span([chunk[k] for k in ks]), jobs),
            strict=True,
        ):
            for k, data in zip(ks, datas, strict=True):
                out[k] = data
                digest = chunk[k].digest
                if chunk[k].pack is None:
                    for other in same.get(digest, ())[1:]:
                        out[other] = data
                    if len(self._alone) < ALONE_KEPT and len(data) <= ALONE_MAX:
                        self._alone[digest] = data
        return out

    def batch(self, start: int, count: int | None = None) -> list[bytes]:
        """The stored bytes of the outputs from ``start`` on, one batch of them."""
        total = len(self.outputs)
        if not 0 <= start <= total:
            raise IndexError(f"shard output {start} of {total}")
        limit = min(BATCH_MAX, count or BATCH_MAX)
        out: list[bytes] = []
        size = 0
        i = start
        while i < total and len(out) < limit and size < BATCH_BYTES:
            j = self._chunk_end(i, limit - len(out), BATCH_BYTES - size)
            for data in self._read_chunk(self.outputs[i:j]):
                out.append(data)
                size += len(data)
            i = j
        self.batches += 1
        self.largest_batch = max(self.largest_batch, size)
        return out

    def answer(self, msg: dict[str, Any]) -> bytes:
        """The host's ``outputs`` ask answered: one protocol line (ends in a newline)."""
        try:
            items = self.batch(int(msg["start"]), msg.get("count"))
        except Exception as e:  # the store failed, or a bad ask: worth a retry
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}", "retryable": True}
            return json.dumps(reply, separators=(",", ":")).encode("utf-8") + b"\n"
        return b'{"ok":true,"items":[' + b",".join(items) + b"]}\n"
