"""Record files: scanning them into shard slices (compile) and reading a slice (map).

:func:`scan_record_file` reads one JSONL or CSV file once, streaming: it hashes the file,
finds every record and checks that it parses, cuts the records into
:class:`~keel.mrp.records.RecordSlice` values (``records_per_shard`` records, or at most
``bytes_per_shard`` bytes, at record boundaries) and stores each slice's bytes in the
artifact store. A Parquet file is stored whole (streamed from disk; not hashed again
while its stat is unchanged) and cut from its footer alone: no row is converted, and only
the selected columns whose type can hold a value without a JSON form are read, column-wise,
to find malformed rows. A :class:`ScanProgress` shared by a job's files counts what the
scan has done (the compile activity's heartbeats carry it) and refuses the job as soon as
its shards pass the cap (MRP-P005), not after the whole scan.

:func:`read_slice` is what a shard does with its slice: the records as dicts, and the ones
it could not read (:func:`read_slice_counted` adds the bytes it read); a Parquet slice
reads the file's footer and, of its own row groups, the column chunks of its columns
(``inputs.columns``) through the store's seekable reader (``ArtifactStore.open_blob``),
never the whole file. :func:`read_slice_table` gives a Parquet slice as one Arrow table,
for operators that take their shard whole (``batch: arrow``).
"""

from __future__ import annotations

import datetime as dt
import io
import math
import threading
import time
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

__all__ = [
    "ScanProgress",
    "SliceRead",
    "SliceTable",
    "read_slice",
    "read_slice_counted",
    "read_slice_table",
    "scan_record_file",
    "slice_chunks",
    "table_of_chunks",
]

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


#: Digests of local Parquet files this process stored, by what ``stat`` says of the file
#: (see :func:`_put_file`); at most ``_DIGESTS_MAX``, the oldest dropped first.
_DIGESTS: dict[tuple[str, int, int, int, int, int], str] = {}
_DIGESTS_MAX = 1024
#: A file changed less than this long before its hashing began is not remembered: a
#: later change within the file system's timestamp granularity could leave its times as
#: they were (git's "racily clean" entries).
_SETTLE_NS = 2_000_000_000
_digests_lock = threading.Lock()


def _stat_key(local: Path) -> tuple[str, int, int, int, int, int]:
    st = local.stat()
    return (
        str(local.resolve()),
        st.st_dev,
        st.st_ino,
        st.st_size,
        st.st_mtime_ns,
        st.st_ctime_ns,
    )


def _put_file(store: ArtifactStore, local: Path) -> str:
    """Store a local file whole; its digest. A file this process stored before, whose
    device, inode, size, modification and change times are still what they were (the
    change time moves on every write and cannot be set back), and which the store still
    holds, is not read again: a warm job over the same Parquet file does not hash its
    bytes again. (The floor of ``bench/mrp_parquet.py`` reads no byte it does not use;
    hashing a 2 GB file is ~2 s.)"""
    putter = getattr(store, "put_file", None)
    if putter is None:
        return store.put_bytes(local.read_bytes())
    key = _stat_key(local)
    with _digests_lock:
        known = _DIGESTS.get(key)
    exists = getattr(store, "exists", None)
    if known is not None and exists is not None and exists(known):
        return known
    began = time.time_ns()
    digest: str = putter(local)
    settled = began - _SETTLE_NS
    if _stat_key(local) == key and key[4] < settled and key[5] < settled:
        with _digests_lock:
            _DIGESTS.pop(key, None)
            _DIGESTS[key] = digest
            while len(_DIGESTS) > _DIGESTS_MAX:
                del _DIGESTS[next(iter(_DIGESTS))]
    return digest


