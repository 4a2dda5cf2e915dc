"""HTTP status → retryability, and ``Retry-After`` parsing: one rule for every HTTP client.

Temporal owns retries, so clients only classify: 4xx are the caller's fault and final,
except 408 (timeout), 409 (conflict), 425 (too early) and 429 (rate limited); 5xx are
the server's and worth another try.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

RETRYABLE_4XX = frozenset({408, 409, 425, 429})


def is_retryable_status(status: int) -> bool:
    """Whether a request that got ``status`` may succeed if tried again."""
    if status >= 500:
        return True
    return status in RETRYABLE_4XX


def parse_retry_after(value: str | None, *, now: datetime) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - now).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, min(seconds, 24 * 3600.0))
