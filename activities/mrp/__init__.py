"""MRP's runtime: the ``mrp.*`` activities and what they run on.

- ``activities``: the six activities (:class:`MrpActivities`), thin over the modules below;
- ``window``: the map window (shards of one window, retries, checkpoints, budget);
- ``backends``: where a shard attempt runs (threads, or Ray through ``activities.fanout``);
- ``operators``: operators on disk (config, pins, signatures), loading and invoking them;
- ``egress``: the guard that keeps operator code off the network;
- ``llm``: ``ctx.llm``, the request-digest cache in front of the LLM gateway;
- ``inputs``: the files a job's ``inputs.files`` name.

``from activities.mrp import MrpActivities`` is all a worker needs; the import of the
activities module (SQLAlchemy, OpenTelemetry, Ray's client) happens on that first use, so
``activities.mrp.inputs`` or ``activities.mrp.operators`` stay cheap for the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from activities.mrp.activities import MrpActivities

__all__ = ["MrpActivities"]


def __getattr__(name: str) -> Any:
    if name == "MrpActivities":
        from activities.mrp.activities import MrpActivities

        return MrpActivities
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
