"""Parquet inputs at real sizes (issue 40): compile cuts shards from the footer and reads
no row of a column that cannot hold a malformed record; a shard reads the footer and, of
its row group, only the column chunks of ``inputs.columns``; a ``batch: arrow`` operator
gets the shard as one Arrow table and answers what its per-record ``map`` answers.

Bytes are counted by the store's own readers (``BlobReader.bytes_read``) and by the
compile's ``ScanProgress.bytes``, against the column chunk sizes in the file's footer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import JsonValue

from activities.mrp.backends import _shard_items
from activities.mrp.host import ArrowShard, ParquetShard, run_map_batch_in_host, stop_hosts
from activities.mrp.operators import load_mrp_config
from activities.mrp.records import (
    ScanProgress,
    read_slice_counted,
    read_slice_table,
    scan_record_file,
)
from keel.mrp.dsl import InputsSpec
from keel.mrp.errors import InputsRefused
from keel.mrp.normalize import ShardInput
from keel.mrp.records import RecordSlice
from keel.mrp.sdk import OperatorContext
from store.artifacts import LocalArtifactStore
from tests.support.mrp_operators import TEST_CONFIG

ROWS = 40_000
GROUP = 5_000  # 8 row groups
LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)


def write(path: Path, score: bool = False) -> Path:
    """``id``, ``amount`` (int64) and ``tag`` (24 random letters: the bulk of each group),
    and with ``score`` a float column holding one NaN (row 7, 1-based)."""
    rng = np.random.default_rng(40)
    columns: dict[str, pa.Array] = {
        "id": pa.array(np.arange(ROWS)),
        "amount": pa.array(rng.integers(0, 10_000_000, ROWS)),
        "tag": pa.array(rng.choice(LETTERS, size=(ROWS, 24)).view("S24").ravel().astype(str)),
    }
    if score:
        values = rng.random(ROWS)
        values[6] = np.nan
        columns["score"] = pa.array(values)
    pq.write_table(pa.table(columns), path, row_group_size=GROUP)
    return path


def inputs(**kw: object) -> InputsSpec:
    return InputsSpec(files=["data/*"], format="parquet", records_per_shard=GROUP, **kw)  # type: ignore[arg-type]


def footer_bytes(store: LocalArtifactStore, digest: str) -> int:
    """What opening the file reads (pyarrow reads its last 64 KiB for the footer)."""
    with store.open_blob(digest) as blob:
        pq.ParquetFile(blob)
        return blob.bytes_read


def chunk_sizes(path: Path, column: str) -> list[int]:
    """Each row group's column chunk of ``column``, compressed (dictionary page in), from
    the footer."""
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index(column)
    return [meta.row_group(g).column(col).total_compressed_size for g in range(meta.num_row_groups)]


def test_a_shard_reads_only_its_row_groups_projected_column_chunks(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet")
    store = LocalArtifactStore(tmp_path / "store")
    ref, slices, bad = scan_record_file("data/t.parquet", path, inputs(columns=["amount"]), store)
    assert bad == [] and [(s.first_record, s.record_count) for s in slices] == [
        (g * GROUP, GROUP) for g in range(ROWS // GROUP)
    ]
    assert all(s.columns == ["amount"] for s in slices)
    footer = footer_bytes(store, ref.digest)
    amount = chunk_sizes(path, "amount")
    whole = pq.read_table(path)
    for g, s in enumerate(slices):
        got = read_slice_counted(s, store)
        # The footer and this group's amount chunk, byte for byte: no other column, no
        # other row group (the group's id and tag chunks are ~5x the amount chunk).
        assert got.bytes_read == footer + amount[g], (g, got.bytes_read, footer, amount[g])
        want = whole.column("amount").to_pylist()[g * GROUP : (g + 1) * GROUP]
        assert got.records == [{"amount": v} for v in want]
        table = read_slice_table(s, store)
        assert table.bytes_read == footer + amount[g]
        assert table.table.column_names == ["amount"] and table.table.num_rows == GROUP
        assert table.table.column("amount").to_pylist() == want
    # Without columns a shard reads its whole group (every chunk): what projection saves.
    _, whole_slices, _ = scan_record_file("data/t.parquet", path, inputs(), store)
    meta = pq.ParquetFile(path).metadata
    group0 = sum(meta.row_group(0).column(c).total_compressed_size for c in range(3))
    assert read_slice_counted(whole_slices[0], store).bytes_read == footer + group0
    assert group0 > 4 * amount[0]


def test_compile_reads_the_footer_only_and_converts_no_row(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet")
    store = LocalArtifactStore(tmp_path / "store")
    progress = ScanProgress()
    ref, slices, bad = scan_record_file("data/t.parquet", path, inputs(), store, progress)
    # 40,000 rows of three columns, cut into 8 shards from the row counts in the footer:
    # no column chunk was read (int64 and UTF-8 strings always have a JSON form).
    assert len(slices) == 8 and bad == []
    assert progress.records == ROWS and progress.shards == 8
    assert progress.bytes == footer_bytes(store, ref.digest) < path.stat().st_size / 20


def test_compile_reads_only_the_columns_that_can_be_malformed(tmp_path: Path) -> None:
    path = write(tmp_path / "s.parquet", score=True)
    store = LocalArtifactStore(tmp_path / "store")
    progress = ScanProgress()
    ref, _, bad = scan_record_file(
        "data/s.parquet", path, inputs(on_malformed="skip"), store, progress
    )
    # The float column is read (a NaN has no JSON form), column-wise; nothing else.
    footer = footer_bytes(store, ref.digest)
    assert progress.bytes == footer + sum(chunk_sizes(path, "score"))
    assert [m.describe() for m in bad] == [
        "data/s.parquet row 7: column 'score': nan has no JSON form"
    ]
    # A shard under skip leaves that row out, on both paths.
    first = RecordSlice(
        format="parquet", file=ref, first_record=0, record_count=GROUP, on_malformed="skip"
    )
    got = read_slice_counted(first, store)
    assert len(got.records) == GROUP - 1 and got.malformed == bad
    table = read_slice_table(first, store)
    assert table.table.num_rows == GROUP - 1 and table.malformed == bad
    assert table.table.to_pylist() == got.records
    # Selecting columns without it: the float column is never read, no row is malformed.
    progress = ScanProgress()
    _, _, bad = scan_record_file(
        "data/s.parquet", path, inputs(columns=["amount"]), store, progress
    )
    assert bad == [] and progress.bytes == footer


def test_columns_must_name_columns_of_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "t.parquet")
    store = LocalArtifactStore(tmp_path / "store")
    with pytest.raises(InputsRefused, match=r"inputs.columns names 'amout', which is not a"):
        scan_record_file("data/t.parquet", path, inputs(columns=["amout"]), store)
    with pytest.raises(ValueError, match="needs 'format: parquet'"):
        InputsSpec(files=["a.csv"], format="csv", records_per_shard=1, columns=["a"])


def test_a_batch_operator_gets_the_table_and_answers_as_its_map(tmp_path: Path) -> None:
    handle = load_mrp_config(path=TEST_CONFIG).handle("amount-stats@1.0.0")
    assert handle.spec.batch == "arrow"
    path = write(tmp_path / "t.parquet")
    store = LocalArtifactStore(tmp_path / "store")
    _, slices, _ = scan_record_file("data/t.parquet", path, inputs(columns=["amount"]), store)
    value, read = _shard_items(ShardInput(records=slices[0]), store, handle.spec)
    # The shard's footer and amount chunks, undecoded: the host decodes them.
    assert isinstance(value, ParquetShard) and read == sum(len(d) for _, d in value.ranges)
    rows, _ = _shard_items(ShardInput(records=slices[0]), store, handle.spec.model_copy(
        update={"batch": None}))  # fmt: skip
    assert isinstance(rows, list) and len(rows) == GROUP

    def arrow(table: pa.Table) -> ArrowShard:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        return ArrowShard(sink.getvalue().to_pybytes())

    # Integers (summed by pyarrow), integers whose sum leaves int64 and floats (both
    # value by value): each as a table and as records, in one host batch.
    big = [(1 << 62) + 1, 1 << 62, (1 << 62) - 5, 9]
    cases: list[list[JsonValue]] = [[3, -7, 12], list(big), [0.1, 2.5, -3.25]]
    shards: list[tuple[object, OperatorContext]] = [
        (value, OperatorContext(params={"field": "amount"}, seed=1, shard_id="shard-000000"))
    ]
    for values in cases:
        table = pa.table({"amount": values})
        for v in (arrow(table), [{"amount": x} for x in values]):
            shards.append((v, OperatorContext(params={"field": "amount"}, seed=1)))
    try:
        out = run_map_batch_in_host(handle, shards)
    finally:
        stop_hosts()
    results = [o[0] if isinstance(o, tuple) else o for o in out]
    col = pq.read_table(path).column("amount").to_pylist()[:GROUP]
    assert results[0] == {
        "count": GROUP,
        "sum": str(sum(col)),
        "min": str(min(col)),
        "max": str(max(col)),
    }
    for k in range(len(cases)):
        assert results[1 + 2 * k] == results[2 + 2 * k], (cases[k], results)
    assert results[3]["sum"] == str(sum(big))  # type: ignore[index]


class CountingStore(LocalArtifactStore):
    """The local store, counting the files it is given to store (each is read whole)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.files_put = 0

    def put_file(self, path: Path) -> str:
        self.files_put += 1
        return super().put_file(path)