class _CountingFile(io.RawIOBase):
    """A local file for pyarrow, counting the bytes pyarrow reads from it (the compile's
    footer reads, and the column chunks it checks)."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._f = path.open("rb", buffering=0)
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._f.seek(offset, whence)

    def tell(self) -> int:
        return self._f.tell()

    def readinto(self, b: Any) -> int:
        n = self._f.readinto(b)
        self.bytes_read += n or 0
        return n or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def _safe_type(t: Any) -> bool:
    """Whether every value of Arrow type ``t`` has a JSON form (:func:`_json_value`), so a
    column of it can hold no malformed record: no row of it need be read at compile."""
    import pyarrow.types as pt

    if (
        pt.is_null(t)
        or pt.is_boolean(t)
        or pt.is_integer(t)
        or pt.is_string(t)
        or pt.is_large_string(t)
        or pt.is_decimal(t)
        or pt.is_date(t)
        or pt.is_timestamp(t)
        or pt.is_time(t)
    ):
        return True
    if pt.is_dictionary(t):
        return _safe_type(t.value_type)
    if pt.is_list(t) or pt.is_large_list(t) or pt.is_fixed_size_list(t):
        return _safe_type(t.value_type)
    if pt.is_struct(t):
        return all(_safe_type(t.field(i).type) for i in range(t.num_fields))
    return False


def _column_problems(name: str, col: Any) -> dict[int, str]:
    """The rows (0-based in ``col``) whose value in column ``name`` has no JSON form, and
    why, checked column-wise: floats with ``pyarrow.compute`` (NaN and infinities), binary
    by one UTF-8 cast; other types (rare: durations, nested floats) value by value."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    t = col.type
    if pt.is_floating(t):
        finite = pc.fill_null(pc.is_finite(col), True)
        bad = pc.indices_nonzero(pc.invert(finite)).to_pylist()
        return {i: f"column {name!r}: {col[i].as_py()!r} has no JSON form" for i in bad}
    if pt.is_binary(t) or pt.is_large_binary(t) or pt.is_fixed_size_binary(t):
        try:
            col.cast(pa.large_string())
            return {}
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass  # find the rows, one by one
    out: dict[int, str] = {}
    for i, value in enumerate(col.to_pylist()):
        try:
            _json_value(value)
        except ValueError as e:
            out[i] = f"column {name!r}: {e}"
    return out


def _table_problems(table: Any) -> dict[int, str]:
    """The rows of ``table`` (0-based) that are malformed records, each with its first
    bad column's reason (columns in table order), checking only the columns whose type can
    hold a value without a JSON form."""
    out: dict[int, str] = {}
    for name, col in zip(table.column_names, table.columns, strict=True):
        if not _safe_type(col.type):
            for i, reason in _column_problems(name, col).items():
                out.setdefault(i, reason)
    return out


def _projection(pf: Any, columns: list[str] | None, path: str) -> list[str]:
    """The columns a record holds: ``columns`` (each must be a column of the file:
    ``InputsRefused`` otherwise) or every top-level column of the file."""
    names = list(pf.schema_arrow.names)
    if columns is None:
        return names
    missing = [c for c in columns if c not in names]
    if missing:
        raise InputsRefused(
            f"{path}: inputs.columns names {missing[0]!r}, which is not a column of the "
            f"file (its columns: {', '.join(names)})"
        )
    return list(columns)


def _scan_parquet(
    path: str, local: Path, inputs: InputsSpec, store: ArtifactStore, progress: ScanProgress
) -> tuple[FileRef, list[RecordSlice], list[MalformedRecord]]:
    ref = FileRef(path=path, digest=_put_file(store, local), size_bytes=local.stat().st_size)
    reader = _CountingFile(local)
    try:
        try:
            pf = _open_parquet(reader)
            meta = pf.metadata
            pf.schema_arrow  # noqa: B018 - a footer whose schema pyarrow cannot read
        except Exception as e:
            reason = f"unreadable Parquet file: {type(e).__name__}: {e}"
            if inputs.malformed_policy == "fail":
                raise InputsRefused(f"{path}: {reason}") from None
            return ref, [], [MalformedRecord(path=path, reason=reason)]
        with pf:
            columns = _projection(pf, inputs.columns, path)
            return ref, *_cut_parquet(path, pf, meta, ref, inputs, progress, columns, reader)
    finally:
        progress.bytes += reader.bytes_read
        reader.close()


def _checked_columns(pf: Any, columns: list[str]) -> list[str]:
    """Of a record's columns, those whose values compile must look at (see
    :func:`_safe_type`); the others are never read at compile."""
    schema = pf.schema_arrow
    return [c for c in columns if not _safe_type(schema.field(c).type)]


def _group_problems(
    pf: Any, group: int, checked: list[str], all_columns: list[str]
) -> Iterator[tuple[int, str]]:
    """The malformed rows (0-based in the group) of one row group, in row order: the
    ``checked`` columns read (only those column chunks), or every row of a group that
    cannot be read."""
    if not checked:
        return
    try:
        table = pf.read_row_group(group, columns=checked)
    except Exception as e:  # pyarrow raises many types for corrupt pages
        reason = f"unreadable row group {group}: {type(e).__name__}: {e}"
        for i in range(pf.metadata.row_group(group).num_rows):
            yield i, reason
        return
    # The first bad column in the record's column order names the row's problem.
    order = {c: k for k, c in enumerate(all_columns)}
    table = table.select(sorted(checked, key=order.__getitem__))
    yield from sorted(_table_problems(table).items())


