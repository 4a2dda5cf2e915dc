"""What the family routes share, so each rule is written once: a mutating route answers
once per ``Idempotency-Key`` (:func:`answer_once`), a run it starts under a key is named
by that key (:func:`key_digest`), and a run another caller started reads as missing
(:func:`readable_or_404`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.deps import Caller, may_read_run
from api.errors import ApiError
from api.idempotency import idempotent
from keel.digest import digest_json

V = TypeVar("V")


async def answer_once(
    request: Request,
    sessions: sessionmaker[Session],
    caller: Caller,
    key: str | None,
    body: BaseModel | None,
    run: Callable[[], Awaitable[tuple[int, Any]]],
) -> JSONResponse:
    """``run``'s (status, body) as the answer to ``request``, run once per (caller, key):
    the same key again answers the stored answer (:func:`api.idempotency.idempotent`)."""
    return await idempotent(
        sessions=sessions, key=key, caller=caller, method=request.method,
        path=request.url.path, body=body, run=run,
    )  # fmt: skip


def key_digest(caller: Caller, key: str | None, *scope: str, width: int) -> str | None:
    """The name of what a request under ``key`` starts: the key scoped to the caller (and
    ``scope``), as ``width`` hex digits, so a retry after an answer that was not stored
    (a 5xx) names the same run; None without a key (the route then makes a fresh id)."""
    if not key:
        return None
    return digest_json([*scope, caller.actor, key])[7 : 7 + width]


async def readable_or_404(
    client: Client,
    caller: Caller,
    workflow_id: str,
    missing: str,
    read: Callable[[], Awaitable[V | None]],
) -> V:
    """``read()``, the view of run ``workflow_id``, when ``caller`` may read that run and it
    exists; else 404 ``missing``. Another caller's run reads as missing: a 403 would
    confirm that the id exists. Access is checked first, so a refused read costs no more."""
    if await may_read_run(client, workflow_id, caller):
        view = await read()
        if view is not None:
            return view
    raise ApiError(404, "not_found", missing)
