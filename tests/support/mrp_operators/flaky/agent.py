"""Fail ``params.fail_times`` times per shard, then succeed.

Attempts are counted in ``params.state_dir`` (one file per shard, one byte appended per
attempt, so processes and threads count together). ``params.only_shards`` limits the
failures to those shard ids. While ``<state_dir>/hold`` exists, a shard in
``params.hold_shards`` waits before its attempt counts, so a test can keep a window running
for as long as it needs. The output does not depend on the attempt count.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext


class FlakyFailure(RuntimeError):
    """The failure this operator raises on purpose."""


def record_attempt(state_dir: Path, shard: str) -> int:
    """Append one attempt for ``shard``; return the attempt number (1-based)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / f"{shard}.attempts"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, b".")
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def attempts(state_dir: str | Path, shard: str) -> int:
    """How many attempts ``shard`` has made (for test assertions)."""
    path = Path(state_dir) / f"{shard}.attempts"
    return path.stat().st_size if path.exists() else 0


class Flaky(AgentBase):
    """``{"items": n, "chars": total}`` once the shard has failed ``fail_times`` times."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        shard = ctx.shard_id or "no-shard"
        only = ctx.params.get("only_shards")
        state_dir = Path(str(ctx.params["state_dir"]))
        held = ctx.params.get("hold_shards") or []
        while shard in held and (state_dir / "hold").exists():  # type: ignore[operator]
            time.sleep(0.05)
        attempt = record_attempt(state_dir, shard)
        fail_times = int(ctx.params.get("fail_times", 0))  # type: ignore[arg-type]
        if (only is None or shard in only) and attempt <= fail_times:  # type: ignore[operator]
            raise FlakyFailure(f"{shard}: planned failure {attempt} of {fail_times}")
        chars = sum(len(i) if isinstance(i, str) else len(str(i)) for i in items)
        return {"items": len(items), "chars": chars}
