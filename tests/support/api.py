"""What the API tests of every family share: the callers, their tokens, an ASGI client.

The fixtures built on these (``api_settings``, ``http``) are in tests/conftest.py; a
family's conftest.py narrows them (MRP adds job roots and its own worker).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from pydantic import SecretStr

from keel.settings import ApiToken, Settings

#: The callers of the API tests and their roles.
TOKENS = {
    "alice": ["requester", "approver"],  # opens gates, approves others' gates
    "bob": ["approver"],
    "carol": ["requester"],  # a second requester: alice's gates and runs are not hers
    "dave": ["approver"],  # an approver, but not of the gates in these tests
    "erin": ["requester"],
    "root": ["admin"],
}


def token(actor: str) -> str:
    return f"tok-{actor}-0123456789"


def auth(actor: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token(actor)}"}


def with_tokens(settings: Settings, **update: Any) -> Settings:
    """``settings`` with every caller of :data:`TOKENS` (and ``update``) applied."""
    tokens = [
        ApiToken(token=SecretStr(token(a)), actor=a, roles=roles)  # type: ignore[arg-type]
        for a, roles in TOKENS.items()
    ]
    return settings.model_copy(update={"api_tokens": tokens, **update})


@asynccontextmanager
async def asgi_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client that calls ``app`` in process (no socket)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://keel.test") as c:
        yield c


def assert_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response is the API's error shape with ``code``; returns its ``error`` object."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


async def open_gate(http: httpx.AsyncClient, **body: object) -> dict[str, Any]:
    """``POST /gates`` as alice (bob approves); the created gate's JSON."""
    resp = await http.post(
        "/gates",
        json={"name": "deploy", "approvers": ["bob"], "subject": "ship it", **body},
        headers=auth("alice"),
    )
    assert resp.status_code == 201, resp.text
    return resp.json()  # type: ignore[no-any-return]


async def listed(
    http: httpx.AsyncClient,
    path: str,
    actor: str,
    *,
    every_page: bool = True,
    until: Callable[[dict[str, Any]], bool] | None = None,
    **params: Any,
) -> list[dict[str, Any]]:
    """The rows of a paged list (``GET /gates``: ``gates``, ``GET /runs``: ``runs``) for
    ``actor``: every page by default (other tests share the server: a row can be past the
    first page of a caller who reads many), else the first; with ``until``, the pages up
    to the first that holds a row it accepts (an admin's list of a busy server is long)."""
    key = path.strip("/").split("/")[-1]
    rows: list[dict[str, Any]] = []
    while True:
        resp = await http.get(path, params=params, headers=auth(actor))
        assert resp.status_code == 200, resp.text
        body = resp.json()
        rows += body[key]
        if until is not None and any(until(row) for row in body[key]):
            return rows
        if not every_page or not body.get("next_page_token"):
            return rows
        params = {**params, "page_token": body["next_page_token"]}


async def listed_gates(http: httpx.AsyncClient, actor: str, **params: Any) -> list[dict[str, Any]]:
    """Every page of ``GET /gates`` for ``actor``."""
    return await listed(http, "/gates", actor, **params)
