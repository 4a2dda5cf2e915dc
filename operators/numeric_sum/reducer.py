"""Add up the numbers in every shard output with Decimal, never with float.

Each shard output is flattened to ``{dotted.path: number}`` (numbers, and strings that are
decimal numbers; everything else is ignored). ``totals`` adds each path over all shards
with :func:`keel.mrp.normalize.decimal_sum`, whose result does not depend on the order of
its operands; ``means`` divides one total by another (``{"name": {"sum": path, "count":
path}}``) in the fixed decimal context. Results are decimal strings, keys sorted.
"""

from __future__ import annotations

import decimal
from decimal import Decimal

from pydantic import JsonValue

from keel.mrp.normalize import decimal_context, decimal_sum, quantize, to_decimal
from keel.mrp.sdk import OperatorContext, ReducerBase


def _number(value: JsonValue) -> Decimal | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return to_decimal(value)
    if isinstance(value, str):
        try:
            d = Decimal(value)
        except decimal.InvalidOperation:
            return None
        return d if d.is_finite() else None
    return None


def flatten(value: JsonValue, prefix: str = "") -> dict[str, Decimal]:
    """``{"a": {"b": 1}, "c": "2.5"}`` -> ``{"a.b": 1, "c": 2.5}`` (numeric leaves only)."""
    out: dict[str, Decimal] = {}
    if isinstance(value, dict):
        for key, child in value.items():
            out.update(flatten(child, f"{prefix}.{key}" if prefix else str(key)))
        return out
    n = _number(value)
    if n is not None and prefix:
        out[prefix] = n
    return out


class NumericSum(ReducerBase):
    """``{"shards", "totals": {path: str}, "means": {name: str}}``."""

    def reduce(self, outputs: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        fields = ctx.params.get("fields")
        places = ctx.params.get("places")
        columns: dict[str, list[Decimal]] = {}
        for output in outputs:
            for path, n in flatten(output).items():
                if fields is None or path in fields:  # type: ignore[operator]
                    columns.setdefault(path, []).append(n)

        def fmt(d: Decimal) -> str:
            return str(quantize(d, int(places)) if isinstance(places, int) else d)

        totals = {path: decimal_sum(columns[path]) for path in sorted(columns)}
        means: dict[str, JsonValue] = {}
        spec = ctx.params.get("means") or {}
        assert isinstance(spec, dict)
        for name in sorted(spec):
            pair = spec[name]
            assert isinstance(pair, dict)
            numerator = totals.get(str(pair["sum"]), Decimal(0))
            denominator = totals.get(str(pair["count"]), Decimal(0))
            means[name] = (
                None if denominator == 0 else fmt(decimal_context().divide(numerator, denominator))
            )
        return {
            "shards": len(outputs),
            "totals": {path: fmt(total) for path, total in totals.items()},
            "means": means,
        }
