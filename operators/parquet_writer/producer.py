"""Write the reduced value as a Parquet file with byte-identical output for equal input.

Rows:
- ``params.rows`` names a dotted path to a list of objects in the reduced value; or
- the reduced value is itself a list of objects; or
- otherwise its leaves are flattened into ``(key, value)`` rows (dotted keys, sorted).

The schema is fixed by the rows: columns sorted by name; a column whose values are all
integers is ``int64``, all booleans ``bool``, anything else ``string`` (numbers written as
their JSON text, so decimal strings stay exact). Missing values are nulls. Determinism:
no pandas or other key-value metadata, one row group, fixed compression, dictionary
encoding off, and no timestamps anywhere; the footer's ``created_by`` names the pyarrow
version, so digests are stable for a given pyarrow.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import JsonValue

from keel.digest import digest_json
from keel.mrp.dsl import SinkSpec
from keel.mrp.sdk import (
    OperatorContext,
    ProducerBase,
    ProduceResult,
    audit_log_bytes,
    sink_file_name,
    write_output,
)


def _flatten(value: JsonValue, prefix: str = "") -> list[tuple[str, JsonValue]]:
    if isinstance(value, dict):
        out: list[tuple[str, JsonValue]] = []
        for key in sorted(value):
            out.extend(_flatten(value[key], f"{prefix}.{key}" if prefix else key))
        return out
    return [(prefix or "value", value)]


def rows_of(reduced: JsonValue, path: str | None) -> list[dict[str, JsonValue]]:
    """The rows to write (see the module docstring)."""
    target: JsonValue = reduced
    if path:
        for part in path.split("."):
            if not isinstance(target, dict) or part not in target:
                raise ValueError(f"params.rows: {path!r} is not in the reduced value")
            target = target[part]
        if not isinstance(target, list):
            raise ValueError(f"params.rows: {path!r} is not a list")
    if isinstance(target, list):
        if not all(isinstance(r, dict) for r in target):
            raise ValueError("rows must be objects")
        return [r for r in target if isinstance(r, dict)]
    return [{"key": k, "value": v} for k, v in _flatten(target)]


def _column(values: list[JsonValue]) -> tuple[pa.DataType, list[Any]]:
    present = [v for v in values if v is not None]
    if present and all(isinstance(v, bool) for v in present):
        return pa.bool_(), values
    if present and all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return pa.int64(), values
    texts = [
        None if v is None else v if isinstance(v, str) else json.dumps(v, sort_keys=True)
        for v in values
    ]
    return pa.string(), texts


def parquet_bytes(rows: list[dict[str, JsonValue]], compression: str = "zstd") -> bytes:
    """The Parquet file of ``rows`` (deterministic; see the module docstring)."""
    names = sorted({k for r in rows for k in r}) or ["value"]
    fields = []
    arrays = []
    for name in names:
        dtype, values = _column([r.get(name) for r in rows])
        fields.append(pa.field(name, dtype, nullable=True))
        arrays.append(pa.array(values, type=dtype))
    schema = pa.schema(fields)  # no metadata
    table = pa.Table.from_arrays(arrays, schema=schema)
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression=compression,
        use_dictionary=False,
        write_statistics=True,
        row_group_size=max(1, len(rows)),
        store_schema=False,  # no ARROW:schema key-value metadata
        version="2.6",
    )
    return sink.getvalue()


class ParquetWriter(ProducerBase):
    """``params.rows``: dotted path of the row list; ``params.compression``: zstd (default),
    snappy, gzip or none."""

    def produce(
        self, reduced: JsonValue, sink: SinkSpec, out_dir: Path, ctx: OperatorContext
    ) -> ProduceResult:
        path = ctx.params.get("rows")
        rows = rows_of(reduced, str(path) if path else None)
        compression = str(ctx.params.get("compression", "zstd"))
        if compression == "none":
            compression = "NONE"
        name = sink_file_name(sink)
        data = write_output(out_dir, name, parquet_bytes(rows, compression))
        columns: list[JsonValue] = []
        columns.extend(sorted({k for r in rows for k in r}))
        audit: list[dict[str, JsonValue]] = [
            {
                "event": "produce",
                "operator": ctx.operator,
                "sink_kind": sink.kind.value,
                "destination": sink.destination,
                "input_digest": digest_json(reduced),
                "file": data.path,
                "digest": data.digest,
                "size": data.size,
                "rows": len(rows),
                "columns": columns,
                "pyarrow": pa.__version__,
                "seed": ctx.seed,
                **ctx.run_audit(),
            }
        ]
        log = write_output(out_dir, f"{name}.audit.jsonl", audit_log_bytes(audit))
        ctx.log(f"wrote {data.path} ({len(rows)} rows, {data.size} bytes)")
        return ProduceResult(files=[data, log], rows=len(rows), audit=audit)
