"""``.rllm`` apps over HTTP: start a run (``POST /rllm/runs``), read it (``GET /rllm/runs/{id}``).

A run is the ``RllmApp`` workflow, executed by the workers on the API's task queue. The
body names the app by ``path`` and either carries every file (``files``, relative path
-> text, what ``runllm`` sends) or leaves the worker to read ``path`` from its own
working directory (a relative ``.rllm`` path without ``..``). ``wait=true`` answers with
the result (or the app's error); otherwise 202 and the workflow id to poll. A run is read
back only by the caller who started it (and ``admin``); to anyone else its id is a 404.

An app's failure is answered in the API's one error shape, ``{"error": {"code",
"message", "details"}}``, with ``code`` the ``.rllm`` error code and ``details`` the whole
``RllmErrorPayload``: 422 for the app, its input or its blocks, 502 when the model never
gave a valid answer, 503 for a missing Ollama model. When the model endpoint itself failed
(down, timing out, overloaded: 503 with ``Retry-After``; refusing the key or the request:
502), ``code`` is the upstream error type (``LLMConnectionError``, ``LLMAuthError``, ...)
and ``details.upstream`` says its HTTP status and whether a retry can help. 500 is left
for anything else.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import PurePosixPath
from typing import Any

from anyio import to_thread
from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import WorkflowAlreadyStartedError

from api.deps import CallerDep, ClientDep
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.shared import RequesterPost, readable_or_404
from client.rllm import (
    RllmRunView,
    failure_payload,
    run_view,
    start_run,
    upstream_failure,
)
from keel.access import ACCESS_MEMO, access_for
from keel.rllm.errors import (
    OllamaModelMissingError,
    OutputSchemaError,
    RetryExhaustedError,
    RllmError,
    RllmErrorPayload,
)
from keel.rllm.failures import INTERNAL_ERROR_CODE
from keel.rllm.parser import parse_text
from keel.rllm.run import MAX_RETRIES_LIMIT, RllmRunInput, RllmRunResult, workflow_id_for

router = APIRouter(prefix="/rllm", tags=["rllm"], responses=ERROR_RESPONSES)


MAX_BUNDLE_BYTES = 2_000_000
# Retry-After for an unreachable model endpoint that gave no hint of its own.
UPSTREAM_RETRY_AFTER_S = 30

_STATUS_BY_CODE = {
    OutputSchemaError.error_code: 502,
    RetryExhaustedError.error_code: 502,
    OllamaModelMissingError.error_code: 503,
    INTERNAL_ERROR_CODE: 500,
}


class RllmRunBody(BaseModel):
    """Start a run of an ``.rllm`` app (the ``RllmRunInput`` fields, plus how to answer)."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, max_length=1000, examples=["summary.rllm"])
    files: dict[str, str] = Field(default_factory=dict, max_length=200)
    input: Any = Field(default=None, examples=[{"text": "Temporal keeps workflows durable."}])
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_retries: int | None = Field(default=None, ge=0, le=MAX_RETRIES_LIMIT)
    ollama_auto_pull: bool = False
    record_stats: bool = True
    wait: bool = Field(default=False, description="Answer with the result instead of 202")
    wait_timeout_s: float = Field(
        default=300, gt=0, le=3600, description="With wait: answer 202 if the run takes longer"
    )

    @field_validator("files")
    @classmethod
    def _bundle(cls, files: dict[str, str]) -> dict[str, str]:
        if sum(len(k) + len(v.encode()) for k, v in files.items()) > MAX_BUNDLE_BYTES:
            raise ValueError(f"the files bundle is larger than {MAX_BUNDLE_BYTES} bytes")
        for name in files:
            _check_relative(name)
        return files

    @model_validator(mode="after")
    def _root(self) -> RllmRunBody:
        _check_relative(self.path)
        if self.files and self.path not in self.files:
            raise ValueError(f"path {self.path!r} is not one of the files")
        return self

    def run_input(self) -> RllmRunInput:
        return RllmRunInput(
            **self.model_dump(exclude={"wait", "wait_timeout_s"}),
        )


