"""The MRP activities' spans and how an operator's failure reaches the workflow.

- :func:`span`: a ``keel.mrp`` tracer span per phase, with the attributes OpenTelemetry
  takes (others are dropped).
- :func:`operator_errors`: an operator's ``OperatorError`` becomes the phase's
  ``ApplicationError`` (``ERROR_PHASE``), retryable when the operator says so.

Metrics are :mod:`activities.telemetry`'s ``meter_add`` / ``meter_hist``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from temporalio.exceptions import ApplicationError

from keel.mrp.run import ERROR_PHASE

__all__ = ["operator_errors", "span", "tracer"]

tracer = trace.get_tracer("keel.mrp")


@contextlib.contextmanager
def span(name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A span named ``name``; attributes that are not str, int, float or bool are left out."""
    clean = {k: v for k, v in attributes.items() if isinstance(v, str | int | float | bool)}
    with tracer.start_as_current_span(name, attributes=clean) as current:
        yield current


@contextlib.contextmanager
def operator_errors() -> Iterator[None]:
    """An operator's failure becomes the phase's ``ApplicationError``, retryable when the
    operator says so (reduce, evaluate and produce report it the same way)."""
    from keel.mrp.sdk import OperatorError

    try:
        yield
    except OperatorError as e:
        raise ApplicationError(str(e), type=ERROR_PHASE, non_retryable=not e.retryable) from None
