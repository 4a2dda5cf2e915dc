"""Cost a lot: ``cost_weight`` 100 per shard in the estimate, plus
``params.extra_units_per_item`` charged at run time through ``ctx.charge`` (a metered tool
the estimate does not know about), so a job can overrun its estimate and trip the budget
kill switch."""

from __future__ import annotations

from decimal import Decimal

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext


class Expensive(AgentBase):
    """``{"items": n}``; charges ``extra_units_per_item * n`` units."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        extra = Decimal(str(ctx.params.get("extra_units_per_item", 0)))
        if extra:
            ctx.charge(extra * len(items), "metered work")
        return {"items": len(items)}