def _check_relative(name: str) -> None:
    """Paths stay relative and inside their directory: a caller never names worker files."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts or "\\" in name or not name.endswith(".rllm"):
        raise ValueError(f"{name!r} must be a relative .rllm path without '..'")


def app_error_response(payload: RllmErrorPayload) -> tuple[int, dict[str, Any]]:
    """(status, body) of an app failure in the API's error shape."""
    status = _STATUS_BY_CODE.get(payload.error_code, 422)
    body = {
        "error": {
            "code": payload.error_code,
            "message": payload.message,
            "details": payload.model_dump(mode="json"),
        }
    }
    return status, body


def raise_for_upstream(err: BaseException, payload: RllmErrorPayload) -> None:
    """Raise 502/503 when the model endpoint ended the run: the caller can do nothing about
    it but wait (503, with ``Retry-After``) or tell the operator (502); a 500 says neither."""
    upstream = upstream_failure(err)
    if upstream is None:
        return
    details = payload.model_dump(mode="json") | {"upstream": upstream.model_dump(mode="json")}
    if not upstream.retryable:
        raise ApiError(502, upstream.error_type, payload.message, details)
    after = max(1, round(upstream.retry_after_s or UPSTREAM_RETRY_AFTER_S))
    raise ApiError(
        503, upstream.error_type, payload.message, details, headers={"Retry-After": str(after)}
    )


def _app_name(body: RllmRunBody) -> str:
    """The app's name for the workflow id: parsed from the bundle, else the file stem."""
    if body.files:
        return parse_text(body.files[body.path], path=body.path).name
    return PurePosixPath(body.path).stem


@router.post(
    "/runs",
    status_code=202,
    response_model=RllmRunView,
    responses={200: {"model": RllmRunView, "description": "wait=true: the run completed"}},
)
async def start_rllm_run(body: RllmRunBody, client: ClientDep, post: RequesterPost) -> Any:
    """Start an app run; with ``wait`` answer its result (200) or its error payload."""

    async def run() -> tuple[int, Any]:
        try:
            # Parsing is CPU work: in a thread, so every other request keeps being answered.
            name = await to_thread.run_sync(_app_name, body)
        except RllmError as e:
            return app_error_response(e.to_payload())
        wid = workflow_id_for(name, post.key_digest("rllm", width=32) or str(uuid.uuid4()))
        try:
            handle = await start_run(
                client,
                body.run_input(),
                workflow_id=wid,
                task_queue=post.settings.task_queue,
                reject_duplicate=post.key is not None,
                memo={ACCESS_MEMO: access_for(post.caller.actor)},
            )
            run_id = handle.first_execution_run_id
        except WorkflowAlreadyStartedError:
            # The same key after an answer that was not stored (a 5xx): the same run.
            handle = client.get_workflow_handle(wid, result_type=RllmRunResult)
            run_id = None
        if not body.wait:
            return 202, RllmRunView(workflow_id=wid, run_id=run_id, status="running").model_dump(
                mode="json"
            )
        try:
            result = await asyncio.wait_for(handle.result(), timeout=body.wait_timeout_s)
        except TimeoutError:
            view = RllmRunView(workflow_id=wid, run_id=run_id, status="running")
            return 202, view.model_dump(mode="json")
        except WorkflowFailureError as err:
            payload, _ = failure_payload(err, workflow_id=wid)
            if payload.error_code == INTERNAL_ERROR_CODE:
                raise_for_upstream(err, payload)
            return app_error_response(payload)
        view = RllmRunView(
            workflow_id=wid, run_id=run_id, status="completed", result=result, exit_code=0
        )
        return 200, view.model_dump(mode="json")

    return await post.answer_once(body, run)


@router.get("/runs/{workflow_id:path}", response_model=RllmRunView)
async def get_rllm_run(workflow_id: str, client: ClientDep, caller: CallerDep) -> RllmRunView:
    """A run's status; its result or error payload (with the CLI's exit code) once ended.
    404 for a run another caller started (only its owner and ``admin`` read it)."""
    return await readable_or_404(
        client, caller, workflow_id, f"no .rllm run {workflow_id!r}",
        lambda: run_view(client, workflow_id),
    )  # fmt: skip
