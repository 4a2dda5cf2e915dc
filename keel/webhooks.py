"""HMAC signatures for Keel's outgoing webhooks.

The signed message is ``<timestamp>.<body>`` so a captured request cannot be replayed
later with a new timestamp; receivers check the signature and the timestamp's age.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence
from urllib.parse import unquote, urlsplit

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


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_and_segments(url: str) -> tuple[str, str, int, list[str]] | None:
    """``(scheme, host, port, path segments)`` of an http(s) URL with no userinfo, query,
    fragment or dot segments; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    # "http://allowed@evil/" names host evil: no userinfo at all, not even an empty one.
    if "@" in parts.netloc or "\\" in url or parts.query or parts.fragment:
        return None
    segments = [unquote(s) for s in parts.path.split("/")[1:]]
    # HTTP clients resolve "." and ".." (also percent-encoded) before sending, which would
    # let "/hooks/../admin" pass a check made on the text.
    if any(s in (".", "..") or "/" in s or "\\" in s for s in segments):
        return None
    if segments and segments[-1] == "":
        segments.pop()
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme], segments


def webhook_url_allowed(url: str, allowed: Sequence[str]) -> bool:
    """Whether ``url`` lies under one of the ``allowed`` base URLs.

    Scheme, host and port must equal the base's exactly and the path must extend the
    base's path segment by segment (``/hooks`` allows ``/hooks/x``, not ``/hooks-evil``).
    URLs with userinfo, a query, a fragment or dot segments are never allowed.
    """
    target = _origin_and_segments(url)
    if target is None:
        return False
    for base in allowed:
        rule = _origin_and_segments(base)
        if rule is None:
            continue
        if target[:3] == rule[:3] and target[3][: len(rule[3])] == rule[3]:
            return True
    return False
