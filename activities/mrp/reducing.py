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
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from types import TracebackType
from typing import Any

from store.artifacts import ArtifactStore

__all__ = ["BATCH_BYTES", "BATCH_MAX", "READ_AHEAD", "OutputStream"]

BATCH_BYTES = 1024 * 1024
BATCH_MAX = 256
READ_AHEAD = 8


class OutputStream:
    """The outputs under ``digests``, in that order, served in batches to a host."""

    def __init__(self, store: ArtifactStore, digests: list[str]) -> None:
        self.store = store
        self.digests = list(digests)
        self._pool = ThreadPoolExecutor(max_workers=READ_AHEAD, thread_name_prefix="mrp-reduce")
        # For tests and telemetry: batches served, and the most bytes one batch held.
        self.batches = 0
        self.largest_batch = 0

    def __len__(self) -> int:
        return len(self.digests)

    def __enter__(self) -> OutputStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _read(self, digest: str) -> bytes:
        data = self.store.get_bytes(digest)
        # Canonical JSON has no raw newline (the protocol's separator); anything else
        # stored under an output digest is re-encoded on one line.
        return data if b"\n" not in data else json.dumps(json.loads(data)).encode("utf-8")

    def batch(self, start: int, count: int | None = None) -> list[bytes]:
        """The stored bytes of the outputs from ``start`` on, one batch of them."""
        total = len(self.digests)
        if not 0 <= start <= total:
            raise IndexError(f"shard output {start} of {total}")
        limit = min(BATCH_MAX, count or BATCH_MAX)
        out: list[bytes] = []
        size = 0
        i = start
        while i < total and len(out) < limit and size < BATCH_BYTES:
            chunk = self.digests[i : i + min(READ_AHEAD, limit - len(out))]
            for data in self._pool.map(self._read, chunk):
                out.append(data)
                size += len(data)
            i += len(chunk)
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
