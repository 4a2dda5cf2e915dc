"""One error shape for every API failure: ``{"error": {"code", "message", ...}}``."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from temporalio.service import RPCError, RPCStatusCode

from keel.gates import GateRefusal

log = logging.getLogger(__name__)


class ErrorBody(BaseModel):
    code: str
    message: str
    details: Any = None
    # Plan §22.4: the run and node an error is about, where a route knows them (left out
    # of the body otherwise).
    run_id: str | None = None
    node_name: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


@dataclass(eq=False)
class ApiError(Exception):
    """An error the API answers with ``status`` and a stable ``code`` (its body:
    :func:`error_response`)."""

    status: int
    code: str
    message: str
    details: Any = None
    headers: dict[str, str] | None = None
    run_id: str | None = field(default=None, kw_only=True)
    node_name: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__init__(self.message)


#: A gate's refusal codes (keel.gates.check_decision) as HTTP statuses.
GATE_REFUSAL_STATUS = {"gate_closed": 409, "self_approval": 403, "not_an_approver": 403}


def refusal_error(
    err: GateRefusal, *, run_id: str | None = None, node_name: str | None = None
) -> ApiError:
    """The answer to a gate's refusal, from the /gates routes and the design routes alike."""
    status = GATE_REFUSAL_STATUS.get(err.code, 409)
    return ApiError(status, err.code, err.message, run_id=run_id, node_name=node_name)


def error_response(err: ApiError) -> JSONResponse:
    """``err`` as the API answers it: its status and headers, and the one error shape (a
    ``run_id`` or ``node_name`` it does not know is left out of the body)."""
    error = ErrorBody(
        code=err.code,
        message=err.message,
        details=err.details,
        run_id=err.run_id,
        node_name=err.node_name,
    )
    content = ErrorResponse(error=error).model_dump(mode="json")
    for key in ("run_id", "node_name"):
        if content["error"][key] is None:
            del content["error"][key]
    return JSONResponse(content, status_code=err.status, headers=err.headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    415: "unsupported_media_type",
    422: "validation_failed",
    429: "rate_limited",
}

# Documented on every route so generated clients know the error shape.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": code}
    for status, code in _HTTP_CODES.items()
    if status in (401, 403, 404, 409, 422)
}
ERROR_RESPONSES[400] = {
    "model": ErrorResponse,
    "description": "bad_request: the body is not JSON (or not UTF-8); a body that is JSON "
    "but breaks the schema is 422 validation_failed",
}


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        headers = dict(exc.headers or {})
        return error_response(ApiError(exc.status_code, code, str(exc.detail), headers=headers))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in exc.errors()
        ]
        if any(d["type"] == "json_invalid" for d in details):
            # Not JSON at all is a malformed request, not a schema mismatch.
            return error_response(
                ApiError(400, "bad_request", "the request body is not JSON", details)
            )
        return error_response(ApiError(422, "validation_failed", "request is not valid", details))

    @app.exception_handler(RPCError)
    async def _temporal_error(_: Request, exc: RPCError) -> JSONResponse:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            unavailable = "the Temporal server did not answer"
            retry = {"Retry-After": "5"}
            return error_response(ApiError(503, "temporal_unavailable", unavailable, headers=retry))
        log.error("Temporal RPC error %s: %s", exc.status.name, exc.message)
        return error_response(
            ApiError(502, "temporal_error", f"Temporal answered {exc.status.name}")
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled API error")
        return error_response(ApiError(500, "internal", f"internal error ({type(exc).__name__})"))
