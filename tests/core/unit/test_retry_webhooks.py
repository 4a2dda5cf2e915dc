from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from keel.retry import is_retryable_status, parse_retry_after
from keel.webhooks import sign, verify


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (422, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
    ],
)
def test_status_classification(status, retryable):
    assert is_retryable_status(status) is retryable


def test_retry_after_seconds_and_date():
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7", now=now) == 7.0
    assert parse_retry_after(format_datetime(now + timedelta(seconds=30)), now=now) == 30.0
    assert parse_retry_after(format_datetime(now - timedelta(seconds=30)), now=now) == 0.0
    assert parse_retry_after("soon", now=now) is None
    assert parse_retry_after(None, now=now) is None


def test_hmac_sign_verify():
    body = b'{"a":1}'
    sig = sign("s3cret", 1000, body)
    assert verify("s3cret", 1000, body, sig, now=1010)
    assert not verify("other", 1000, body, sig, now=1010)
    assert not verify("s3cret", 1000, body + b" ", sig, now=1010)
    assert not verify("s3cret", 1000, body, sig, now=5000)  # stale: replay refused
