"""How ``srl collect`` reads as text: its live progress line and its summary."""

from __future__ import annotations

import time
from typing import Any


def progress_line(p: Any, started: float) -> str:
    t = p.totals
    minutes = max(time.monotonic() - started, 1e-6) / 60
    precision = f"{t.verified_steps / t.steps:.1%}" if t.steps else "-"
    episodes = p.task_count * p.samples if p.task_count is not None else None
    return (
        f"episodes {p.done}/{episodes} ({p.in_flight} running), steps {t.steps}, "
        f"verified {t.verified_steps}, precision {precision}, {t.steps / minutes:.1f} steps/min"
    )


def collect_text(collection: str, t: Any, elapsed: float) -> str:
    """A finished collection's totals and its rate in steps a minute."""
    rate = t.steps / (elapsed / 60) if elapsed > 0 else 0.0
    return (
        f"{collection}: {t.episodes} episodes ({t.verified_episodes} verified, "
        f"{t.failed_episodes} failed), {t.steps} steps, {t.verified_steps} verified, "
        f"{t.format_errors} malformed, {t.sandbox_failures} sandbox failures, "
        f"{t.reused_steps} reused; "
        f"{elapsed:.1f}s ({rate:.1f} steps/min)"
    )