def _group_sizes(meta: Any, group: int, columns: list[str]) -> int:
    """The uncompressed bytes of ``columns`` in one row group (every column chunk whose
    top-level field is one of them), from the footer."""
    info = meta.row_group(group)
    wanted = set(columns)
    total = 0
    for c in range(info.num_columns):
        chunk = info.column(c)
        if chunk.path_in_schema.split(".", 1)[0] in wanted:
            total += chunk.total_uncompressed_size
    return total


def _cut_parquet(
    path: str,
    pf: Any,
    meta: Any,
    ref: FileRef,
    inputs: InputsSpec,
    progress: ScanProgress,
    columns: list[str],
    reader: _CountingFile,
) -> tuple[list[RecordSlice], list[MalformedRecord]]:
    """Slices of the file's rows, cut from the footer alone (each row group's row count,
    and for ``bytes_per_shard`` its size: a row's size is its group's bytes of the
    record's columns over its rows). No row is read, except the columns whose type can
    hold a malformed value (floats, binary, ...), which are read column-wise to find
    them (only those column chunks)."""
    malformed: list[MalformedRecord] = []
    slices: list[RecordSlice] = []
    projected = columns if inputs.columns is not None else None
    checked = _checked_columns(pf, columns)
    per_shard = inputs.records_per_shard
    limit = inputs.bytes_per_shard
    first, count, size = 0, 0, 0.0
    row = 0  # 0-based index of the group's first row

    def flush() -> None:
        slices.append(_parquet_slice(ref, first, count, inputs, projected))

    for group in range(meta.num_row_groups):
        n = meta.row_group(group).num_rows
        per_row = _group_sizes(meta, group, columns) / n if n else 0.0
        taken = 0
        while taken < n:
            if count == 0:
                progress.start_shard(path, row + taken, inputs)
                first = row + taken
            if per_shard is not None:
                k = min(n - taken, per_shard - count)
            else:
                assert limit is not None
                # Rows that still fit (a shard holds at least one row, however large).
                fit = int((limit - size) // per_row) if per_row > 0 else n - taken
                k = min(n - taken, max(fit, 0 if count else 1))
            count += k
            size += k * per_row
            taken += k
            progress.records += k
            if taken < n or (per_shard is not None and count >= per_shard):
                flush()
                count, size = 0, 0.0
        for i, reason in _group_problems(pf, group, checked, columns):
            malformed.append(MalformedRecord(path=path, row=row + i + 1, reason=reason))
        row += n
    if count:
        flush()
    return slices, malformed


def _parquet_slice(
    ref: FileRef, first: int, count: int, inputs: InputsSpec, columns: list[str] | None
) -> RecordSlice:
    return RecordSlice(
        format="parquet",
        file=ref,
        first_record=first,
        record_count=count,
        on_malformed=inputs.malformed_policy,
        columns=columns,
    )


# -- A shard's records ---------------------------------------------------------------------


def _slice_groups(s: RecordSlice, meta: Any) -> Iterator[tuple[int, int, int, int]]:
    """``(group, base, start, stop)``: the row groups holding rows of ``s``, the file
    index of each group's first row, and the slice's rows in it (0-based in the group,
    stop exclusive); the other groups are never read."""
    end = s.first_record + s.record_count
    base = 0
    for group in range(meta.num_row_groups):
        n = meta.row_group(group).num_rows
        if base >= end:
            return
        if base + n > s.first_record:
            yield group, base, max(s.first_record - base, 0), min(end - base, n)
        base += n


def _slice_table(s: RecordSlice, pf: Any, bad: list[MalformedRecord]) -> Iterator[tuple[int, Any]]:
    """Each row group's part of the slice as an Arrow table of the slice's columns (only
    those column chunks are read), with the file index of its first row; a group that
    cannot be read makes each of its rows of the slice malformed (and yields nothing)."""
    for group, base, start, stop in _slice_groups(s, pf.metadata):
        try:
            table = pf.read_row_group(group, columns=s.columns)
        except Exception as e:  # pyarrow raises many types for corrupt pages
            reason = f"unreadable row group {group}: {type(e).__name__}: {e}"
            for index in range(base + start, base + stop):
                bad.append(MalformedRecord(path=s.file.path, row=index + 1, reason=reason))
            continue
        yield base + start, table.slice(start, stop - start)


def _read_parquet_slice(
    s: RecordSlice, pf: Any, good: list[dict[str, JsonValue]], bad: list[MalformedRecord]
) -> int:
    """Read the rows of ``s`` (its columns only) from the row groups that hold them;
    returns how many rows it saw."""
    seen = len(bad)
    for first_index, table in _slice_table(s, pf, bad):
        for j, row in enumerate(table.to_pylist()):
            try:
                good.append(_row_record(row))
            except ValueError as e:
                bad.append(
                    MalformedRecord(path=s.file.path, row=first_index + j + 1, reason=str(e))
                )
    return len(good) + len(bad) - seen


@dataclass
class SliceTable:
    """A Parquet shard's records as one Arrow table (its columns, the rows that are not
    malformed, in file order), the malformed ones, and the bytes the shard read."""

    table: Any
    malformed: list[MalformedRecord]
    bytes_read: int


def read_slice_table(s: RecordSlice, store: ArtifactStore) -> SliceTable:
    """A Parquet slice as one Arrow table, for operators that take their shard whole
    (``batch: arrow``): only its row groups and its columns are read; rows that would be
    malformed records (a float without a JSON form, ...) are taken out and listed, so
    the table holds the records the per-record path would give."""
    if s.format != "parquet":
        raise ValueError(f"a {s.format} slice has no Arrow table")
    with _open_blob(store, s.file.digest) as blob, _open_parquet(blob) as pf:
        table, bad = _table_of(s, pf)
        read = int(getattr(blob, "bytes_read", 0))
    return SliceTable(table, bad, read)


def _table_of(s: RecordSlice, pf: Any) -> tuple[Any, list[MalformedRecord]]:
    """The slice's rows of an open Parquet file as one table, less its malformed rows
    (listed)."""
    import pyarrow as pa

    bad: list[MalformedRecord] = []
    parts = []
    for first_index, part in _slice_table(s, pf, bad):
        problems = _table_problems(part)
        if problems:
            for i, reason in sorted(problems.items()):
                bad.append(
                    MalformedRecord(path=s.file.path, row=first_index + i + 1, reason=reason)
                )
            keep = [i not in problems for i in range(part.num_rows)]
            part = part.filter(pa.array(keep))
        parts.append(part)
    schema = pf.schema_arrow
    if s.columns is not None:
        schema = pa.schema([schema.field(c) for c in s.columns])
    table = pa.concat_tables(parts) if parts else schema.empty_table()
    if table.num_rows + len(bad) != s.record_count:
        raise RuntimeError(
            f"{s.file.path}: the slice holds {table.num_rows + len(bad)} records, its plan "
            f"says {s.record_count}"
        )
    bad.sort(key=lambda m: m.row or 0)
    return table, bad


#: What pyarrow reads of a file's end to find its footer (``footer_read_size``).
_FOOTER_READ = 64 * 1024


class _SparseFile(io.RawIOBase):
    """A file of ``size`` bytes of which only some ranges are here; reading outside them
    is an ``OSError``. What a Parquet reader needs of a slice: the footer and the slice's
    column chunks (:func:`slice_chunks`)."""

    def __init__(self, size: int, ranges: list[tuple[int, bytes]]) -> None:
        super().__init__()
        self._size = size
        # Adjacent and overlapping ranges joined (a reader may read neighbouring column
        # chunks at once; the footer read may overlap the last chunks).
        joined: list[tuple[int, bytes]] = []
        for start, data in sorted(ranges, key=lambda r: r[0]):
            if joined and start <= joined[-1][0] + len(joined[-1][1]):
                head, have = joined[-1]
                joined[-1] = (head, have + data[head + len(have) - start :])
            else:
                joined.append((start, data))
        self._ranges = joined
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        n = min(len(view), max(0, self._size - self._pos))
        if n == 0:
            return 0
        for start, data in self._ranges:
            if start <= self._pos and self._pos + n <= start + len(data):
                at = self._pos - start
                view[:n] = data[at : at + n]
                self._pos += n
                return n
        raise OSError(f"bytes {self._pos}..{self._pos + n} of the file were not sent")


@dataclass
class SliceChunks:
    """What a Parquet slice's reader needs of the file, for a reader without the store
    (an operator host): the file's size and ``(offset, bytes)`` of its footer and of the
    slice's row groups' column chunks (of its columns); and the bytes fetched for them."""

    size: int
    ranges: list[tuple[int, bytes]]
    bytes_read: int


def slice_chunks(s: RecordSlice, store: ArtifactStore) -> SliceChunks:
    """The footer and the column chunks a shard of ``s`` reads, fetched once each from the
    store (ranged reads), undecoded: :func:`table_of_chunks` decodes them elsewhere.
    ``ValueError`` where the chunks cannot be told from the footer (a selected column
    whose name holds a dot)."""
    if s.format != "parquet":
        raise ValueError(f"a {s.format} slice has no Parquet chunks")
    if s.columns is not None and any("." in c for c in s.columns):
        raise ValueError("a column name with a dot: its chunks are not told apart")
    size = s.file.size_bytes
    with _open_blob(store, s.file.digest) as blob:
        tail = min(size, _FOOTER_READ)
        blob.seek(size - tail)
        end = blob.read(tail)
        footer = int.from_bytes(end[-8:-4], "little") + 8 if len(end) >= 8 else size
        if footer > tail:  # a footer longer than the first read: the rest of it
            blob.seek(size - min(size, footer))
            end = blob.read(min(size, footer) - tail) + end
            tail = len(end)
        ranges: list[tuple[int, bytes]] = [(size - tail, end)]
        meta = _open_parquet(_SparseFile(size, ranges)).metadata
        wanted = set(s.columns) if s.columns is not None else None
        spans: list[tuple[int, int]] = []
        for group, _, _, _ in _slice_groups(s, meta):
            info = meta.row_group(group)
            for c in range(info.num_columns):
                chunk = info.column(c)
                if wanted is not None and chunk.path_in_schema.split(".", 1)[0] not in wanted:
                    continue
                start = chunk.data_page_offset
                if chunk.has_dictionary_page and 0 < chunk.dictionary_page_offset < start:
                    start = chunk.dictionary_page_offset
                spans.append((start, chunk.total_compressed_size))
        for start, length in sorted(spans):
            blob.seek(start)
            ranges.append((start, blob.read(length)))
        read = int(getattr(blob, "bytes_read", 0))
    return SliceChunks(size, ranges, read)


def table_of_chunks(s: RecordSlice, size: int, ranges: list[tuple[int, bytes]]) -> SliceTable:
    """:func:`read_slice_table` from what :func:`slice_chunks` fetched (no store)."""
    with _open_parquet(_SparseFile(size, ranges)) as pf:
        table, bad = _table_of(s, pf)
    return SliceTable(table, bad, 0)


@dataclass
class SliceRead:
    """A shard's records (file order), the malformed ones, and the input bytes it read
    (a Parquet slice: what its reader fetched; a text slice: its chunk)."""

    records: list[dict[str, JsonValue]]
    malformed: list[MalformedRecord]
    bytes_read: int


def read_slice_counted(s: RecordSlice, store: ArtifactStore) -> SliceRead:
    """The records of a slice, in file order, those that could not be read, and the input
    bytes the read fetched. A Parquet slice reads the footer and, of the row groups that
    hold its rows, the column chunks of its columns (all, unless the job selects some).

    ``RuntimeError`` when the stored bytes do not hold the records the slice names (the
    store verifies digests, so only a scanner change could cause it)."""
    good: list[dict[str, JsonValue]] = []
    bad: list[MalformedRecord] = []
    if s.format == "parquet":
        with _open_blob(store, s.file.digest) as blob, _open_parquet(blob) as pf:
            count = _read_parquet_slice(s, pf, good, bad)
            read = int(getattr(blob, "bytes_read", 0))
    else:
        assert s.chunk_digest is not None and s.start_line is not None
        chunk = store.get_bytes(s.chunk_digest)
        read = len(chunk)
        lines = io.BytesIO(chunk)
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
    return SliceRead(good, bad, read)


def read_slice(
    s: RecordSlice, store: ArtifactStore
) -> tuple[list[dict[str, JsonValue]], list[MalformedRecord]]:
    """The records of a slice, in file order, and those that could not be read (see
    :func:`read_slice_counted`)."""
    got = read_slice_counted(s, store)
    return got.records, got.malformed
