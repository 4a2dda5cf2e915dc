"""HMAC signatures for Keel's outgoing webhooks.

The signed message is ``<timestamp>.<body>`` so a captured request cannot be replayed
later with a new timestamp; receivers check the signature and the timestamp's age.
"""

from __future__ import annotations

import hashlib
import hmac

SIGNATURE_HEADER = "X-Keel-Signature"
TIMESTAMP_HEADER = "X-Keel-Timestamp"
EVENT_HEADER = "X-Keel-Event"
IDEMPOTENCY_HEADER = "Idempotency-Key"


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``sha256=<hex>`` HMAC of ``<timestamp>.<body>`` under ``secret``."""
    mac = hmac.new(secret.encode(), str(timestamp).encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def verify(
    secret: str,
    timestamp: int,
    body: bytes,
    signature: str,
    *,
    now: float,
    tolerance_s: float = 300,
) -> bool:
    """True if ``signature`` is valid for ``body`` at ``timestamp`` and the timestamp is fresh."""
    if abs(now - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)
