"""Record files: scanning them into shard slices (compile) and reading a slice (map).

:func:`scan_record_file` reads one JSONL, CSV or Parquet file once, streaming for the text
formats: it hashes the file, finds every record and checks that it parses, cuts the records
into :class:`~keel.mrp.records.RecordSlice` values (``records_per_shard`` records, or at
most ``bytes_per_shard`` bytes, at record boundaries) and stores each text slice's bytes
in the artifact store (a Parquet file is stored whole, streamed from disk, and read one
row group at a time). A :class:`ScanProgress` shared by a job's files counts what the
scan has done (the compile activity's heartbeats carry it) and refuses the job as soon
as its shards pass the cap (MRP-P005), not after the whole scan. :func:`read_slice` is
what a shard does with its slice: the records as dicts, and the ones it could not read;
a Parquet slice reads the file's footer and its own row groups through the store's
seekable reader (``ArtifactStore.open_blob``), never the whole file.
"""

from __future__ import annotations

import datetime as dt
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import blake3
from pydantic import JsonValue

from keel.digest import DIGEST_PREFIX
from keel.mrp.dsl import InputsSpec
from keel.mrp.errors import InputsRefused
from keel.mrp.records import (
    CsvHeaderError,
    CsvRows,
    FileRef,
    MalformedRecord,
    Record,
    RecordSlice,
    ShardCutter,
    iter_jsonl,
    malformed_of,
)

if TYPE_CHECKING:
    from store.artifacts import ArtifactStore

__all__ = ["ScanProgress", "read_slice", "scan_record_file"]

_READ_CHUNK = 1 << 20


class _HashingLines:
    """A binary file's lines, hashed and counted as they go by: the scan reads the file
    once, and a scan refused part way has read only that far."""

    def __init__(self, f: BinaryIO, progress: ScanProgress) -> None:
        self._f = f
        self._progress = progress
        self._hasher = blake3.blake3()
        self.size = 0

    def __iter__(self) -> _HashingLines:
        return self

    def __next__(self) -> bytes:
        line = next(self._f)
        self._take(line)
        return line

    def _take(self, data: bytes) -> None:
        self._hasher.update(data)
        self.size += len(data)
        self._progress.bytes += len(data)

    def ref(self, path: str) -> FileRef:
        """The file's ref, once its last bytes are read (what lines left, if any)."""
        while block := self._f.read(_READ_CHUNK):
            self._take(block)
        return FileRef(
            path=path, digest=DIGEST_PREFIX + self._hasher.hexdigest(), size_bytes=self.size
        )


def _unhashed(path: str, local: Path) -> FileRef:
    """The file a slice names until the scan has hashed the whole file."""
    return FileRef(path=path, digest=DIGEST_PREFIX + "0" * 64, size_bytes=local.stat().st_size)


def _end_line(last: Record, tail: bytes) -> int:
    """The line a record ends on (a quoted CSV field may span lines)."""
    newlines = tail.count(b"\n")
    return last.line + newlines - (1 if tail.endswith(b"\n") else 0)


def _cutter(inputs: InputsSpec) -> ShardCutter:
    return ShardCutter(inputs.records_per_shard, inputs.bytes_per_shard)


@dataclass
class ScanProgress:
    """What a job's scan has done so far, over all its files: files, records and shards
    (slices). With ``max_shards`` set, the slice that would pass it refuses the job there
    (MRP-P005), so a job with too many shards costs a scan up to the cap, not the whole
    input. Only the scanning thread writes it; a heartbeat may read it from another."""

    max_shards: int | None = None
    files: int = 0
    records: int = 0
    shards: int = 0
    bytes: int = 0  # of the text files' bytes, how many the scan has read

    def start_shard(self, path: str, record: int, inputs: InputsSpec) -> None:
        """Count a new slice starting at ``record`` (0-based) of ``path``."""
        self.shards += 1
        if self.max_shards is not None and self.shards > self.max_shards:
            key = "records_per_shard" if inputs.records_per_shard is not None else "bytes_per_shard"
            raise InputsRefused(
                f"MRP-P005 too many shards: the inputs make more than {self.max_shards} "
                f"shards (inputs.{key} {getattr(inputs, key)}); the cap is {self.max_shards}; "
                f"the scan stopped at {path} record {record + 1}"
            )

    def heartbeat(self) -> dict[str, int]:
        """What a compile heartbeat carries."""
        return {
            "files": self.files,
            "records": self.records,
            "shards": self.shards,
            "bytes": self.bytes,
        }


def _records_of(
    path: str, fmt: str, lines: _HashingLines
) -> tuple[list[str] | None, Iterable[Record]]:
    """A text file's columns (a CSV's header; ``None`` for JSONL) and its records;
    ``InputsRefused`` for a CSV header that cannot name columns."""
    columns: list[str] | None = None
    records: Iterable[Record]
    if fmt == "csv":
        try:
            rows = CsvRows(lines)
        except CsvHeaderError as e:
            raise InputsRefused(f"{path}: {e}") from None
        columns = rows.columns
        records = rows
    else:
        records = iter_jsonl(lines)
    return columns, records


