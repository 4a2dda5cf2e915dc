"""Client side of the ``RllmApp`` workflow, shared by ``runllm`` and ``POST /rllm/runs``.

Starting a run by type name (no workflow import on the client), reading a finished
run's failure back as an :class:`~keel.rllm.errors.RllmErrorPayload` with its exit code,
and the run's status as one :class:`RllmRunView`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import (
    ApplicationError,
    CancelledError,
    TerminatedError,
    TimeoutError,
)

from client.temporal import RunStatus, cause_chain, describe_or_none, start_by_type, status_name
from client.waiting import LocalServicesLike, wait_watching, watch_services
from keel.llm import ModelsConfig, ModelsConfigError
from keel.rllm.deps import ResolvedApp
from keel.rllm.errors import EXIT_CODES, RllmErrorPayload, error_from_payload
from keel.rllm.estimate import prompt_tokens_for
from keel.rllm.failures import RunnerFailure, internal_failure
from keel.rllm.ollama import OLLAMA_ENSURE, OllamaProgress
from keel.rllm.run import (
    WORKFLOW_TYPE,
    RllmRunInput,
    RllmRunResult,
    resolve_model_name,
    workflow_id_for,
)
from keel.settings import Settings
from store.files import bundle_files, load_models_config
from store.rllm_stats import get_stats, predict_exectime


class RllmRunView(BaseModel):
    """A run as clients see it: status, and the result or the error payload once it ended."""

    workflow_id: str
    run_id: str | None = None
    status: RunStatus
    result: RllmRunResult | None = None
    error: RllmErrorPayload | None = None
    exit_code: int | None = None


async def start_run(
    client: Client,
    inp: RllmRunInput,
    *,
    workflow_id: str,
    task_queue: str,
    timeout: timedelta | None = None,
    reject_duplicate: bool = False,
    memo: dict[str, Any] | None = None,
) -> WorkflowHandle[Any, RllmRunResult]:
    """Start ``RllmApp`` (by type name: no workflow code is imported on the client)."""
    return await start_by_type(
        client,
        WORKFLOW_TYPE,
        inp,
        workflow_id=workflow_id,
        task_queue=task_queue,
        result_type=RllmRunResult,
        execution_timeout=timeout,
        reject_duplicate=reject_duplicate,
        memo=memo,
    )


# Error types of the LLM activities (activities/llm.py ``classify``) that say the model
# endpoint failed: unreachable or overloaded (retry later), or refusing the request.
UPSTREAM_UNAVAILABLE_TYPES = frozenset(
    {"LLMConnectionError", "LLMTimeout", "LLMServerError", "LLMRateLimited", "LLMConflict"}
)
UPSTREAM_REFUSED_TYPES = frozenset({"LLMAuthError", "LLMBadRequest", "LLMError"})


class UpstreamFailure(BaseModel):
    """A run that failed because the model endpoint did (not the app, not Keel)."""

    error_type: str
    retryable: bool
    status_code: int | None = None
    retry_after_s: float | None = None


def upstream_failure(err: BaseException) -> UpstreamFailure | None:
    """The model endpoint's failure that ended a run, or None when something else did."""
    for e in cause_chain(err):
        if not isinstance(e, ApplicationError):
            continue
        kind = e.type or ""
        if kind not in UPSTREAM_UNAVAILABLE_TYPES and kind not in UPSTREAM_REFUSED_TYPES:
            continue
        info = e.details[0] if e.details and isinstance(e.details[0], dict) else {}
        status = info.get("status_code")
        after = info.get("retry_after_s")
        return UpstreamFailure(
            error_type=kind,
            retryable=kind in UPSTREAM_UNAVAILABLE_TYPES,
            status_code=status if isinstance(status, int) else None,
            retry_after_s=float(after) if isinstance(after, int | float) else None,
        )
    return None


