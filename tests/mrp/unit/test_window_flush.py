"""A map window's shard records are written once, even when a flush is cancelled."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest

import activities.mrp.window as window_module
from activities.mrp.window import MapWindow
from keel.mrp.steps import MapWindowInput


async def test_a_flush_cancelled_mid_write_writes_its_batch_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The window's end cancels its flusher and then flushes what is left. A cancel that
    came while a batch was being written put the batch back, and the last flush wrote it
    again: a failed shard's attempts (added up per write) read 4 instead of 2 (seen once
    in a loaded suite run, tests/mrp/integration/test_partial_success.py)."""
    writes: list[int] = []
    in_write = threading.Event()
    release = threading.Event()

    def record_shards(sessions: Any, batch: list[Any]) -> None:
        writes.append(len(batch))
        in_write.set()
        assert release.wait(10), "the test never released the write"

    monkeypatch.setattr(window_module, "record_shards", record_shards)
    monkeypatch.setattr(window_module.activity, "heartbeat", lambda *args: None)
    window = MapWindow(
        SimpleNamespace(settings=None, sessions=None),  # type: ignore[arg-type]
        MapWindowInput.model_construct(),
    )
    window.total = 1
    window.pending.append(SimpleNamespace(shard_id="shard-000001"))  # type: ignore[arg-type]

    flush = asyncio.create_task(window._flush())
    assert await asyncio.to_thread(in_write.wait, 10)
    flush.cancel()
    await asyncio.sleep(0.05)  # the cancel is delivered while the write still runs
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await flush
    await window._flush()  # the window's last flush

    assert writes == [1]
    assert window.pending == []
