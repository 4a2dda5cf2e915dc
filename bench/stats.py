"""Summaries the benches print."""

from __future__ import annotations

import statistics


def p90(values: list[float]) -> float:
    """The 90th percentile (the largest value when there are too few to cut)."""
    return statistics.quantiles(values, n=10)[-1] if len(values) > 2 else max(values)


def p99(values: list[float]) -> float:
    """The 99th percentile (the largest value when there are too few to cut)."""
    return statistics.quantiles(values, n=100)[-1] if len(values) > 2 else max(values)
