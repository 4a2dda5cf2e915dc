"""Temporal metrics from inside an activity, that never fail it.

:func:`meter_add` and :func:`meter_hist` record through ``activity.metric_meter()``; outside
an activity, or when the meter refuses, they record nothing (a metric is never worth an
activity's failure). The actor and MRP activities both count and time through these.
"""

from __future__ import annotations

import contextlib

from temporalio import activity

__all__ = ["meter_add", "meter_hist"]


def meter_add(name: str, description: str, value: int, attrs: dict[str, str]) -> None:
    """Add ``value`` to the counter ``name``."""
    if not activity.in_activity():
        return
    with contextlib.suppress(Exception):  # metrics never fail an activity
        activity.metric_meter().create_counter(name, description).add(value, attrs)


def meter_hist(name: str, description: str, unit: str, value: float, attrs: dict[str, str]) -> None:
    """Record ``value`` in the float histogram ``name``."""
    if not activity.in_activity():
        return
    with contextlib.suppress(Exception):
        activity.metric_meter().create_histogram_float(name, description, unit).record(value, attrs)
