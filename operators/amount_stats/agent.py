"""Per-shard statistics of one numeric field, in Decimal.

Amounts are read exactly (``"12.30"`` and ``12.3`` are the decimal 12.3, never a binary
float) and written back as decimal strings, so the reducer can add them without rounding.

``batch: arrow``: a Parquet shard comes whole as an Arrow table (``map_arrow``). An integer
column is summed by ``pyarrow.compute`` when its sum cannot leave int64 nor the decimal
context's precision (then the sum is exact and equals :func:`decimal_sum`'s); any other
column (floats, decimals, strings) goes value by value through the same path as ``map``,
so both give the same output for the same records.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from pydantic import JsonValue

from keel.mrp.normalize import DECIMAL_PRECISION, decimal_sum, to_decimal
from keel.mrp.sdk import AgentBase, OperatorContext


def _amount(item: JsonValue, field: str) -> Decimal:
    value = item.get(field) if isinstance(item, dict) else item
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"field {field!r} must be a number or a decimal string")
    return to_decimal(value)


class AmountStats(AgentBase):
    """``{"count", "sum", "min", "max"}`` of ``params.field`` (default ``amount``); ``sum``,
    ``min`` and ``max`` are decimal strings."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        field = str(ctx.params.get("field", "amount"))
        amounts = [_amount(item, field) for item in items]
        return {
            "count": len(amounts),
            "sum": str(decimal_sum(amounts)),
            "min": str(min(amounts)),
            "max": str(max(amounts)),
        }

    def map_arrow(self, table: Any, ctx: OperatorContext) -> JsonValue:
        import pyarrow.compute as pc
        import pyarrow.types as pt

        field = str(ctx.params.get("field", "amount"))
        if field not in table.column_names:
            raise ValueError(f"field {field!r} must be a number or a decimal string")
        col = table.column(field)
        if col.null_count or not pt.is_integer(col.type) or len(col) == 0:
            values = col.to_pylist()
            return self.map([{field: v} for v in values], ctx)
        mm = pc.min_max(col)
        low, high = mm["min"].as_py(), mm["max"].as_py()
        bound = len(col) * max(abs(low), abs(high))
        if bound >= 1 << 63 or bound >= 10**DECIMAL_PRECISION:
            return self.map([{field: v} for v in col.to_pylist()], ctx)
        total = pc.sum(col.cast("int64")).as_py()
        return {"count": len(col), "sum": str(total), "min": str(low), "max": str(high)}
