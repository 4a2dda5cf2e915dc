"""api/errors.py: every failure a route can end in answers the one error shape, with the
status, code and headers of its kind (an ``ApiError``, an HTTP error, a body that is not
JSON or breaks the schema, Temporal down or refusing, anything else)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel
from temporalio.service import RPCError, RPCStatusCode

from api.errors import ApiError, install_error_handlers


class _Body(BaseModel):
    n: int


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/api-error")
    async def api_error() -> None:
        raise ApiError(409, "conflict", "taken", {"a": 1}, {"X-Why": "1"}, run_id="r1")

    @app.post("/body")
    async def body(b: _Body) -> int:
        return b.n

    @app.get("/temporal/{status}")
    async def temporal(status: str) -> None:
        raise RPCError("no", RPCStatusCode[status], b"")

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret detail")

    return app


async def _call(method: str, path: str, **kw: Any) -> httpx.Response:
    # raise_app_exceptions=False: Starlette answers an unhandled error, then re-raises it.
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://keel.test") as c:
        return await c.request(method, path, **kw)


async def test_an_api_error_keeps_its_status_headers_details_and_run() -> None:
    resp = await _call("GET", "/api-error")
    assert resp.status_code == 409
    assert resp.headers["X-Why"] == "1"
    assert resp.json() == {
        "error": {"code": "conflict", "message": "taken", "details": {"a": 1}, "run_id": "r1"}
    }


async def test_http_errors_and_bodies() -> None:
    missing = await _call("GET", "/nowhere")
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {"code": "not_found", "message": "Not Found", "details": None}
    }
    wrong_method = await _call("DELETE", "/boom")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"
    assert wrong_method.headers["Allow"] == "GET"
    not_json = await _call(
        "POST", "/body", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert not_json.status_code == 400
    assert not_json.json()["error"]["code"] == "bad_request"
    assert not_json.json()["error"]["message"] == "the request body is not JSON"
    bad = await _call("POST", "/body", json={"n": "x"})
    assert bad.status_code == 422
    error = bad.json()["error"]
    assert (error["code"], error["message"]) == ("validation_failed", "request is not valid")
    assert error["details"][0]["loc"] == ["body", "n"]
    assert set(error) == {"code", "message", "details"}


@pytest.mark.parametrize("status", ["UNAVAILABLE", "DEADLINE_EXCEEDED"])
async def test_temporal_down_is_503_with_retry_after(status: str) -> None:
    resp = await _call("GET", f"/temporal/{status}")
    assert resp.status_code == 503
    assert resp.headers["Retry-After"] == "5"
    assert resp.json() == {
        "error": {
            "code": "temporal_unavailable",
            "message": "the Temporal server did not answer",
            "details": None,
        }
    }


async def test_temporal_refusing_is_502_and_anything_else_500() -> None:
    refused = await _call("GET", "/temporal/PERMISSION_DENIED")
    assert refused.status_code == 502
    assert refused.json()["error"] == {
        "code": "temporal_error",
        "message": "Temporal answered PERMISSION_DENIED",
        "details": None,
    }
    boom = await _call("GET", "/boom")
    assert boom.status_code == 500
    assert boom.json()["error"] == {
        "code": "internal",
        "message": "internal error (RuntimeError)",
        "details": None,
    }
