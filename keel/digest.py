"""Canonical JSON and BLAKE3 digests: the one way Keel names content."""

from __future__ import annotations

import json
from typing import Any

import blake3
from pydantic import BaseModel

DIGEST_PREFIX = "blake3:"

# What ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
# allow_nan=False)`` builds on every call, built once: the same output, without making an
# encoder per call (a few microseconds, paid per shard several times in an MRP compile).
# Stateless between calls, so threads may share it.
_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_text(value: Any) -> str:
    """:func:`canonical_json` as text (``canonical_text("a")`` is ``'"a"'``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return _CANONICAL.encode(value)


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` to canonical JSON bytes (sorted keys, no spaces, UTF-8).

    Pydantic models are dumped in JSON mode first. NaN and infinities are refused,
    since they have no canonical JSON form.
    """
    return canonical_text(value).encode("utf-8")


def digest_bytes(data: bytes) -> str:
    """``blake3:<hex>`` of raw bytes."""
    return DIGEST_PREFIX + blake3.blake3(data).hexdigest()


def digest_json(value: Any) -> str:
    """``blake3:<hex>`` of the canonical JSON form of ``value``."""
    return digest_bytes(canonical_json(value))


def is_digest(value: str) -> bool:
    hexpart = value.removeprefix(DIGEST_PREFIX)
    return (
        value.startswith(DIGEST_PREFIX)
        and len(hexpart) == 64
        and all(c in "0123456789abcdef" for c in hexpart)
    )


def checked_digest(value: str, field: str = "digest") -> str:
    """``value`` when it is a digest (:func:`is_digest`), else ``ValueError`` naming
    ``field``: the one check behind every model field that holds a digest."""
    if not is_digest(value):
        raise ValueError(f"{field} must be 'blake3:' followed by 64 lowercase hex digits")
    return value


def pack_members(members: list[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    """One pack of ``members`` (each stored once however often it is given), joined by a
    newline, and each given member's ``(offset, length)`` in it, in the order given. A
    member is found again by its place and proved by its own digest, so a pack needs no
    index of its own (``store.artifacts.ArtifactStore.get_member``)."""
    at: dict[bytes, tuple[int, int]] = {}
    parts: list[bytes] = []
    offset = 0
    for data in members:
        if data not in at:
            at[data] = (offset, len(data))
            parts.append(data)
            offset += len(data) + 1
    return b"\n".join(parts), [at[data] for data in members]
