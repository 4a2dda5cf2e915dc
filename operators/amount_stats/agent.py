"""Per-shard statistics of one numeric field, in Decimal.

Amounts are read exactly (``"12.30"`` and ``12.3`` are the decimal 12.3, never a binary
float) and written back as decimal strings, so the reducer can add them without rounding.
"""

from __future__ import annotations

from decimal import Decimal

from pydantic import JsonValue

from keel.mrp.normalize import decimal_sum, to_decimal
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
