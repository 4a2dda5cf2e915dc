"""Hostile documents on ``POST /rllm/runs`` and ``POST /mrp/jobs``: deep nesting, an alias
bomb and 20,000 ``uses`` are a fast 422 with a line, and ``/health`` keeps answering while
the API parses (issue 14 §2, issue 15 §1)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from api.app import create_app
from api.routes import rllm as rllm_routes
from client import mrp as mrp_client
from keel.mrp.dsl import parse_job
from keel.rllm.errors import ParseError
from keel.settings import ApiToken, Settings

# A test interrupted by its timeout is a failure, not a hung session: before the fix the
# alias bomb kept the event loop busy for minutes.
pytestmark = pytest.mark.timeout(120)

AUTH = {"Authorization": "Bearer tok-alice-0123456789"}
DEEP = "[" * 50_000 + "]" * 50_000


@pytest.fixture
async def http(settings: Settings, client: Any) -> AsyncIterator[httpx.AsyncClient]:
    token = ApiToken(token=SecretStr("tok-alice-0123456789"), actor="alice", roles=["requester"])  # type: ignore[list-item]
    app = create_app(settings.model_copy(update={"api_tokens": [token]}), client=client)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://keel.test", timeout=300
    ) as c:
        yield c


def rllm_body(text: str) -> dict[str, Any]:
    return {"path": "x.rllm", "files": {"x.rllm": text}, "input": {}}


def billion_laughs(levels: int) -> str:
    rows = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(rows)


def many_uses(n: int) -> str:
    entry = "  - {path: child_%05d.rllm, alias: child_%05d, exposes: [answer, score, notes]}\n"
    return (
        "---\n"
        'format_version: "0.1"\n'
        "name: many\n"
        "description: An app that uses a great many children.\n"
        "version: 1.0.0\n"
        "author: tests\n"
        "max_context_window: 512\n"
        "input_schema: {type: object, properties: {text: {type: string}}}\n"
        "output_schema: {type: object, properties: {answer: {type: string}}}\n"
        "llm: {provider: keel, model: local}\n"
        "llm_params: {max_tokens: 64}\n"
        "uses:\n" + "".join(entry % (i, i) for i in range(n)) + "---\n{{ text }}\n"
    )


async def while_health_polled(
    http: httpx.AsyncClient, request: Awaitable[httpx.Response]
) -> tuple[httpx.Response, int]:
    """Send ``request`` and poll ``/health`` until it is answered: (answer, health polls).

    Every poll must be answered 200. The wait for the answer is only a hang guard (the
    module's timeout is the other): before the limits the alias bomb held the loop for
    minutes.
    """
    task = asyncio.ensure_future(request)
    polls = 0
    while not task.done():
        health = await http.get("/health")
        assert health.status_code == 200
        polls += 1
    resp = await asyncio.wait_for(task, timeout=60)
    return resp, polls


async def test_nested_yaml_at_depth_50000_is_422_on_both_routes(http: httpx.AsyncClient):
    resp = await http.post(
        "/rllm/runs", json=rllm_body("---\nmetadata: " + DEEP + "\n---\nhi\n"), headers=AUTH
    )
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "RLLM_PARSE_ERROR"
    assert "nesting deeper than 64 levels" in error["message"]
    assert error["details"]["details"]["line"] == 2

    resp = await http.post("/mrp/jobs", json={"job_yaml": "a: 1\nb: " + DEEP}, headers=AUTH)
    assert resp.status_code == 422, resp.text
    error = resp.json()["error"]
    assert error["code"] == "invalid_job"
    assert "nesting deeper than 64 levels" in error["message"]
    assert error["details"][0]["line"] == 2


# attack -> (route, body, words of the refusal, the line it names). The line is where the
# parser stopped: the alias whose expansion crosses the node limit, or the frontmatter's
# first line when its size alone refuses it; nothing past that point is read or expanded.
ATTACKS: dict[str, tuple[str, Callable[[], dict[str, Any]], str, int]] = {
    "rllm alias bomb": (
        "/rllm/runs",
        lambda: rllm_body(
            "---\n" + billion_laughs(9) + '\nformat_version: "0.1"\nname: bomb\n---\nhi\n'
        ),
        "once aliases are expanded (alias *a3",
        6,
    ),
    "rllm 20,000 uses": ("/rllm/runs", lambda: rllm_body(many_uses(20_000)), "more than", 2),
    "mrp alias bomb": (
        "/mrp/jobs",
        lambda: {"job_yaml": billion_laughs(9)},
        "once aliases are expanded (alias *a4",
        6,
    ),
}


def refusal_line(resp: httpx.Response) -> int:
    details = resp.json()["error"]["details"]
    line: int = details[0]["line"] if isinstance(details, list) else details["details"]["line"]
    return line


@pytest.mark.parametrize("attack", list(ATTACKS))
async def test_hostile_documents_are_refused_fast_while_health_answers(
    http: httpx.AsyncClient, attack: str
):
    path, body, words, line = ATTACKS[attack]
    payload = body()
    resp, polls = await while_health_polled(http, http.post(path, json=payload, headers=AUTH))
    assert resp.status_code == 422, resp.text
    assert words in resp.json()["error"]["message"]
    # Refused where the count crossed the limit: nothing past that line was read or
    # expanded (tests/rllm/unit/test_parser.py counts the nodes composed and constructed).
    assert refusal_line(resp) == line
    assert polls >= 1


@pytest.mark.parametrize("route", ["rllm", "mrp"])
async def test_parsing_does_not_run_on_the_event_loop(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch, route: str
):
    """Whatever a parse costs, the loop stays free: a parser that blocks until this test
    lets it go (standing in for a long computation) must not keep ``/health`` from
    answering meanwhile. Shown by the order of events, not by latencies: were the parse
    on the loop, no ``/health`` answer could come between its start and its release, and
    the stand-in would give up waiting (after 20 s) first."""
    events: list[str] = []
    started = threading.Event()
    release = threading.Event()

    def block() -> None:
        events.append("parse started")
        started.set()
        events.append("parse released" if release.wait(timeout=20) else "parse gave up")

    def blocking_rllm(text: str, path: str | None = None) -> Any:
        block()
        raise ParseError("x.rllm:1:1: refused after a long parse")

    def blocking_mrp(text: str, source: str = "") -> Any:
        block()
        return parse_job(text, source)

    if route == "rllm":
        monkeypatch.setattr(rllm_routes, "parse_text", blocking_rllm)
        request = http.post("/rllm/runs", json=rllm_body("---\n---\n"), headers=AUTH)
    else:
        monkeypatch.setattr(mrp_client, "parse_job", blocking_mrp)
        request = http.post("/mrp/jobs", json={"job_yaml": "- 1\n"}, headers=AUTH)
    task = asyncio.ensure_future(request)
    try:
        # Hang guard only: the request reaches the parser.
        await asyncio.wait_for(asyncio.to_thread(started.wait, 30), timeout=60)
        assert started.is_set(), "the route never called the parser"
        for _ in range(5):
            health = await http.get("/health")
            assert health.status_code == 200
            events.append("health answered")
    finally:
        release.set()
    resp = await asyncio.wait_for(task, timeout=60)
    assert resp.status_code == 422, resp.text
    assert events == ["parse started", *["health answered"] * 5, "parse released"], events