def failure_payload(err: BaseException, *, workflow_id: str = "") -> tuple[RllmErrorPayload, int]:
    """The payload and exit code of a failed run (``WorkflowFailureError`` or its causes).

    The workflow (and each child) fails with ``ApplicationError(..., payload, type=...)``;
    the first such error in the cause chain whose detail is an ``.rllm`` payload wins.
    Anything else (a model server that kept failing, a termination, a timeout) becomes
    an internal failure naming the chain.
    """
    chain = cause_chain(err)
    for e in chain:
        if isinstance(e, ApplicationError) and e.details:
            first = e.details[0]
            if isinstance(first, dict) and str(first.get("error_code", "")).startswith("RLLM_"):
                try:
                    rebuilt = error_from_payload(first)
                except ValueError:
                    continue
                return RllmErrorPayload.model_validate(first), EXIT_CODES[type(rebuilt)]
    causes = [
        {
            "type": (e.type if isinstance(e, ApplicationError) and e.type else type(e).__name__),
            "message": str(e),
        }
        for e in chain
        if not isinstance(e, WorkflowFailureError)
    ]
    last = chain[-1]
    kind = "RunFailed"
    if any(isinstance(e, TerminatedError) for e in chain):
        kind = "RunTerminated"
    elif any(isinstance(e, CancelledError) for e in chain):
        kind = "RunCanceled"
    elif any(isinstance(e, TimeoutError) for e in chain):
        kind = "RunTimedOut"
    failure = internal_failure(
        f"the run {workflow_id} failed outside the app: {causes[-1]['type'] if causes else type(last).__name__}: {last}",
        error_type=kind,
        details={"workflow_id": workflow_id, "causes": causes},
        hint="Read details.causes (innermost last) and the worker's log; model server "
        "errors are retried by Temporal before they end a run.",
    )
    return failure.payload, failure.exit_code


async def run_view(client: Client, workflow_id: str) -> RllmRunView | None:
    """The run's status and outcome; None when there is no ``RllmApp`` run with that id."""
    desc = await describe_or_none(client, workflow_id, WORKFLOW_TYPE)
    if desc is None:
        return None
    handle = client.get_workflow_handle(workflow_id, result_type=RllmRunResult)
    status = status_name(desc)
    view = RllmRunView(workflow_id=workflow_id, run_id=desc.run_id, status=status)
    if status == "running":
        return view
    try:
        view.result = await handle.result()
        view.exit_code = 0
    except WorkflowFailureError as err:
        view.error, view.exit_code = failure_payload(err, workflow_id=workflow_id)
    return view


# -- what ``runllm validate``, ``stats`` and ``exectime`` compute -----------------------


def models_config(settings: Settings) -> ModelsConfig:
    """The models config (``KEEL_MODELS_CONFIG``); a broken one is an internal failure
    naming the file to fix."""
    try:
        return load_models_config(settings.models_config)
    except ModelsConfigError as e:
        raise internal_failure(
            str(e),
            error_type="ModelsConfigError",
            hint="Fix the models config (KEEL_MODELS_CONFIG, default configs/models.yaml).",
        ) from None


def model_names(
    resolved: ResolvedApp, models: ModelsConfig, override: str | None
) -> dict[str, str]:
    """The model each app that calls one would use (``override``: ``--model``), by key."""
    return {
        key: resolve_model_name(p.llm, override, models)
        for key, p in resolved.programs.items()
        if p.needs_llm
    }


def app_stats(
    sessions: sessionmaker[Session], resolved: ResolvedApp, model: str | None
) -> list[dict[str, Any]]:
    """The recorded statistics of an app and every app it uses, root first: one
    ``{"key", "app", "version", "stats"}`` each (``model``: only that model's rows)."""
    apps: list[dict[str, Any]] = []
    for key in reversed(resolved.graph.order()):  # root first
        p = resolved.programs[key]
        rows = get_stats(sessions, p.name, model)
        apps.append(
            {
                "key": key,
                "app": p.name,
                "version": p.version,
                "stats": [s.model_dump(mode="json") for s in rows],
            }
        )
    return apps


