"""The reduce streams: shard outputs go from the store to the reducer's host a batch at a
time (activities/mrp/reducing.py), so the reduce of many outputs stays under a memory
bound in both processes, whatever their total size.

The worker side is measured with ``tracemalloc`` (peak of Python allocations while the
reduce runs); the host side is bounded by the kernel: the reduce runs under a 24 MB
``memory_limit`` (RLIMIT_DATA over the host's size) while the outputs total ~50 MB. A
reducer that takes them all in a list fails under the same limit, so the bound is real.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from activities.mrp.host import run_in_host
from activities.mrp.operators import load_mrp_config
from activities.mrp.reducing import BATCH_BYTES, BATCH_MAX, READ_AHEAD, OutputStream
from keel.mrp.registry import OperatorKind
from keel.mrp.sdk import OperatorContext, OperatorError
from keel.settings import Settings
from store.artifacts import ArtifactStore, artifact_store_from_settings
from tests.mrp.operators import CONFIG

SHARDS = 800
PAD = 64 * 1024  # bytes of padding per output: ~50 MB in all
LIMIT_MB = 24


def outputs(tmp_path: Path) -> tuple[ArtifactStore, list[str], int]:
    store = artifact_store_from_settings(Settings(data_dir=tmp_path / "keel"))
    digests = []
    total = 0
    for i in range(SHARDS):
        value = {"items": 1, "chars": i, "pad": f"{i:06d}" + "x" * PAD}
        digest = store.put_json(value)
        digests.append(digest)
        total += len(store.get_bytes(digest))
    return store, digests, total


def reduce(store: ArtifactStore, digests: list[str], ref: str) -> tuple[object, int, int]:
    """Run ``ref`` over the outputs in its host under the limit; (value, worker peak
    bytes, largest batch)."""
    handle = load_mrp_config(path=CONFIG).handle(ref)
    ctx = OperatorContext(params={}, seed=0, operator=ref)
    tracemalloc.start()
    try:
        with OutputStream(store, digests) as stream:
            reduced = run_in_host(
                OperatorKind.REDUCE, handle, None, ctx, outputs=stream, memory_mb=LIMIT_MB
            )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return reduced, peak, stream.largest_batch


def test_the_reduce_of_many_outputs_stays_under_a_memory_bound(tmp_path: Path) -> None:
    store, digests, total = outputs(tmp_path)
    assert total > 2 * LIMIT_MB * 1024 * 1024  # more than twice what the host may hold
    reduced, peak, largest = reduce(store, digests, "stream-sum@1.0.0")
    assert reduced == {
        "shards": SHARDS,
        "totals": {"chars": SHARDS * (SHARDS - 1) // 2, "items": SHARDS},
    }
    # One batch at a time: at most BATCH_BYTES plus one read-ahead of outputs.
    assert largest <= BATCH_BYTES + READ_AHEAD * (PAD + 100)
    # The worker held a few batches' worth (measured: ~5 MB of ~52 MB; loading them all
    # and encoding one message, as the reduce did before, peaked at 3x the outputs).
    assert peak < 8 * BATCH_BYTES < total / 5, (peak, total)


def test_a_reducer_that_holds_every_output_goes_over_the_same_bound(tmp_path: Path) -> None:
    store, digests, _ = outputs(tmp_path)
    with pytest.raises(OperatorError, match=f"went over its memory limit of {LIMIT_MB} MB"):
        reduce(store, digests, "numeric-sum@1.0.0")


def test_outputs_are_served_in_shard_order_and_checked(tmp_path: Path) -> None:
    """Every output once, in order, over several batches; a bad one fails the reduce
    naming its index, as the eager check did."""
    store = artifact_store_from_settings(Settings(data_dir=tmp_path / "keel"))
    digests = [store.put_json({"items": 1, "chars": i}) for i in range(BATCH_MAX + 500)]
    with OutputStream(store, digests) as stream:
        served: list[bytes] = []
        while len(served) < len(digests):
            served += stream.batch(len(served))
        assert stream.batches > 1
    assert served == [store.get_bytes(d) for d in digests]
    bad = [*digests[:5], store.put_json(["not", "an", "object"]), *digests[5:]]
    handle = load_mrp_config(path=CONFIG).handle("stream-sum@1.0.0")
    ctx = OperatorContext(params={}, seed=0, operator="stream-sum@1.0.0")
    with OutputStream(store, bad) as stream, pytest.raises(OperatorError, match="shard output 5"):
        run_in_host(OperatorKind.REDUCE, handle, None, ctx, outputs=stream)


def test_equal_outputs_stored_alone_are_read_once(tmp_path: Path) -> None:
    """A job whose shards all answer the same has every output alone under one digest (a
    pack of one distinct output is that output's object): the stream read it once a
    shard, 100,000 file reads for 100,000 shards. Now once, and still served in order."""
    store = artifact_store_from_settings(Settings(data_dir=tmp_path / "keel"))
    same = store.put_json({"items": 1, "chars": 7})
    other = store.put_json({"items": 1, "chars": 8})
    digests = [same] * 3000 + [other] + [same] * 10
    reads: list[str] = []
    real = store.get_bytes

    def counting(digest: str) -> bytes:
        reads.append(digest)
        return real(digest)

    store.get_bytes = counting  # type: ignore[method-assign]
    with OutputStream(store, digests) as stream:
        served: list[bytes] = []
        while len(served) < len(digests):
            served += stream.batch(len(served))
    assert served == [real(d) for d in digests]
    assert sorted(reads) == sorted([same, other])
