"""``GET /runs``, the inbox's fields of ``GET /gates``, and the console's files at ``/ui``:
the API in process over the session's dev server and a real worker."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import httpx

from keel.settings import Settings
from services.up import ui_link
from tests.srl.conftest import HAND_TASKS
from tests.support.api import assert_error, auth, listed, listed_gates, open_gate


async def _until(check: Callable[[], Awaitable[Any]], timeout_s: float = 30) -> Any:
    """Poll ``check`` until it returns something truthy: visibility lags the start."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.3)


async def _runs(
    http: httpx.AsyncClient, actor: str, *, every_page: bool = False, **params: Any
) -> list[dict[str, Any]]:
    """One page of ``GET /runs``, or with ``every_page`` all of them."""
    return await listed(http, "/runs", actor, every_page=every_page, **params)


def _row(runs: list[dict[str, Any]], workflow_id: str) -> dict[str, Any] | None:
    return next((r for r in runs if r["workflow_id"] == workflow_id), None)


async def test_runs_lists_a_collection_to_those_who_may_read_it(
    http: httpx.AsyncClient, api_settings: Settings
) -> None:
    assert_error(await http.get("/runs"), 401, "unauthorized")
    collection = f"runs-{uuid.uuid4().hex[:8]}"
    resp = await http.post(
        "/srl/collections",
        json={"collection": collection, "tasks": HAND_TASKS[:2], "window": 2},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    wid = resp.json()["workflow_id"]

    def ours(run: dict[str, Any]) -> bool:
        return bool(run["workflow_id"] == wid)

    async def done() -> dict[str, Any] | None:
        row = _row(await listed(http, "/runs", "alice", limit=100, until=ours), wid)
        return row if row and row["status"] == "completed" else None

    row = await _until(done, 60)
    assert row is not None, "the collection never showed as completed"
    assert row["family"] == "srl" and row["workflow_type"] == "SRLCollection"
    assert row["ui_url"] == ui_link(api_settings, wid)
    assert row["started_at"] and row["closed_at"] and row["progress"] is None

    # Another requester does not see it, admin does; a family filter leaves it out.
    assert _row(await _runs(http, "carol", limit=100, every_page=True), wid) is None
    # The admin reads every run of the session's server: the pages up to this one.
    assert _row(await listed(http, "/runs", "root", limit=100, until=ours), wid) is not None
    assert _row(await _runs(http, "alice", limit=100, family="mrp", every_page=True), wid) is None
    assert (
        _row(
            await listed(http, "/runs", "alice", limit=100, family=["srl", "mrp"], until=ours), wid
        )
        is not None
    )

    # The page size is bounded.
    assert_error(
        await http.get("/runs", params={"limit": 101}, headers=auth("alice")),
        422,
        "validation_failed",
    )
    assert len(await _runs(http, "root", limit=1)) == 1


async def test_pending_gates_carry_what_the_inbox_shows(http: httpx.AsyncClient) -> None:
    parent = f"console/{uuid.uuid4().hex[:8]}"
    gate = await open_gate(http, parent_id=parent, expires_in_s=3600)

    async def listed() -> dict[str, Any] | None:
        rows = await listed_gates(http, "bob")
        return next((g for g in rows if g["gate_id"] == gate["gate_id"]), None)

    row = await _until(listed)
    assert row is not None, "the gate never showed in bob's list"
    assert row["parent_id"] == parent and row["name"] == "deploy"
    assert row["requester"] == "alice" and row["subject"] == "ship it"
    assert row["approvers"] == ["bob"]
    expires = datetime.fromisoformat(row["expires_at"])
    started = datetime.fromisoformat(row["started_at"])
    assert expires - started == timedelta(seconds=3600)
    # The gate's own clock starts at its first workflow task, after the workflow's start
    # (how long after depends on the worker's load: an order, not a bound).
    assert expires <= datetime.fromisoformat(gate["expires_at"])


async def test_console_files_are_served_with_a_strict_policy(http: httpx.AsyncClient) -> None:
    page = await http.get("/ui")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert '<script src="/ui/assets/console.js"' in page.text
    script = await http.get("/ui/assets/console.js")
    assert script.status_code == 200
    assert script.headers["content-type"].startswith("text/javascript")
    # The token goes in a header, never in an address: its field has no name, so even a
    # form submitted without the script carries no token (and the policy forbids it).
    assert '"Bearer " + token' in script.text
    assert '<input type="password" id="token-input" spellcheck="false"' in page.text
    assert "form-action 'none'" in csp
    assert (await http.get("/ui/assets/console.css")).status_code == 200
    assert_error(await http.get("/ui/assets/other.js"), 404, "not_found")