def test_an_unchanged_file_is_not_hashed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from activities.mrp import records

    # The file was just written: with the default 2 s its digest would not be kept yet.
    monkeypatch.setattr(records, "_SETTLE_NS", 0)
    monkeypatch.setattr(records, "_DIGESTS", {})
    path = write(tmp_path / "t.parquet")
    store = CountingStore(tmp_path / "store")
    first, slices, _ = scan_record_file("data/t.parquet", path, inputs(), store)
    again, slices2, _ = scan_record_file("data/t.parquet", path, inputs(), store)
    assert store.files_put == 1 and again == first and slices2 == slices
    # Any write moves the change time: the file is read and stored again.
    pq.write_table(pq.read_table(path).slice(0, GROUP), path)
    changed, slices3, _ = scan_record_file("data/t.parquet", path, inputs(), store)
    assert store.files_put == 2 and changed.digest != first.digest and len(slices3) == 1
    # A store that lost the blob gets it again.
    other = CountingStore(tmp_path / "other")
    assert scan_record_file("data/t.parquet", path, inputs(), other)[0] == changed
    assert other.files_put == 1


def test_a_call_of_large_arrow_shards_goes_to_its_host_in_bounded_trips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from activities.mrp import backends
    from keel.settings import Settings

    settings = Settings(artifacts_dir=tmp_path / "store", mrp_config=TEST_CONFIG)
    store = backends.store_for(settings)
    path = write(tmp_path / "t.parquet")
    _, slices, _ = scan_record_file("data/t.parquet", path, inputs(columns=["amount"]), store)
    handle = load_mrp_config(path=TEST_CONFIG).handle("amount-stats@1.0.0")
    context = backends.ShardContext(
        run_id="r", workflow_id="w", operator=handle, params={"field": "amount"}
    )
    items = [
        backends.ShardItem(
            i, f"shard-{i:06d}", store.put_bytes(ShardInput(records=s).canonical_bytes()), i, 1
        )
        for i, s in enumerate(slices[:5])
    ]
    trips: list[int] = []
    run = backends.run_map_batch_in_host

    def counted(handle: object, shards: list[object], **kw: object) -> object:
        trips.append(len(shards))
        return run(handle, shards, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(backends, "run_map_batch_in_host", counted)
    # What one shard sends its host (the footer read and its amount chunk, ~100 KB): a
    # bound of 2.5 of them makes trips of 3 (the third passes it) and 2.
    first, _ = backends._shard_items(ShardInput(records=slices[0]), store, handle.spec)
    assert isinstance(first, ParquetShard)
    one = sum(len(d) for _, d in first.ranges)
    monkeypatch.setattr(backends, "ARROW_CALL_BYTES", int(2.5 * one))
    try:
        attempts = backends.execute_items(context, items, settings)
    finally:
        stop_hosts()
    assert trips == [3, 2]
    assert [a.ok for a in attempts] == [True] * 5
    assert all(a.input_bytes > 0 for a in attempts)


@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_batch_shard_decoded_in_its_host_keeps_the_malformed_policy(
    tmp_path: Path, policy: str
) -> None:
    from activities.mrp import backends
    from keel.settings import Settings

    settings = Settings(artifacts_dir=tmp_path / "store", mrp_config=TEST_CONFIG)
    store = backends.store_for(settings)
    path = write(tmp_path / "s.parquet", score=True)  # a NaN score at row 7
    _, slices, bad = scan_record_file(
        "data/s.parquet", path, inputs(columns=["score"], on_malformed=policy), store
    )
    assert len(bad) == 1
    handle = load_mrp_config(path=TEST_CONFIG).handle("amount-stats@1.0.0")
    context = backends.ShardContext(
        run_id="r", workflow_id="w", operator=handle, params={"field": "score"}
    )
    digest = store.put_bytes(ShardInput(records=slices[0]).canonical_bytes())
    try:
        (attempt,) = backends.execute_items(
            context, [backends.ShardItem(0, "shard-000000", digest, 1, 1)], settings
        )
    finally:
        stop_hosts()
    if policy == "fail":
        assert not attempt.ok and not attempt.retryable
        assert "malformed record at data/s.parquet row 7: column 'score': nan" in (
            attempt.error or ""
        )
    else:
        assert attempt.ok and attempt.output_bytes is not None
        assert b'"count":4999' in attempt.output_bytes
