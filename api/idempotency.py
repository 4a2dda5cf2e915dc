"""``Idempotency-Key`` on mutating routes.

Same key and body from the same caller → the stored answer, no second effect. Same key
with another body → 422. Answers are stored unless they are server errors (5xx), which a
client should be free to retry.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from api.deps import Caller
from api.errors import ApiError
from keel.digest import digest_json
from store.records import get_idempotent, save_idempotent

REPLAY_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255

# The header as a route parameter: ``idempotency_key: IdempotencyKey = None``.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        min_length=1,
        max_length=MAX_KEY_LENGTH,
        description="Repeat-safe retries: 1-255 characters, scoped to the caller. The same "
        "key with the same body answers the stored response (header Idempotent-Replayed); "
        "with another body, 422 idempotency_key_reused.",
    ),
]


def request_id_for(caller: Caller, key: str | None) -> str:
    """The ``request_id`` a workflow dedups by: the caller's key, scoped to the caller (as
    the stored answers are), or a fresh id when there is no key."""
    if key is None:
        return str(uuid.uuid4())
    return "idem-" + digest_json([caller.actor, key])[7:39]


async def idempotent(
    *,
    sessions: sessionmaker[Session],
    key: str | None,
    caller: Caller,
    method: str,
    path: str,
    body: BaseModel | None,
    run: Callable[[], Awaitable[tuple[int, Any]]],
) -> JSONResponse:
    """Run ``run`` once per (caller, key); ``run`` returns (status, JSON-able body)."""
    if key is None:
        status, payload = await run()
        return JSONResponse(payload, status_code=status)
    if not key or len(key) > MAX_KEY_LENGTH:
        raise ApiError(422, "validation_failed", "Idempotency-Key must be 1-255 characters")
    fingerprint = digest_json(
        {"method": method, "path": path, "body": body.model_dump(mode="json") if body else None}
    )
    stored = await asyncio.to_thread(get_idempotent, sessions, key, caller.actor)
    if stored is None:
        status, payload = await run()
        if status >= 500:
            return JSONResponse(payload, status_code=status)
        stored = await asyncio.to_thread(
            save_idempotent, sessions, key, caller.actor, method, path, fingerprint, status, payload
        )
        if stored.body_digest == fingerprint:
            return JSONResponse(payload, status_code=status)
    if stored.body_digest != fingerprint:
        raise ApiError(
            422,
            "idempotency_key_reused",
            "this Idempotency-Key was used with another request",
        )
    return JSONResponse(
        stored.response_body, status_code=stored.status_code, headers={REPLAY_HEADER: "true"}
    )
