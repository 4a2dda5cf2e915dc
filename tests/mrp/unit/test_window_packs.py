"""A map window stores its shards' outputs as packs and records them in bulk (issue 40
§2): one stored object and one statement per table per flush, not one object and one row
write per shard; each shard keeps its own digest and reads back alone, verified, from the
checkpoint index as from its run's rows, and the reduce reads a pack a span at a time."""

from __future__ import annotations

import asyncio
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session, sessionmaker

import activities.mrp.window as window_module
from activities.mrp.backends import ShardAttempt, ShardTask
from activities.mrp.reducing import OutputStream
from activities.mrp.window import FLUSH_MAX, MapWindow, write_batch
from keel.digest import canonical_json, digest_bytes
from store.artifacts import ArtifactCorrupted, LocalArtifactStore
from store.db import init_db, make_engine, make_sessionmaker
from store.mrp_runs import (
    index_run_checkpoints,
    list_shards,
    lookup_checkpoint_outputs,
    lookup_checkpoints,
    read_output,
    shard_output,
    shard_outputs,
)
from tests.mrp.unit.test_runs_store import _shard
from tests.mrp.unit.test_window_end import _window

SHARDS = 3 * FLUSH_MAX + 7


def _output(i: int) -> bytes:
    return canonical_json({"shard": i, "words": i % 7})


