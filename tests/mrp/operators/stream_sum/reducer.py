"""Add up the integer fields of every shard output, one output at a time (a
:class:`~keel.mrp.sdk.StreamingReducerBase`): ``{"shards": n, "totals": {field: sum}}``.
Non-integer fields (and booleans) are left out."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import JsonValue

from keel.mrp.sdk import OperatorContext, StreamingReducerBase


class StreamSum(StreamingReducerBase):
    def reduce_stream(self, outputs: Sequence[JsonValue], ctx: OperatorContext) -> JsonValue:
        shards = 0
        totals: dict[str, int] = {}
        for output in outputs:
            shards += 1
            if isinstance(output, dict):
                for key, value in output.items():
                    if isinstance(value, int) and not isinstance(value, bool):
                        totals[key] = totals.get(key, 0) + value
        assert shards == len(outputs)
        return {"shards": shards, "totals": dict(sorted(totals.items()))}
