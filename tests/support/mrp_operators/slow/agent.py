"""Sleep ``params.sleep_s`` per shard, then return a deterministic output.

With ``params.state_dir``, each run of a shard appends to ``<state_dir>/<shard>.runs``
when it starts and to ``<shard>.done`` when it finishes, so a test can show that no
finished shard ran again after a worker was killed. While ``<state_dir>/hold`` exists, a
shard that has slept waits before it finishes: a test holds a job mid-map that way.
Each run also appends the path this code was loaded from to ``<shard>.where``: on a
joined Ray cluster that is the node's copy of the shipped code, so it names the node.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext


def _append(path: Path, text: str = ".") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def where(state_dir: str | Path, shard: str) -> list[str]:
    """The paths the code of each run of ``shard`` was loaded from, in order."""
    path = Path(state_dir) / f"{shard}.where"
    return path.read_text().splitlines() if path.exists() else []


def count(state_dir: str | Path, shard: str, what: str = "done") -> int:
    """How many times ``shard`` started (``runs``) or finished (``done``)."""
    path = Path(state_dir) / f"{shard}.{what}"
    return path.stat().st_size if path.exists() else 0


class Slow(AgentBase):
    """``{"items": n, "chars": total}`` after sleeping."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        shard = ctx.shard_id or "no-shard"
        state = ctx.params.get("state_dir")
        if state:
            _append(Path(str(state)) / f"{shard}.runs")
            _append(Path(str(state)) / f"{shard}.where", f"{Path(__file__).resolve()}\n")
        time.sleep(float(ctx.params.get("sleep_s", 0.5)))  # type: ignore[arg-type]
        while state and (Path(str(state)) / "hold").exists():
            time.sleep(0.05)
        chars = sum(len(i) if isinstance(i, str) else len(str(i)) for i in items)
        if state:
            _append(Path(str(state)) / f"{shard}.done")
        return {"items": len(items), "chars": chars}
