"""Allocate ``params.mb`` MiB on the shards named in ``params.hog_shards`` (touching every
page, so it is real memory), then answer like the other shards: ``{"items", "chars"}``."""

from __future__ import annotations

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext


class MemoryHog(AgentBase):
    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        hogs = ctx.params.get("hog_shards") or []
        if ctx.shard_id in hogs:  # type: ignore[operator]
            mb = int(ctx.params.get("mb", 64))  # type: ignore[arg-type]
            block = bytearray(mb * 1024 * 1024)
            for i in range(0, len(block), 4096):
                block[i] = 1
            del block
        chars = sum(len(i) if isinstance(i, str) else len(str(i)) for i in items)
        return {"items": len(items), "chars": chars}
