"""Use case: a data spec from a sample file of the user's data (issue 38 §2), CSV or
Parquet, for the intake form's ``data`` field. The file is read here; the columns, their
types, the time column and the shipped ``sample_csv`` come from
:func:`keel.design.samples.spec_from_table`."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from keel.design.constraints import DataSpec, Task
from keel.design.samples import spec_from_table

#: Rows read from a sample file: the spec's sample keeps what fits in its size limit.
MAX_SAMPLE_ROWS = 5_000


class SampleError(ValueError):
    """The file cannot be read as a sample (its kind, or its content)."""


def read_table(path: Path, *, max_rows: int = MAX_SAMPLE_ROWS) -> tuple[list[str], list[list[Any]]]:
    """(header, rows) of a ``.csv`` (values as text) or ``.parquet`` (values as Parquet
    types them: dates, numbers, booleans, text) file: its first ``max_rows`` rows."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        try:
            with path.open(newline="", encoding="utf-8") as f:
                reader = csv.reader(f)
                header = next(reader, None)
                if header is None:
                    raise SampleError(f"{path} is empty")
                rows: list[list[Any]] = []
                for row in reader:
                    if len(rows) >= max_rows:
                        break
                    if row:
                        rows.append(list(row))
        except (OSError, UnicodeDecodeError) as e:
            raise SampleError(f"cannot read {path}: {e}") from None
        return [h.strip() for h in header], rows
    if suffix in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(path)
            batch = next(parquet.iter_batches(batch_size=max_rows), None)
        except (OSError, ValueError) as e:
            raise SampleError(f"cannot read {path} as Parquet: {e}") from None
        names = [str(n) for n in parquet.schema_arrow.names]
        if batch is None:
            return names, []
        table = batch.to_pylist()
        return names, [[record.get(n) for n in names] for record in table]
    raise SampleError(f"{path}: a sample is a .csv or .parquet file, not {suffix or 'no suffix'}")


def data_spec_from_file(
    path: Path, *, task: Task | str, target: str | None, time_column: str | None = None
) -> DataSpec:
    """The data spec of the sample ``path`` for ``task`` predicting ``target``. Raises
    :class:`SampleError` when the file or its table does not make a spec."""
    header, rows = read_table(path)
    try:
        return spec_from_table(header, rows, task=task, target=target, time_column=time_column)
    except ValueError as e:
        raise SampleError(f"{path}: {e}") from None


def form_with_sample(
    form: dict[str, Any],
    path: Path,
    *,
    task: Task | str,
    target: str | None,
    time_column: str | None = None,
) -> dict[str, Any]:
    """The intake form with its ``data`` field made from the sample ``path``."""
    spec = data_spec_from_file(path, task=task, target=target, time_column=time_column)
    return {**form, "data": spec.model_dump(mode="json", exclude_none=True)}


__all__ = [
    "MAX_SAMPLE_ROWS",
    "SampleError",
    "data_spec_from_file",
    "form_with_sample",
    "read_table",
]