def predicted_exectime(
    sessions: sessionmaker[Session],
    resolved: ResolvedApp,
    models: ModelsConfig,
    *,
    model: str | None,
    value: dict[str, Any] | None,
) -> dict[str, Any]:
    """A run's predicted wall time from recorded stats, summed over the apps it uses, and
    the prompt tokens estimated for the checked input ``value`` (None without one)."""
    tokens = prompt_tokens_for(resolved.root, value) if value is not None else None
    pred = predict_exectime(sessions, resolved, models, model=model, prompt_tokens=tokens)
    return {**pred.model_dump(mode="json"), "prompt_tokens": tokens}


# -- a run started from this machine (``runllm run``) -----------------------------------

Tick = Callable[[], Awaitable[None]]


def _pull_lines(client: Client, workflow_id: str, say: Callable[[str], None]) -> Tick:
    """A tick that says each new line of the run's model pull (the Ollama ensure
    activity's heartbeat), once."""
    handle = client.get_workflow_handle(workflow_id)
    last = ""

    async def pull_progress() -> None:
        nonlocal last
        desc = await handle.describe()
        for pa in desc.raw_description.pending_activities:
            if pa.activity_type.name != OLLAMA_ENSURE.name:
                continue
            if not pa.heartbeat_details.payloads:
                continue
            [raw] = await client.data_converter.decode(pa.heartbeat_details.payloads, [dict])
            line = OllamaProgress.model_validate(raw).line()
            if line != last:
                say(line)
                last = line

    return pull_progress


async def _watch(
    client: Client,
    workflow_id: str,
    services: LocalServicesLike,
    on_pull: Callable[[str], None] | None,
) -> None:
    """Runs beside the result wait: starts a worker when none picks the run up, fails when
    a service we started dies, says pulls.

    The worker check runs here rather than before the wait: with a worker up, the result
    usually arrives before the check's first describe would have, so a run pays nothing
    for it (bench/cli_latency.py).
    """
    await services.ensure_worker(workflow_id, "runllm-worker.log")
    tick = _pull_lines(client, workflow_id, on_pull) if on_pull is not None else None
    await watch_services(
        services,
        on_dead=lambda why: internal_failure(why, error_type="WorkerExited"),
        tick=tick,
    )


def run_input(
    file: Path,
    value: Any,
    *,
    model: str | None,
    max_retries: int | None,
    auto_pull: bool,
) -> RllmRunInput:
    """The ``RllmApp`` input of the app file ``file`` and everything it uses (read from
    disk and bundled) on input ``value``."""
    return RllmRunInput(
        path=file.name,
        files=bundle_files(file),
        input=value,
        model=model,
        max_retries=max_retries,
        ollama_auto_pull=auto_pull,
    )


async def run_and_wait(
    services: LocalServicesLike,
    connect: Callable[[], Awaitable[Client]],
    inp: RllmRunInput,
    *,
    app_name: str,
    task_queue: str,
    timeout_s: float | None,
    keep: bool,
    on_started: Callable[[str], None],
    on_pull: Callable[[str], None] | None,
) -> tuple[str, RllmRunResult]:
    """Start ``RllmApp`` for app ``app_name`` (``connect``: to the server ``services``
    runs or starts; a worker on demand) and wait for its result: ``(workflow id,
    result)``. ``on_started(workflow_id)`` once it is started; ``on_pull(line)`` for each
    new line of a model pull (None: not watched). ``services`` are stopped at the end,
    left running with ``keep``.

    Raises:
        keel.rllm.failures.RunnerFailure: the run failed (its payload and exit code), or a
            service ``services`` started died (``WorkerExited``).
    """
    try:
        client = await connect()
        wid = workflow_id_for(app_name, str(uuid.uuid4()))
        handle = await start_run(
            client,
            inp,
            workflow_id=wid,
            task_queue=task_queue,
            timeout=timedelta(seconds=timeout_s) if timeout_s else None,
        )
        on_started(wid)
        try:
            return wid, await wait_watching(handle.result(), _watch(client, wid, services, on_pull))
        except WorkflowFailureError as err:
            payload, code = failure_payload(err, workflow_id=wid)
            raise RunnerFailure(payload, code) from None
    finally:
        await asyncio.to_thread(services.stop, keep)
