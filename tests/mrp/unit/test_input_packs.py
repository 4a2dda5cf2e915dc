"""Shard inputs in packs (issue 40 §2): the compiler packs consecutive shards' payloads,
the IR names each payload's place in ~20 bytes, a Ray batch reads its members in one
ranged read, and each member is still proved by its own digest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activities.mrp.backends import read_shard_inputs
from keel.digest import canonical_json, digest_bytes
from keel.mrp import CompileResult, compile_job, ir_from_json
from keel.mrp.ir import INPUT_MEMBER_MAX, INPUTS_PER_PACK
from store.artifacts import ArtifactCorrupted, ArtifactNotFound, LocalArtifactStore
from tests.mrp.unit.mrp_jobs import job_text, load_caps, load_registry

REGISTRY = load_registry()
CAPS = load_caps().model_copy(
    update={"max_shards": 100_000, "max_budget_usd": None, "max_budget_units": None}
)
WORDCOUNT = job_text("valid/wordcount.yaml")


def job_of(items: list[str], shard_size: int = 1, ids: bool = True) -> str:
    """The wordcount job with these texts as its items (numbered unless ``ids`` is
    false), ``shard_size`` to a shard."""
    head, rest = WORDCOUNT.split("  items:\n", 1)
    tail = rest[rest.index("  shard_size:") :].replace("shard_size: 2", f"shard_size: {shard_size}")
    lines = "".join(
        f"    - {{id: {i if ids else 0}, text: {json.dumps(t)}}}\n" for i, t in enumerate(items)
    )
    return (
        (head + "  items:\n" + lines + tail)
        .replace('budget_units: "10"', 'budget_units: "100000"')
        .replace('budget_usd: "1.00"', 'budget_usd: "1000.00"')
    )


def compiled(items: list[str], shard_size: int = 1, ids: bool = True) -> CompileResult:
    return compile_job(job_of(items, shard_size, ids), REGISTRY, CAPS)


def test_consecutive_shards_share_a_pack_and_each_place_holds_its_payload() -> None:
    n = INPUTS_PER_PACK + 5
    result = compiled([f"word {i}" for i in range(n)])
    ir = result.ir
    assert len(ir.map_tasks) == n
    assert len(ir.input_packs) == 2 == len(result.input_packs)
    assert ir.input_packs == [digest_bytes(p) for p in result.input_packs]
    for t in ir.map_tasks:
        assert t.input_at is not None
        number, offset, length = t.input_at
        assert number == (0 if t.shard_index < INPUTS_PER_PACK else 1)
        member = result.input_packs[number][offset : offset + length]
        assert member == canonical_json(result.shard_inputs[t.input_digest].canonical())
        assert digest_bytes(member) == t.input_digest
    # The objects the payloads need: the two packs, nothing alone.
    assert ir.stored_inputs() == set(ir.input_packs)
    # The IR names a place in tens of bytes a shard.
    per_task = [len(canonical_json(list(t.input_at or ()))) for t in ir.map_tasks]
    assert max(per_task) < 30
    # ... and reads back as it was written.
    assert ir_from_json(result.ir_json()) == ir


def test_a_large_payload_and_a_lone_distinct_payload_are_stored_alone() -> None:
    big = "x" * (INPUT_MEMBER_MAX + 1)
    result = compiled(["a", "b", big, "c"])
    tasks = result.ir.map_tasks
    assert [t.input_at is None for t in tasks] == [False, False, True, False]
    assert tasks[2].input_digest in result.ir.stored_inputs()
    # Three equal payloads are one distinct member: no pack, stored alone (one object).
    same = compiled(["same"] * 3, ids=False)
    assert same.ir.input_packs == [] and all(t.input_at is None for t in same.ir.map_tasks)
    assert len(same.ir.stored_inputs()) == 1


def test_an_ir_without_packs_serialises_as_before() -> None:
    """Old IRs (every payload alone) keep their bytes and digest: no new keys."""
    ir = compiled(["same"] * 2, ids=False).ir
    data = json.loads(ir.to_json())
    assert "input_packs" not in data
    assert all("input_at" not in t for t in data["map_tasks"])


class CountingStore(LocalArtifactStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.ranges: list[tuple[str, int, int]] = []

    def get_range(self, digest: str, offset: int, length: int) -> bytes:
        self.ranges.append((digest, offset, length))
        return super().get_range(digest, offset, length)


def stored(tmp_path: Path, result: CompileResult) -> CountingStore:
    store = CountingStore(tmp_path / "store")
    assert store.put_many(result.input_packs) == result.ir.input_packs
    return store


def test_a_batch_of_consecutive_shards_reads_its_pack_once(tmp_path: Path) -> None:
    result = compiled([f"word {i}" for i in range(300)])
    store = stored(tmp_path, result)
    ir = result.ir
    batch = ir.map_tasks[100:228]
    got = read_shard_inputs(store, [(t.input_digest, ir.input_place(t)) for t in batch])
    assert len(store.ranges) == 1
    pack, offset, length = store.ranges[0]
    places = [ir.input_place(t) for t in batch]
    assert pack == ir.input_packs[0]
    # The range covers exactly the batch's members (and the newlines between them).
    assert offset == places[0][1]  # type: ignore[index]
    assert offset + length == places[-1][1] + places[-1][2]  # type: ignore[index]
    assert got == [canonical_json(result.shard_inputs[t.input_digest].canonical()) for t in batch]


def test_scattered_shards_are_read_one_by_one(tmp_path: Path) -> None:
    result = compiled([f"word {i} " + "x" * 1000 for i in range(300)])
    store = stored(tmp_path, result)
    ir = result.ir
    batch = [ir.map_tasks[0], ir.map_tasks[299]]  # far apart: one range would read ~all
    got = read_shard_inputs(store, [(t.input_digest, ir.input_place(t)) for t in batch])
    assert [r[2] for r in store.ranges] == [p[2] for p in map(ir.input_place, batch)]  # type: ignore[index]
    assert all(isinstance(g, bytes) for g in got)


def test_a_changed_member_fails_only_its_own_shard(tmp_path: Path) -> None:
    result = compiled([f"word {i}" for i in range(10)])
    ir = result.ir
    store = stored(tmp_path, result)
    # Flip one byte inside shard 4's member, in the stored pack.
    path = store._path(ir.input_packs[0].removeprefix("blake3:"))  # the local layout
    data = bytearray(path.read_bytes())
    _, offset, length = ir.input_place(ir.map_tasks[4])  # type: ignore[misc]
    data[offset + length // 2] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    got = read_shard_inputs(store, [(t.input_digest, ir.input_place(t)) for t in ir.map_tasks])
    assert isinstance(got[4], ArtifactCorrupted)
    assert all(isinstance(g, bytes) for i, g in enumerate(got) if i != 4)


def test_a_missing_pack_fails_its_shards_with_the_stores_error(tmp_path: Path) -> None:
    result = compiled([f"word {i}" for i in range(10)])
    ir = result.ir
    store = CountingStore(tmp_path / "empty")
    got = read_shard_inputs(store, [(t.input_digest, ir.input_place(t)) for t in ir.map_tasks])
    assert all(isinstance(g, ArtifactNotFound) for g in got)


@pytest.mark.parametrize("size", [1, 2])
def test_a_pack_never_holds_more_than_its_shard_count(size: int) -> None:
    result = compiled([f"w{i}" for i in range(2 * INPUTS_PER_PACK * size)], shard_size=size)
    assert len(result.ir.input_packs) == 2


@pytest.mark.parametrize(
    "label", ["reduce", "map:blake3:" + "0" * 64, 'quote " and \\ back', "ünïcode ✓", ""]
)
@pytest.mark.parametrize("parent", [0, 1, 2**62 + 12345, -7])
def test_written_out_seed_and_checkpoint_key_equal_their_canonical_json(
    label: str, parent: int
) -> None:
    """``derive_seed`` and ``checkpoint_key`` write their canonical JSON by hand (once a
    shard): the same bytes as ``canonical_json`` of the dict, so no seed or key changes."""
    import blake3

    from keel.digest import digest_json
    from keel.mrp.ir import CHECKPOINT_KEY_KIND, checkpoint_key
    from keel.mrp.normalize import SEED_BITS, SEED_CONTEXT, derive_seed

    material = canonical_json({"parent": parent, "label": label})
    raw = blake3.blake3(material, derive_key_context=SEED_CONTEXT).digest(length=8)
    assert derive_seed(parent, label) == int.from_bytes(raw, "big") >> (64 - SEED_BITS)
    operator = "blake3:" + "1" * 64
    assert checkpoint_key(operator, label, parent) == digest_json(
        {
            "kind": CHECKPOINT_KEY_KIND,
            "operator_digest": operator,
            "input_digest": label,
            "seed": parent,
        }
    )


def test_windows_that_start_together_parse_their_ir_once(tmp_path: Path) -> None:
    """``load_ir``: one parse per process however many windows ask at once (at 100,000
    shards a parse is about a second of CPU, and windows start together)."""
    import threading

    from activities.mrp import window

    result = compiled([f"word {i}" for i in range(50)])

    class Counting(LocalArtifactStore):
        reads = 0

        def get_bytes(self, digest: str) -> bytes:
            Counting.reads += 1
            return super().get_bytes(digest)

    store = Counting(tmp_path / "ir")
    digest = store.put_bytes(result.ir_json())
    window._ir_cache.pop(digest, None)
    start = threading.Barrier(4)
    got: list[object] = []

    def load() -> None:
        start.wait()
        got.append(window.load_ir(store, digest))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert Counting.reads == 1
    assert len(got) == 4 and all(ir is got[0] for ir in got) and got[0] == result.ir
