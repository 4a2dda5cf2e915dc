"""What the family routes share, so each rule is written once: a mutating route takes
its caller and ``Idempotency-Key`` as one :class:`Post` (``RequesterPost``, ...), answers
once per key (:meth:`Post.answer_once`) and names a run it starts by that key
(:meth:`Post.key_digest`); a run another caller started reads as missing
(:func:`readable_or_404`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client

from api.deps import Caller, SessionsDep, get_caller, may_read_run, require_role
from api.errors import ApiError
from api.idempotency import IdempotencyKey, idempotent
from keel.digest import digest_json
from keel.settings import Settings

V = TypeVar("V")


@dataclass(frozen=True)
class Post:
    """A mutating request as its route needs it: the caller, the ``Idempotency-Key`` it is
    answered once by, and the app (its settings, its SQL store of answers)."""

    request: Request
    sessions: sessionmaker[Session]
    caller: Caller
    key: str | None

    @property
    def settings(self) -> Settings:
        settings: Settings = self.request.app.state.settings
        return settings

    async def answer_once(
        self, body: BaseModel | None, run: Callable[[], Awaitable[tuple[int, Any]]]
    ) -> JSONResponse:
        """``run``'s (status, body) as the answer, run once per (caller, key): the same key
        again answers the stored answer (:func:`api.idempotency.idempotent`)."""
        return await idempotent(
            sessions=self.sessions, key=self.key, caller=self.caller,
            method=self.request.method, path=self.request.url.path, body=body, run=run,
        )  # fmt: skip

    def key_digest(self, *scope: str, width: int) -> str | None:
        """The name of what this request starts: its key scoped to the caller (and
        ``scope``), as ``width`` hex digits, so a retry after an answer that was not stored
        (a 5xx) names the same run; None without a key (the route makes a fresh id)."""
        if not self.key:
            return None
        return digest_json([*scope, self.caller.actor, self.key])[7 : 7 + width]


def _post_as(who: Callable[..., Awaitable[Caller]]) -> Callable[..., Awaitable[Post]]:
    """The dependency of a :class:`Post` whose caller ``who`` lets through."""

    async def post(
        request: Request,
        sessions: SessionsDep,
        caller: Caller = Depends(who),
        idempotency_key: IdempotencyKey = None,
    ) -> Post:
        return Post(request, sessions, caller, idempotency_key)

    return post


#: A POST by a caller with the ``requester`` role / the ``approver`` role / any caller.
RequesterPost = Annotated[Post, Depends(_post_as(require_role("requester")))]
ApproverPost = Annotated[Post, Depends(_post_as(require_role("approver")))]
CallerPost = Annotated[Post, Depends(_post_as(get_caller))]


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