def _record_slice(
    chunk_reader: BinaryIO,
    first: Record,
    last: Record,
    count: int,
    file: FileRef,
    inputs: InputsSpec,
    columns: list[str] | None,
    store: ArtifactStore,
) -> RecordSlice:
    """The slice of records ``first`` to ``last`` (``count`` of them), its bytes stored."""
    fmt = inputs.format
    assert fmt is not None
    chunk_reader.seek(first.start)
    chunk = chunk_reader.read(last.end - first.start)
    return RecordSlice(
        format=fmt,
        file=file,
        first_record=first.index,
        record_count=count,
        on_malformed=inputs.malformed_policy,
        start_line=first.line,
        end_line=_end_line(last, chunk[last.start - first.start :]),
        byte_start=first.start,
        byte_end=last.end,
        chunk_digest=store.put_bytes(chunk),
        columns=columns,
    )


def scan_record_file(
    path: str,
    local: Path,
    inputs: InputsSpec,
    store: ArtifactStore,
    progress: ScanProgress | None = None,
) -> tuple[FileRef, list[RecordSlice], list[MalformedRecord]]:
    """Scan one record file (``path`` is its name in the job: relative or ``s3://``;
    ``local`` where its bytes are). Returns its ref, its slices (none for a file without
    records) and its malformed records. ``InputsRefused`` for a CSV header that cannot
    name columns, for an unreadable Parquet file when ``on_malformed`` is ``fail``, and
    for a slice past ``progress.max_shards``."""
    progress = progress if progress is not None else ScanProgress()
    progress.files += 1
    if inputs.format == "parquet":
        return _scan_parquet(path, local, inputs, store, progress)
    fmt = inputs.format
    assert fmt is not None
    cutter = _cutter(inputs)
    slices: list[RecordSlice] = []
    malformed: list[MalformedRecord] = []
    unhashed = _unhashed(path, local)
    with local.open("rb") as f, local.open("rb") as chunk_reader:
        lines = _HashingLines(f, progress)
        columns, records = _records_of(path, fmt, lines)
        first: Record | None = None
        last: Record | None = None
        count = 0

        def flush() -> None:
            assert first is not None and last is not None
            slices.append(
                _record_slice(chunk_reader, first, last, count, unhashed, inputs, columns, store)
            )

        for rec in records:
            if first is not None and cutter.full(count, rec.end - first.start):
                flush()
                first, count = None, 0
            if first is None:
                progress.start_shard(path, rec.index, inputs)
                first = rec
            last = rec
            count += 1
            progress.records += 1
            if rec.error is not None:
                malformed.append(malformed_of(rec, path, fmt))
        if first is not None:
            flush()
        ref = lines.ref(path)
    return ref, [s.model_copy(update={"file": ref}) for s in slices], malformed


# -- Parquet -------------------------------------------------------------------------------


def _json_value(value: Any) -> JsonValue:
    """A Parquet cell as JSON: decimals as text, dates and times in ISO 8601, binary as
    UTF-8 text; ``ValueError`` for what has no JSON form (NaN, undecodable binary)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} has no JSON form")
        return value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("a binary value that is not UTF-8 text") from None
    if isinstance(value, dict):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    raise ValueError(f"a {type(value).__name__} value has no JSON form")


def _row_record(row: dict[str, Any]) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    for key, value in row.items():
        try:
            out[key] = _json_value(value)
        except ValueError as e:
            raise ValueError(f"column {key!r}: {e}") from None
    return out


def _open_parquet(source: Any) -> Any:
    """A ``ParquetFile`` over a path or a seekable file: it reads the footer now and a
    row group when asked, never the whole file."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source)


def _open_blob(store: ArtifactStore, digest: str) -> Any:
    """The store's seekable reader of an artifact; a store with only the byte interface
    (``get_bytes``) gives its bytes in memory."""
    opener = getattr(store, "open_blob", None)
    if opener is None:
        return io.BytesIO(store.get_bytes(digest))
    return opener(digest)


def _put_file(store: ArtifactStore, local: Path) -> str:
    putter = getattr(store, "put_file", None)
    if putter is None:
        return store.put_bytes(local.read_bytes())
    digest: str = putter(local)
    return digest


def _group_rows(pf: Any, group: int) -> Iterator[tuple[dict[str, JsonValue] | None, str | None]]:
    """Each row of a row group as ``(record, None)`` or ``(None, reason)``."""
    try:
        rows = pf.read_row_group(group).to_pylist()
    except Exception as e:  # pyarrow raises many types for corrupt pages
        reason = f"unreadable row group {group}: {type(e).__name__}: {e}"
        for _ in range(pf.metadata.row_group(group).num_rows):
            yield None, reason
        return
    for row in rows:
        try:
            yield _row_record(row), None
        except ValueError as e:
            yield None, str(e)


