"""Signed, time-limited URLs: a link that carries its own permission.

``GET /design/decision-sets/{id}/download`` hands out ``<path>?expires=<unix>&sig=<hex>``; the
artifact route serves it without a bearer token when the signature is valid for that path
and expiry and the expiry has not passed. The key is derived from a configured secret with
a purpose label, so a signature made for one use (a webhook body) is never valid for
another (a download).
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlencode

#: Separates the key of download links from other uses of the same secret.
DOWNLOAD_PURPOSE = b"keel-signed-download-v1"


def derive_key(secret: str, purpose: bytes = DOWNLOAD_PURPOSE) -> bytes:
    """The signing key for ``purpose`` under ``secret``."""
    return hmac.new(secret.encode(), purpose, hashlib.sha256).digest()


def signature(key: bytes, path: str, expires: int) -> str:
    """Hex HMAC-SHA256 of ``<path>\\n<expires>``: the path and the expiry, nothing else."""
    return hmac.new(key, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()


def signed_path(key: bytes, path: str, expires: int) -> str:
    """``path?expires=<expires>&sig=<signature>``."""
    return f"{path}?{urlencode({'expires': expires, 'sig': signature(key, path, expires)})}"


def verify(key: bytes, path: str, expires: int, sig: str, *, now: float) -> bool:
    """True if ``sig`` signs ``path`` and ``expires``, and ``expires`` is still ahead of ``now``."""
    if now >= expires:
        return False
    # Bytes: compare_digest refuses str with non-ASCII characters, and ``sig`` is whatever
    # the query string held.
    return hmac.compare_digest(signature(key, path, expires).encode(), sig.encode())