class CountingStore(LocalArtifactStore):
    """The local store, counting puts, existence checks and range reads."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.puts = 0
        self.exists_calls = 0
        self.ranges = 0

    def put_bytes(self, data: bytes) -> str:
        self.puts += 1
        return super().put_bytes(data)

    def exists(self, digest: str) -> bool:
        self.exists_calls += 1
        return super().exists(digest)

    def get_range(self, digest: str, offset: int, length: int) -> bytes:
        self.ranges += 1
        return super().get_range(digest, offset, length)


class OutputBackend:
    """Every shard succeeds at once with its own small output, handed back unstored."""

    async def run(self, task: ShardTask, settings: Any, timeout_s: float) -> ShardAttempt:
        await asyncio.sleep(0)
        data = _output(task.shard_index)
        return ShardAttempt(
            ok=True, output_digest=digest_bytes(data), output_bytes=data, units=Decimal(1)
        )


def _sm(tmp_path: Path) -> tuple[sessionmaker[Session], list[str]]:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    init_db(url)
    engine = make_engine(url)
    inserts: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("INSERT"):
            inserts.append(statement.split("(")[0].split()[-1])

    return make_sessionmaker(engine), inserts


async def _run_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, run_id: str, checkpoints: bool
) -> tuple[MapWindow, CountingStore, sessionmaker[Session], list[str]]:
    monkeypatch.setattr(window_module.activity, "heartbeat", lambda *a: None)
    window, tasks, handle, ir = _window(SHARDS)
    sm, inserts = _sm(tmp_path)
    store = CountingStore(tmp_path / "artifacts")
    window.acts.sessions = sm  # type: ignore[misc]
    window.acts.store = store  # type: ignore[misc]
    window.inp = window.inp.model_copy(update={"run_id": run_id, "use_checkpoints": checkpoints})
    await window._run_shards(tasks, handle, ir, OutputBackend(), SHARDS)  # type: ignore[arg-type]
    # The window indexes nothing; the run's finalise indexes what it computed, at once.
    assert "mrp_checkpoints" not in inserts
    if checkpoints:
        index_run_checkpoints(sm, run_id, "op")
        index_run_checkpoints(sm, run_id, "op")  # again: the first writer wins
    return window, store, sm, inserts


async def test_a_window_stores_packs_and_records_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    window, store, sm, inserts = await _run_window(
        tmp_path, monkeypatch, run_id="run-1", checkpoints=True
    )
    assert window.done == SHARDS and window.pending == [] and window.outputs == {}
    outputs = shard_outputs(sm, "run-1")
    assert sorted(outputs) == list(range(SHARDS))
    packs = {o.pack.pack for o in outputs.values() if o.pack is not None}
    # One stored object per flush, one statement per table per flush: not per shard.
    flushes = len([t for t in inserts if t == "mrp_shards"])
    assert store.puts == len(packs) == flushes <= SHARDS // 16
    assert inserts.count("mrp_checkpoints") == 2  # the run's two index statements
    files = [p for p in (tmp_path / "artifacts").rglob("*") if p.is_file()]
    assert len(files) == len(packs)
    # Each shard keeps its own digest and reads back alone, verified.
    for i, o in outputs.items():
        assert o.digest == digest_bytes(_output(i))
        assert read_output(store, o) == _output(i)
    assert shard_output(sm, store, "run-1", 5) == _output(5)
    assert [r.output_digest for r in list_shards(sm, "run-1")] == [
        digest_bytes(_output(i)) for i in range(SHARDS)
    ]
    # The checkpoint index names the digest and the place.
    keys = [r.checkpoint_key for r in list_shards(sm, "run-1")]
    assert lookup_checkpoints(sm, keys[:3]) == {
        k: digest_bytes(_output(i)) for i, k in enumerate(keys[:3])
    }
    assert all(o.pack is not None for o in lookup_checkpoint_outputs(sm, keys).values())

    # The reduce's stream: every output in shard order, about one range read per pack.
    store.ranges = 0
    with OutputStream(store, [outputs[i] for i in range(SHARDS)]) as stream:
        served: list[bytes] = []
        while len(served) < SHARDS:
            served += stream.batch(len(served))
    assert served == [_output(i) for i in range(SHARDS)]
    assert store.ranges <= len(packs) * stream.batches


async def test_checkpoints_of_packed_outputs_are_found_with_one_check_per_pack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store, sm, _ = await _run_window(tmp_path, monkeypatch, run_id="run-1", checkpoints=True)
    packs = {o.pack for o in shard_outputs(sm, "run-1").values()}
    window, tasks, _, _ = _window(SHARDS)
    window.acts.sessions = sm  # type: ignore[misc]
    window.acts.store = store  # type: ignore[misc]
    window.inp = window.inp.model_copy(update={"run_id": "run-2", "use_checkpoints": True})
    store.exists_calls = 0
    store.puts = 0
    rest = await window._from_checkpoints(tasks)
    await window._flush()
    assert rest == [] and window.counters.skipped == SHARDS
    assert store.exists_calls == len({p.pack for p in packs if p is not None})
    assert store.puts == 0  # nothing stored again
    again = shard_outputs(sm, "run-2")
    assert again == shard_outputs(sm, "run-1")
    assert {r.source for r in list_shards(sm, "run-2")} == {"checkpoint"}
    assert read_output(store, again[SHARDS - 1]) == _output(SHARDS - 1)


def test_bulk_writes_do_not_grow_with_the_batch(tmp_path: Path) -> None:
    """write_batch: one put and one INSERT whatever the batch's size; a pack of
    one distinct output is that output's own object, recorded with no place."""
    sm, inserts = _sm(tmp_path)
    store = CountingStore(tmp_path / "artifacts")
    for run, n in (("small", 3), ("large", 200)):
        inserts.clear()
        store.puts = 0
        batch = [_shard(i, run_id=run, output_digest=digest_bytes(_output(i))) for i in range(n)]
        write_batch(store, sm, batch, {i: _output(i) for i in range(n)}, {})
        assert store.puts == 1 and inserts == ["mrp_shards"]
    same = canonical_json({"items": 1})
    batch = [_shard(i, run_id="same", output_digest=digest_bytes(same)) for i in range(4)]
    write_batch(store, sm, batch, dict.fromkeys(range(4), same), {})
    alone = shard_outputs(sm, "same")
    assert {o.pack for o in alone.values()} == {None}
    assert store.get_bytes(digest_bytes(same)) == same


async def test_a_changed_pack_fails_the_read_of_its_member(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, store, sm, _ = await _run_window(tmp_path, monkeypatch, run_id="run-1", checkpoints=False)
    o = shard_outputs(sm, "run-1")[3]
    assert o.pack is not None
    path = store.path_for(o.pack.pack)
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(data.replace(b'"shard":3,', b'"shard":8,'))
    with pytest.raises(ArtifactCorrupted):
        read_output(store, o)
    with OutputStream(store, [o]) as stream, pytest.raises(ArtifactCorrupted):
        stream.batch(0)