def _scan_parquet(
    path: str, local: Path, inputs: InputsSpec, store: ArtifactStore, progress: ScanProgress
) -> tuple[FileRef, list[RecordSlice], list[MalformedRecord]]:
    ref = FileRef(path=path, digest=_put_file(store, local), size_bytes=local.stat().st_size)
    try:
        pf = _open_parquet(local)
        meta = pf.metadata
    except Exception as e:
        reason = f"unreadable Parquet file: {type(e).__name__}: {e}"
        if inputs.malformed_policy == "fail":
            raise InputsRefused(f"{path}: {reason}") from None
        return ref, [], [MalformedRecord(path=path, reason=reason)]
    with pf:
        return ref, *_cut_parquet(path, pf, meta, ref, inputs, progress)


def _cut_parquet(
    path: str, pf: Any, meta: Any, ref: FileRef, inputs: InputsSpec, progress: ScanProgress
) -> tuple[list[RecordSlice], list[MalformedRecord]]:
    malformed: list[MalformedRecord] = []
    cutter = _cutter(inputs)
    slices: list[RecordSlice] = []
    first, count, size = 0, 0, 0.0
    row = 0  # 0-based index of the next row
    # One row group in memory at a time; each row's size is estimated from its group's.
    for group in range(meta.num_row_groups):
        info = meta.row_group(group)
        per_row = info.total_byte_size / info.num_rows if info.num_rows else 0.0
        for _, problem in _group_rows(pf, group):
            if count and cutter.full(count, math.ceil(size + per_row)):
                slices.append(_parquet_slice(ref, first, count, inputs))
                count, size = 0, 0.0
            if count == 0:
                progress.start_shard(path, row, inputs)
                first = row
            count += 1
            size += per_row
            row += 1
            progress.records += 1
            if problem is not None:
                malformed.append(MalformedRecord(path=path, row=row, reason=problem))
    if count:
        slices.append(_parquet_slice(ref, first, count, inputs))
    return slices, malformed


def _parquet_slice(ref: FileRef, first: int, count: int, inputs: InputsSpec) -> RecordSlice:
    return RecordSlice(
        format="parquet",
        file=ref,
        first_record=first,
        record_count=count,
        on_malformed=inputs.malformed_policy,
    )


# -- A shard's records ---------------------------------------------------------------------


def _read_parquet_slice(
    s: RecordSlice, pf: Any, good: list[dict[str, JsonValue]], bad: list[MalformedRecord]
) -> int:
    """Read the rows of ``s`` from the row groups that hold them (the others are never
    read); returns how many rows it saw."""
    end = s.first_record + s.record_count
    base = 0
    seen = 0
    for group in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(group).num_rows
        if base + n > s.first_record and base < end:
            for j, (row, reason) in enumerate(_group_rows(pf, group)):
                index = base + j
                if s.first_record <= index < end:
                    seen += 1
                    if row is not None:
                        good.append(row)
                    else:
                        bad.append(
                            MalformedRecord(
                                path=s.file.path, row=index + 1, reason=reason or "malformed"
                            )
                        )
        elif base >= end:
            break
        base += n
    return seen


def read_slice(
    s: RecordSlice, store: ArtifactStore
) -> tuple[list[dict[str, JsonValue]], list[MalformedRecord]]:
    """The records of a slice, in file order, and those that could not be read.

    ``RuntimeError`` when the stored bytes do not hold the records the slice names (the
    store verifies digests, so only a scanner change could cause it)."""
    good: list[dict[str, JsonValue]] = []
    bad: list[MalformedRecord] = []
    if s.format == "parquet":
        with _open_blob(store, s.file.digest) as blob, _open_parquet(blob) as pf:
            count = _read_parquet_slice(s, pf, good, bad)
    else:
        assert s.chunk_digest is not None and s.start_line is not None
        lines = io.BytesIO(store.get_bytes(s.chunk_digest))
        records: Iterable[Record]
        if s.format == "csv":
            records = CsvRows(
                lines,
                columns=s.columns,
                first_line=s.start_line,
                offset=s.byte_start or 0,
                first_index=s.first_record,
            )
        else:
            records = iter_jsonl(
                lines, first_line=s.start_line, offset=s.byte_start or 0, first_index=s.first_record
            )
        count = 0
        for rec in records:
            count += 1
            if rec.value is not None:
                good.append(rec.value)
            else:
                bad.append(malformed_of(rec, s.file.path, s.format))
    if count != s.record_count:
        raise RuntimeError(
            f"{s.file.path}: the slice holds {count} records, its plan says {s.record_count}"
        )
    return good, bad
