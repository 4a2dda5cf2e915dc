"""A Parquet shard on the S3 artifact store (the SeaweedFS server) reads its row groups
with ranged GETs: the bytes its reader fetched are its row groups and the footer, not
the file; the rows are those of the whole file. ``put_file`` uploads a file under the
digest ``put_bytes`` gives its bytes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from activities.mrp.records import read_slice, scan_record_file
from keel.digest import digest_bytes
from store.artifacts import ArtifactNotFound, BlobReader, S3ArtifactStore
from tests.mrp.unit.test_record_reads import GROUP, ROWS, parquet_inputs, write_parquet
from tests.support.seaweed import SeaweedS3, seaweed_s3

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


class OpenedS3Store(S3ArtifactStore):
    """The S3 store, keeping each reader ``open_blob`` hands out."""

    opened: list[BlobReader]

    def open_blob(self, digest: str) -> BlobReader:
        reader = super().open_blob(digest)
        self.opened.append(reader)
        return reader


def make_store(server: SeaweedS3) -> OpenedS3Store:
    store = OpenedS3Store(
        f"keel-test-{uuid.uuid4().hex[:16]}",
        endpoint_url=server.endpoint_url,
        region=server.region,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
    )
    store.opened = []
    return store


def test_a_parquet_shard_on_s3_fetches_its_row_groups_by_range(
    s3_server: SeaweedS3, tmp_path: Path
) -> None:
    path = write_parquet(tmp_path / "big.parquet")
    size = path.stat().st_size
    store = make_store(s3_server)
    ref, slices, bad = scan_record_file("data/big.parquet", path, parquet_inputs(), store)
    assert bad == [] and len(slices) == ROWS // (4 * GROUP)
    assert ref.digest == digest_bytes(path.read_bytes())
    assert store.get_bytes(ref.digest) == path.read_bytes()
    expected = pq.read_table(path).to_pylist()
    for s in slices[:3] + slices[-1:]:
        rows, malformed = read_slice(s, store)
        assert malformed == []
        assert rows == expected[s.first_record : s.first_record + s.record_count]
    fetched = [r.bytes_read for r in store.opened]
    requests = [getattr(r, "requests", None) for r in store.opened]
    assert max(fetched) < size / 5, (fetched, size)
    print(json.dumps({"file_bytes": size, "range_bytes": fetched, "range_gets": requests}))


def test_put_file_and_open_blob_on_s3(s3_server: SeaweedS3, tmp_path: Path) -> None:
    store = make_store(s3_server)
    data = bytes(range(256)) * 4000
    src = tmp_path / "f.bin"
    src.write_bytes(data)
    digest = store.put_file(src)
    assert digest == digest_bytes(data) and store.put_file(src) == digest
    assert store.get_bytes(digest) == data
    with store.open_blob(digest) as blob:
        assert blob.seek(-10, 2) == len(data) - 10
        assert blob.read(100) == data[-10:]
        blob.seek(1000)
        assert blob.read(5) == data[1000:1005]
        assert blob.bytes_read == 15
    with pytest.raises(ArtifactNotFound):
        store.open_blob(digest_bytes(b"never stored"))


def test_a_projected_parquet_shard_on_s3_fetches_its_column_chunks(
    s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """With ``inputs.columns`` a shard's ranged GETs fetch the footer (pyarrow's last 64
    KiB) and, of its row groups, the selected column's chunks: exactly those bytes."""
    from activities.mrp.records import read_slice_counted

    path = write_parquet(tmp_path / "big.parquet")
    size = path.stat().st_size
    store = make_store(s3_server)
    inputs = parquet_inputs().model_copy(update={"columns": ["amount"]})
    _, slices, _ = scan_record_file("data/big.parquet", path, inputs, store)
    meta = pq.ParquetFile(path).metadata
    col = meta.schema.names.index("amount")
    chunks = [meta.row_group(g).column(col).total_compressed_size for g in range(ROWS // GROUP)]
    footer = min(size, 64 * 1024)
    expected = pq.read_table(path, columns=["amount"]).to_pylist()
    for s in slices[:2] + slices[-1:]:
        got = read_slice_counted(s, store)
        groups = range(s.first_record // GROUP, (s.first_record + s.record_count) // GROUP)
        assert got.bytes_read == footer + sum(chunks[g] for g in groups)
        assert got.records == expected[s.first_record : s.first_record + s.record_count]
