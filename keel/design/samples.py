"""A data spec from a sample of the user's data (issue 38 §2): a table read from a CSV or
Parquet file (the reading is the caller's: :mod:`client.design_sample`) becomes the
columns, their types and the ``sample_csv`` the generated repository ships.

Pure: values in, a validated :class:`~keel.design.constraints.DataSpec` out. Each column's
type is inferred from its values: booleans, integers, numbers, dates or times (the one
such column is the ``time_column``, which dates the records), categories (at most
:data:`~keel.design.constraints.MAX_CATEGORIES` distinct short values, repeated), else
text. Names become snake_case identifiers; the sample keeps as many rows as fit in
:data:`~keel.design.constraints.MAX_SAMPLE_CSV_CHARS`.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from datetime import date, datetime

from keel.design.constraints import (
    MAX_CATEGORIES,
    MAX_SAMPLE_CSV_CHARS,
    RESERVED_COLUMNS,
    Column,
    ColumnType,
    DataSpec,
    Task,
)

_TRUE = frozenset({"true", "yes"})
_FALSE = frozenset({"false", "no"})
_INT = re.compile(r"^[+-]?\d+$")
#: A category value is at most this long (the spec's limit).
_CATEGORY_CHARS = 64


def snake_name(name: str) -> str:
    """``Monthly Spend ($)`` as ``monthly_spend``; a leading digit gets ``c_``."""
    out = re.sub(r"[^a-z0-9]+", "_", name.strip().lower()).strip("_")[:63] or "column"
    return f"c_{out}"[:63] if out[0].isdigit() else out


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _as_time(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    if isinstance(value, str) and re.match(r"^\d{4}-\d{2}-\d{2}", value.strip()):
        try:
            return datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            return None
    return None


def _is_bool(value: object) -> bool:
    return isinstance(value, bool) or (
        isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE
    )


def _is_int(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return value.is_integer()
    return isinstance(value, str) and bool(_INT.match(value.strip()))


def _is_number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    if not isinstance(value, str):
        return False
    try:
        float(value)
    except ValueError:
        return False
    return True


def infer_type(values: Sequence[object]) -> ColumnType | None:
    """The column type of ``values`` (blanks ignored); None for a date or time column."""
    present = [v for v in values if not _blank(v)]
    if not present:
        return ColumnType.TEXT
    if all(_as_time(v) is not None for v in present):
        return None
    if all(_is_bool(v) for v in present):
        return ColumnType.BOOLEAN
    if all(_is_int(v) for v in present):
        return ColumnType.INTEGER
    if all(_is_number(v) for v in present):
        return ColumnType.NUMBER
    distinct = {str(v).strip() for v in present}
    if (
        2 <= len(distinct) <= MAX_CATEGORIES
        and len(distinct) <= max(2, len(present) // 2)
        and all(len(v) <= _CATEGORY_CHARS for v in distinct)
    ):
        return ColumnType.CATEGORY
    return ColumnType.TEXT


def _cell(value: object, kind: ColumnType | None) -> str:
    if _blank(value):
        return ""
    if kind is None:
        at = _as_time(value)
        return at.isoformat() if at is not None else str(value)
    if kind == ColumnType.BOOLEAN:
        return "true" if value is True or str(value).strip().lower() in _TRUE else "false"
    if kind == ColumnType.INTEGER:
        return str(int(float(str(value))))
    return str(value).strip() if isinstance(value, str) else str(value)


def spec_from_table(
    header: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    task: Task | str,
    target: str | None,
    time_column: str | None = None,
) -> DataSpec:
    """The data spec of a sample table: ``header`` (its column names as in the file),
    ``rows`` (each as many values as the header), the task and the target (named as in
    the file or as its snake_case form). Raises ValueError (a spec's own reasons too)."""
    names = [snake_name(h) for h in header]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"column names repeat once written in snake_case: {', '.join(repeated)}")
    if not rows:
        raise ValueError("the sample has no rows")
    if any(len(r) != len(names) for r in rows):
        raise ValueError(f"every row of the sample must have {len(names)} values")
    wanted_time = snake_name(time_column) if time_column else None
    kinds: list[ColumnType | None] = []
    for i, name in enumerate(names):
        kind = infer_type([r[i] for r in rows])
        if name == wanted_time and kind is not None:
            raise ValueError(f"time column {name!r} does not hold ISO 8601 dates or times")
        kinds.append(kind)
    times = [n for n, k in zip(names, kinds, strict=True) if k is None]
    if wanted_time is None and len(times) > 1:
        raise ValueError(
            f"the sample has several date or time columns ({', '.join(times)}): "
            "name the one that dates the records"
        )
    chosen = wanted_time or (times[0] if times else None)
    extra_times = [n for n in times if n != chosen]
    reserved = sorted({n for n in names if n in RESERVED_COLUMNS and n != chosen})
    if reserved:
        raise ValueError(
            f"column names {', '.join(reserved)} are reserved (every record has them): "
            "rename them in the sample"
        )
    columns: list[Column] = []
    for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        if kind is None:
            if name in extra_times:
                raise ValueError(f"{name!r} is a second date or time column")
            continue
        categories: list[str] = []
        if kind == ColumnType.CATEGORY:
            categories = sorted({str(r[i]).strip() for r in rows if not _blank(r[i])})
        columns.append(Column(name=name, type=kind, categories=categories))
    target_name = snake_name(target) if target else None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(names)
    size = len(out.getvalue())
    lines: list[str] = [out.getvalue()]
    for row in rows:
        line = io.StringIO()
        csv.writer(line, lineterminator="\n").writerow(
            [_cell(v, k) for v, k in zip(row, kinds, strict=True)]
        )
        if size + len(line.getvalue()) > MAX_SAMPLE_CSV_CHARS:
            break
        lines.append(line.getvalue())
        size += len(line.getvalue())
    return DataSpec(
        task=Task(task),
        columns=columns,
        target=target_name,
        sample_csv="".join(lines),
        time_column=chosen,
    )


__all__ = ["infer_type", "snake_name", "spec_from_table"]
