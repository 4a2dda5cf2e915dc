"""Record-sharded inputs: JSONL and CSV records with their positions, and shard slices.

An input with a ``format`` (``jsonl``, ``csv``, ``parquet``) is cut into shards of records,
never across files. A shard's payload is one :class:`RecordSlice`: the whole file's
:class:`~keel.mrp.normalize.FileRef`, the index of its first record and how many records
it holds, and for the text formats the lines and byte range they span and the digest of
those bytes. Its input digest therefore names the records *and* where they came from, so
checkpoint keys, seeds and replays keep their meaning, and the same file cuts into the same
shards on any machine and backend.

This module is pure: :func:`iter_jsonl` and :class:`CsvRows` turn lines of bytes (with
their positions) into :class:`Record` values, used both by the compile activity (which
scans whole files to find shard boundaries and malformed records) and by a shard (which
parses its own byte range). Parquet needs pyarrow and lives in ``activities/mrp/records.py``.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from keel.digest import checked_digest
from keel.mrp.dsl import OnMalformed, RecordFormat

TEXT_FORMATS: frozenset[str] = frozenset({"jsonl", "csv"})
#: How many skipped records the run manifest lists by name (the full list is stored).
MAX_LISTED_SKIPPED = 1000

_BOM = b"\xef\xbb\xbf"


class FileRef(BaseModel):
    """A resolved input file: path (relative, or an ``s3://`` URI), content digest, size.

    The compile activity lists the job's globs, hashes each file and hands these to the
    compiler, which stays free of I/O. (Re-exported by ``keel.mrp.normalize``.)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    digest: str
    size_bytes: int = Field(ge=0)

    @field_validator("digest")
    @classmethod
    def _digest(cls, v: str) -> str:
        return checked_digest(v, "digest")


class MalformedRecord(BaseModel):
    """A record that could not be read, where it is and why.

    ``line`` is the 1-based line the record starts on (JSONL, CSV); ``row`` is the 1-based
    record number among the file's records (CSV: data rows after the header; Parquet:
    rows). A Parquet file that cannot be opened at all has neither.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    line: int | None = None
    row: int | None = None
    reason: str

    def where(self) -> str:
        """``data/a.jsonl line 17``, ``data/a.csv line 5 (row 4)``, ``data/a.parquet row 9``."""
        if self.line is not None and self.row is not None:
            return f"{self.path} line {self.line} (row {self.row})"
        if self.line is not None:
            return f"{self.path} line {self.line}"
        if self.row is not None:
            return f"{self.path} row {self.row}"
        return f"{self.path} (whole file)"

    def describe(self) -> str:
        """``where: reason``."""
        return f"{self.where()}: {self.reason}"


class RecordSlice(BaseModel):
    """One shard's records: ``record_count`` consecutive records of one file.

    ``first_record`` is the 0-based index of the first record among the file's records
    (blank lines and a CSV header are not records; malformed records are). For JSONL and
    CSV, ``start_line``..``end_line`` (1-based, inclusive) and ``byte_start``..``byte_end``
    (end exclusive) locate them in the file and ``chunk_digest`` names those bytes in the
    artifact store; ``columns`` is the CSV header. Parquet slices name rows only; the whole
    file is in the store under ``file.digest``, and ``columns`` (when the job selects them,
    ``inputs.columns``) are the only columns its records hold and its shard reads.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: RecordFormat
    file: FileRef
    first_record: int = Field(ge=0)
    record_count: int = Field(ge=1)
    on_malformed: OnMalformed = "fail"
    start_line: int | None = Field(default=None, ge=1)
    end_line: int | None = Field(default=None, ge=1)
    byte_start: int | None = Field(default=None, ge=0)
    byte_end: int | None = Field(default=None, ge=0)
    chunk_digest: str | None = None
    columns: list[str] | None = None

    @model_validator(mode="after")
    def _shape(self) -> RecordSlice:
        text = self.format in TEXT_FORMATS
        located = (self.start_line, self.end_line, self.byte_start, self.byte_end)
        if text and (any(v is None for v in located) or self.chunk_digest is None):
            raise ValueError(f"a {self.format} slice needs its lines, bytes and chunk digest")
        if not text and (any(v is not None for v in located) or self.chunk_digest is not None):
            raise ValueError("a parquet slice names rows only")
        if self.format == "csv" and self.columns is None:
            raise ValueError("a csv slice names its header's columns")
        if self.format == "jsonl" and self.columns is not None:
            raise ValueError("columns are given for csv and parquet slices only")
        if (
            text
            and self.byte_end is not None
            and self.byte_start is not None
            and not self.byte_start < self.byte_end <= self.file.size_bytes
        ):
            raise ValueError("byte range out of the file")
        return self


@dataclass(frozen=True, slots=True)
class Record:
    """One record read from a text file: its number, where it is, its value or error.

    ``index`` is 0-based among the file's records; ``line`` is the 1-based line it starts
    on; ``start``/``end`` are byte offsets in the file (end exclusive, newline included).
    Exactly one of ``value`` and ``error`` is set.
    """

    index: int
    line: int
    start: int
    end: int
    value: dict[str, JsonValue] | None
    error: str | None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (no canonical form)")


def parse_jsonl_line(raw: bytes) -> dict[str, JsonValue]:
    """One JSONL record: a JSON object, UTF-8, without NaN or infinities.

    :class:`ValueError` says what is wrong (JSON syntax with its column, wrong type, bad
    UTF-8)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte {e.start + 1})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg} at column {e.colno}") from None
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise ValueError(f"a JSONL record must be a JSON object, not {type(value).__name__}")
    return value


def iter_jsonl(
    lines: Iterable[bytes], *, first_line: int = 1, offset: int = 0, first_index: int = 0
) -> Iterator[Record]:
    """Records of JSONL ``lines`` (each with its ``\\n``), the first at ``first_line`` and
    byte ``offset`` of its file. Blank lines are not records; a UTF-8 BOM at the very start
    of the file is ignored."""
    index = first_index
    line_no = first_line - 1
    pos = offset
    for raw in lines:
        line_no += 1
        start, pos = pos, pos + len(raw)
        body = raw[3:] if start == 0 and raw.startswith(_BOM) else raw
        if not body.strip():
            continue
        try:
            value: dict[str, JsonValue] | None = parse_jsonl_line(body)
            error = None
        except ValueError as e:
            value, error = None, str(e)
        yield Record(index, line_no, start, pos, value, error)
        index += 1


class CsvHeaderError(ValueError):
    """The CSV header cannot name the columns (unreadable, empty or duplicate names)."""


class _LineFeed:
    """Decoded lines for ``csv.reader``, counting the lines and bytes it took."""

    def __init__(self, lines: Iterable[bytes], offset: int) -> None:
        self._lines = iter(lines)
        self.pos = offset
        self.count = 0

    def __iter__(self) -> _LineFeed:
        return self

    def __next__(self) -> str:
        raw = next(self._lines)
        start = self.pos
        self.pos += len(raw)
        self.count += 1
        if start == 0 and raw.startswith(_BOM):
            raw = raw[3:]
        # Undecodable bytes survive as lone surrogates, which the row check reports.
        return raw.decode("utf-8", "surrogateescape")


def _has_surrogate(fields: list[str]) -> bool:
    return any(any("\udc80" <= c <= "\udcff" for c in f) for f in fields)


class CsvRows:
    """Records of CSV ``lines`` (RFC 4180: quoted fields may hold commas and newlines).

    With ``columns=None`` the first non-blank row is the header (:attr:`columns`, and
    :attr:`header_end` the byte offset after it); give ``columns`` to read a slice of data
    rows. Each record is ``{column: text}``; a row whose field count differs from the
    header's, or that the parser refuses (a stray quote, an unterminated quoted field),
    is a malformed record. Blank lines are not records.
    """

    def __init__(
        self,
        lines: Iterable[bytes],
        *,
        columns: list[str] | None = None,
        first_line: int = 1,
        offset: int = 0,
        first_index: int = 0,
    ) -> None:
        self._feed = _LineFeed(lines, offset)
        self._first_line = first_line
        self._index = first_index
        self.columns = columns
        self.header_end = offset
        self.header_line = 0
        self._reader = self._new_reader()
        if columns is None:
            self._read_header()

    def _new_reader(self) -> Any:
        return csv.reader(self._feed, strict=True)

    def _read_header(self) -> None:
        while True:
            start_count = self._feed.count
            try:
                row = next(self._reader)
            except StopIteration:
                self.header_end = self._feed.pos
                return  # an empty file: no header, no records
            except csv.Error as e:
                raise CsvHeaderError(f"line {start_count + 1}: unreadable header: {e}") from None
            if not row:
                continue
            line = self._first_line + start_count
            if _has_surrogate(row):
                raise CsvHeaderError(f"line {line}: the header is not valid UTF-8")
            if any(not name.strip() for name in row):
                raise CsvHeaderError(f"line {line}: the header has an empty column name")
            seen: set[str] = set()
            for name in row:
                if name in seen:
                    raise CsvHeaderError(f"line {line}: the header names column {name!r} twice")
                seen.add(name)
            self.columns = row
            self.header_end = self._feed.pos
            self.header_line = line
            return

    def __iter__(self) -> Iterator[Record]:
        if self.columns is None:
            return
        width = len(self.columns)
        while True:
            start_count, start = self._feed.count, self._feed.pos
            try:
                row = next(self._reader)
                error = None
            except StopIteration:
                return
            except csv.Error as e:
                # The parser's state is lost: go on with a fresh one after the lines it
                # took. A shard reading this byte range does exactly the same.
                row, error = [], f"invalid CSV: {e}"
                self._reader = self._new_reader()
                if self._feed.count == start_count:  # pragma: no cover - csv read nothing
                    return
            line = self._first_line + start_count
            if error is None and not row:
                continue
            value: dict[str, JsonValue] | None = None
            if error is None:
                if len(row) != width:
                    error = f"row has {len(row)} fields, the header has {width}"
                elif _has_surrogate(row):
                    error = "not valid UTF-8"
                else:
                    value = dict(zip(self.columns, row, strict=True))
            yield Record(self._index, line, start, self._feed.pos, value, error)
            self._index += 1


def malformed_of(record: Record, path: str, fmt: RecordFormat) -> MalformedRecord:
    """The :class:`MalformedRecord` of a text record that failed to parse."""
    return MalformedRecord(
        path=path,
        line=record.line,
        row=record.index + 1 if fmt == "csv" else None,
        reason=record.error or "malformed",
    )


class ShardCutter:
    """Decides where shards end while records stream by: after ``records_per_shard``
    records, or before a record that would take the shard past ``bytes_per_shard``
    (a shard always holds at least one record, however large)."""

    def __init__(self, records_per_shard: int | None, bytes_per_shard: int | None) -> None:
        if (records_per_shard is None) == (bytes_per_shard is None):
            raise ValueError("give records_per_shard or bytes_per_shard")
        self.records_per_shard = records_per_shard
        self.bytes_per_shard = bytes_per_shard

    def full(self, count: int, size_with_next: int) -> bool:
        """Whether a shard of ``count`` records must end before the next record, which
        would make it ``size_with_next`` bytes."""
        if count == 0:
            return False
        if self.records_per_shard is not None:
            return count >= self.records_per_shard
        assert self.bytes_per_shard is not None
        return size_with_next > self.bytes_per_shard


__all__ = [
    "MAX_LISTED_SKIPPED",
    "TEXT_FORMATS",
    "CsvHeaderError",
    "CsvRows",
    "FileRef",
    "MalformedRecord",
    "OnMalformed",
    "Record",
    "RecordFormat",
    "RecordSlice",
    "ShardCutter",
    "iter_jsonl",
    "malformed_of",
    "parse_jsonl_line",
]
