"""A map window ends once its shards have: the flusher stops when the window cancels it.

Seen in bench/mrp_scale.py (5,000 and 100,000 shards): the last window sat at ``done N/N``,
heartbeating every 0.25 s with no CPU, for minutes. Python 3.11's ``asyncio.wait_for``
returns the inner result instead of raising when it is cancelled after the inner awaitable
has finished; the flusher waited on ``flush_now`` that way, so a window whose last shards
filled a flush batch (``flush_now`` set) in the loop turn that ended the window lost the
cancel, and its flusher went on flushing (nothing) and heartbeating forever.
"""

from __future__ import annotations

import asyncio
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import pytest

import activities.mrp.window as window_module
from activities.mrp.backends import ShardAttempt, ShardTask
from activities.mrp.operators import OperatorHandle
from activities.mrp.window import FLUSH_MAX, MapWindow
from keel.mrp.ir import MapTask, checkpoint_key
from keel.mrp.registry import OperatorSpec
from keel.mrp.steps import MapWindowInput

DIGEST = "blake3:" + "0" * 64


class BurstBackend:
    """Holds every attempt until ``shards`` are waiting, then finishes them all in one
    loop turn (the tail of a window whose last Ray batch returns at once)."""

    def __init__(self, shards: int) -> None:
        self.shards = shards
        self.waiting = 0
        self.go = asyncio.Event()
        self.ran: list[int] = []

    async def run(self, task: ShardTask, settings: Any, timeout_s: float) -> ShardAttempt:
        self.waiting += 1
        if self.waiting == self.shards:
            self.go.set()
        await self.go.wait()
        self.ran.append(task.shard_index)
        return ShardAttempt(ok=True, output_digest=DIGEST, units=Decimal(1))


def _window(shards: int) -> tuple[MapWindow, list[MapTask], OperatorHandle, Any]:
    async def record_llm_calls(logs: list[Any]) -> None:
        return None

    host = SimpleNamespace(
        settings=None, sessions=None, llm_model="", record_llm_calls=record_llm_calls
    )
    inp = MapWindowInput(
        run_id="run-1",
        workflow_id="wf-1",
        ir_digest=DIGEST,
        start=0,
        end=shards,
        backend="threads",
        parallelism=shards,
        use_checkpoints=False,
    )
    spec = OperatorSpec(
        name="burst",
        version="1.0.0",
        kind="map",  # type: ignore[arg-type]
        entrypoint="op:Burst",
        code_digest=DIGEST,
    )
    handle = OperatorHandle(spec=spec, folder="/nonexistent")
    tasks = [
        MapTask(
            shard_index=i,
            shard_id=f"shard-{i:06d}",
            input_digest=DIGEST,
            item_count=1,
            operator_ref=spec.ref,
            operator_digest=DIGEST,
            seed=i,
            checkpoint_key=checkpoint_key(DIGEST, DIGEST, i),
        )
        for i in range(shards)
    ]
    ir = SimpleNamespace(
        limits=SimpleNamespace(max_shard_retries=0, shard_timeout_s=60.0, shard_memory_mb=None),
        operators={"map": SimpleNamespace(params={})},
        input_place=lambda task: None,
    )
    window = MapWindow(host, inp)  # type: ignore[arg-type]
    window.total = shards
    return window, tasks, handle, ir


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shards", [FLUSH_MAX, FLUSH_MAX + 7, 3 * FLUSH_MAX])
async def test_a_window_whose_last_shards_fill_a_flush_ends(
    monkeypatch: pytest.MonkeyPatch, shards: int
) -> None:
    written: list[int] = []
    beats: list[Any] = []
    monkeypatch.setattr(
        window_module,
        "record_shards",
        lambda sessions, batch: written.extend(r.shard_index for r in batch),
    )
    monkeypatch.setattr(window_module.activity, "heartbeat", lambda *a: beats.append(a))
    window, tasks, handle, ir = _window(shards)
    backend = BurstBackend(shards)

    run = asyncio.create_task(window._run_shards(tasks, handle, ir, backend, shards))  # type: ignore[arg-type]
    finished, _ = await asyncio.wait({run}, timeout=10)
    if not finished:
        # Cancel it (the window's cancel reaches the stuck flusher), then fail.
        run.cancel()
        await asyncio.wait({run}, timeout=10)
        pytest.fail(
            f"the window did not end: done {window.done}/{window.total}, "
            f"{len(beats)} heartbeats since the last shard finished"
        )
    run.result()

    assert sorted(backend.ran) == list(range(shards))
    assert window.done == shards and window.counters.run == shards
    # Every shard's record written, once.
    assert sorted(written) == list(range(shards))
    assert window.pending == []
