"""A Parquet shard reads its own row groups (and the footer) through the artifact store's
seekable reader, not the whole file; the rows are those a whole-file read gives.

The local store is real (a folder); ``OpenedStore`` only keeps the readers it hands out so
the test can see how many bytes each read. The S3 twin is
tests/mrp/integration/test_record_reads_s3.py.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from activities.mrp.records import read_slice, scan_record_file
from keel.digest import digest_bytes
from keel.mrp.dsl import InputsSpec
from keel.mrp.records import RecordSlice
from store.artifacts import BlobReader, LocalArtifactStore

ROWS = 64_000
GROUP = 1_000  # 64 row groups


class OpenedStore(LocalArtifactStore):
    """The local store, keeping each reader ``open_blob`` hands out."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.opened: list[BlobReader] = []

    def open_blob(self, digest: str) -> BlobReader:
        reader = super().open_blob(digest)
        self.opened.append(reader)
        return reader


class BytesOnlyStore:
    """A store with only the byte interface: ``read_slice`` falls back to the whole file
    in memory (how every Parquet shard read before ``open_blob``)."""

    def __init__(self, store: LocalArtifactStore) -> None:
        self.store = store
        self.fetched = 0

    def put_bytes(self, data: bytes) -> str:
        return self.store.put_bytes(data)

    def get_bytes(self, digest: str) -> bytes:
        data = self.store.get_bytes(digest)
        self.fetched += len(data)
        return data


def write_parquet(path: Path, rows: int = ROWS, group: int = GROUP) -> Path:
    table = pa.table(
        {
            "id": list(range(rows)),
            "text": [f"record {i} " + "x" * (i % 50) for i in range(rows)],
            "amount": [i * 0.25 for i in range(rows)],
        }
    )
    pq.write_table(table, path, row_group_size=group)
    return path


def parquet_inputs(records_per_shard: int = 4 * GROUP) -> InputsSpec:
    return InputsSpec(files=["data/*"], format="parquet", records_per_shard=records_per_shard)


def test_a_parquet_shard_reads_its_row_groups_and_the_footer_only(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "big.parquet")
    size = path.stat().st_size
    store = OpenedStore(tmp_path / "store")
    ref, slices, bad = scan_record_file("data/big.parquet", path, parquet_inputs(), store)
    assert bad == [] and len(slices) == ROWS // (4 * GROUP)
    # The file is stored whole, under the digest of its bytes.
    assert ref.digest == digest_bytes(path.read_bytes()) and ref.size_bytes == size
    assert store.get_bytes(ref.digest) == path.read_bytes()

    before = BytesOnlyStore(store)
    expected = pq.read_table(path).to_pylist()
    for s in slices:
        rows, malformed = read_slice(s, store)
        assert malformed == []
        assert rows == expected[s.first_record : s.first_record + s.record_count]
        assert read_slice(s, before) == (rows, [])  # type: ignore[arg-type]
    read = [r.bytes_read for r in store.opened]
    assert len(read) == len(slices) and all(r.closed for r in store.opened)
    # Before: every shard fetched the whole file. Now: its 4 of 64 row groups and the
    # footer (metadata of all 64 groups), well under a fifth of the file.
    assert before.fetched == size * len(slices)
    assert max(read) < size / 5, (read, size)
    print(json.dumps({"file_bytes": size, "shard_bytes_before": size, "shard_bytes_after": read}))


def test_a_slice_inside_one_row_group_reads_that_group(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "p.parquet")
    store = OpenedStore(tmp_path / "store")
    ref, _, _ = scan_record_file("data/p.parquet", path, parquet_inputs(), store)
    size = path.stat().st_size
    s = RecordSlice(
        format="parquet", file=ref, first_record=10_500, record_count=3, on_malformed="fail"
    )
    rows, _ = read_slice(s, store)
    assert [r["id"] for r in rows] == [10_500, 10_501, 10_502]
    # One of 64 row groups, and the footer (pyarrow reads the last 64 KiB to find it).
    assert store.opened[-1].bytes_read < size / 10


def test_blob_readers_seek_and_read_like_files(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    data = bytes(range(256)) * 40
    digest = store.put_bytes(data)
    with store.open_blob(digest) as blob, io.BytesIO(data) as want:
        for offset, whence, n in [(0, 0, 10), (-7, 2, 100), (5, 1, 3), (100, 0, -1)]:
            assert blob.seek(offset, whence) == want.seek(offset, whence)
            assert blob.read(n) == want.read(n)
            assert blob.tell() == want.tell()
        assert blob.read(5) == b""
    src = tmp_path / "f.bin"
    src.write_bytes(data[::-1])
    assert store.put_file(src) == digest_bytes(data[::-1])
    assert store.get_bytes(digest_bytes(data[::-1])) == data[::-1]
