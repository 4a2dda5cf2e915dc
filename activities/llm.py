"""The LLM gateway activity: every model call in Keel goes through ``llm.complete``.

LiteLLM does the provider work with its own retries off; Temporal owns retries. Failures
become ``ApplicationError`` with a stable ``type`` and the retryability of their HTTP
status (see docs/llm.md). Each call, good or bad, is recorded: an ``LLMCallLog`` through
the injected ``on_call`` callback, and Temporal metrics through ``activity.metric_meter()``.

API keys come from the environment variable a model's ``api_key_env`` names, read at call
time; their values are replaced by ``***`` in every message, detail and log line we emit.
"""

from __future__ import annotations

import os

# LiteLLM fetches its price table from the network at import unless told otherwise; this
# must be set before the first ``import litellm`` anywhere in the process.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal

from temporalio import activity
from temporalio.common import MetricMeter
from temporalio.exceptions import ApplicationError

from keel.llm import (
    LLMRequest,
    LLMResponse,
    LLMUsage,
    ModelNotAllowedError,
    ModelsConfig,
    ModelSpec,
    StructuredOutputForm,
    UnknownModelError,
    response_format,
)
from keel.records import LLMCallLog
from keel.refs import LLM_COMPLETE
from keel.retry import is_retryable_status, parse_retry_after

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

OnCall = Callable[[LLMCallLog], Awaitable[None]]

# Stable ApplicationError types. Workflows and retry policies match on these strings.
LLM_RATE_LIMITED = "LLMRateLimited"
LLM_BAD_REQUEST = "LLMBadRequest"
LLM_CONTEXT_WINDOW = "LLMContextWindowExceeded"
LLM_AUTH_ERROR = "LLMAuthError"
LLM_CONFLICT = "LLMConflict"
LLM_SERVER_ERROR = "LLMServerError"
LLM_TIMEOUT = "LLMTimeout"
LLM_CONNECTION_ERROR = "LLMConnectionError"
LLM_UNKNOWN_MODEL = "LLMUnknownModel"
LLM_MODEL_NOT_ALLOWED = "LLMModelNotAllowed"
LLM_CONFIG_ERROR = "LLMConfigError"
LLM_ERROR = "LLMError"

# Sent when a model has an api_base but no api_key_env: the OpenAI client refuses to run
# without some key, and unauthenticated local servers ignore it.
NO_KEY_PLACEHOLDER = "no-key"

_MAX_MESSAGE_CHARS = 2000
_LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class _SecretScrubber(logging.Filter):
    """Replaces known secret values with ``***`` in log records and strings."""

    def __init__(self) -> None:
        super().__init__()
        self._secrets: set[str] = set()
        self._lock = threading.Lock()

    def add(self, secret: str) -> None:
        # Very short values would blank out ordinary words; no real key is that short.
        if len(secret) >= 4:
            with self._lock:
                self._secrets.add(secret)

    def scrub(self, text: str, extra: str | None = None) -> str:
        with self._lock:
            secrets = set(self._secrets)
        if extra and len(extra) >= 4:
            secrets.add(extra)
        # Longest first, so a key that contains another is replaced whole.
        for s in sorted(secrets, key=len, reverse=True):
            text = text.replace(s, "***")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets:
            try:
                record.msg = self.scrub(record.getMessage())
                record.args = None
            except Exception:
                pass  # a record that cannot format is left for logging to report
        return True


_scrubber = _SecretScrubber()
_litellm_lock = threading.Lock()
_loaded: ModuleType | None = None


def load_litellm() -> ModuleType:
    """Import and configure LiteLLM once per process.

    The import takes seconds, so it happens here, on the first call or when a worker
    calls this at start, never on a CLI's start-up path.
    """
    global _loaded
    with _litellm_lock:
        import litellm

        if not getattr(litellm, "_keel_configured", False):
            # No stdout banners, no prompts in LiteLLM's logs or exception texts.
            litellm.suppress_debug_info = True
            litellm.set_verbose = False
            litellm.turn_off_message_logging = True
            litellm.redact_messages_in_exceptions = True
            for name in _LITELLM_LOGGERS:
                logging.getLogger(name).addFilter(_scrubber)
            litellm._keel_configured = True
        _loaded = litellm
        return litellm


async def load_litellm_async() -> ModuleType:
    """:func:`load_litellm` off the event loop: a first import inside an activity must not
    stall the worker's other activities and heartbeats for seconds."""
    if _loaded is not None:
        return _loaded
    return await asyncio.to_thread(load_litellm)


def _headers_of(exc: BaseException) -> Mapping[str, str]:
    """Response headers of a failed call, lower-cased; LiteLLM keeps them in one of three places."""
    candidates = (
        getattr(exc, "litellm_response_headers", None),
        getattr(getattr(exc, "response", None), "headers", None),
        getattr(exc, "headers", None),
    )
    for h in candidates:
        if h:
            try:
                return {str(k).lower(): str(v) for k, v in h.items()}
            except AttributeError:
                continue
    return {}


def _retry_after(headers: Mapping[str, str]) -> float | None:
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    return parse_retry_after(headers.get("retry-after"), now=datetime.now(UTC))


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes, outermost first."""
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and len(seen) < 16 and all(cur is not s for s in seen):
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _transport_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(timeout classes, connection classes) of the clients under LiteLLM."""
    import httpx
    import openai

    timeouts: list[type[BaseException]] = [
        openai.APITimeoutError,
        httpx.TimeoutException,
        TimeoutError,
    ]
    connections: list[type[BaseException]] = [
        openai.APIConnectionError,
        httpx.TransportError,
        ConnectionError,
    ]
    try:
        import aiohttp

        timeouts.append(aiohttp.ServerTimeoutError)
        connections.append(aiohttp.ClientConnectionError)
    except ImportError:
        pass
    return tuple(timeouts), tuple(connections)


def classify(exc: BaseException) -> tuple[str, bool, int | None]:
    """Map a LiteLLM/OpenAI/httpx exception to ``(error type, retryable, HTTP status)``.

    By exception class and status code only: provider messages change without notice.
    """
    litellm = load_litellm()
    timeouts, connections = _transport_classes()
    # LiteLLM re-raises a refused connection as InternalServerError (status 500); the
    # transport error is still in the cause chain and decides. Timeouts first:
    # APITimeoutError subclasses APIConnectionError.
    for link in _chain(exc):
        if isinstance(link, timeouts):
            return LLM_TIMEOUT, True, None
        if isinstance(link, connections):
            return LLM_CONNECTION_ERROR, True, None
    status = getattr(exc, "status_code", None)
    if not isinstance(status, int):
        return LLM_ERROR, True, None
    if isinstance(exc, litellm.ContextWindowExceededError):
        return LLM_CONTEXT_WINDOW, False, status
    if status in (401, 403):
        return LLM_AUTH_ERROR, False, status
    if status == 429:
        return LLM_RATE_LIMITED, True, status
    if status == 408:
        return LLM_TIMEOUT, True, status
    if status == 409:
        return LLM_CONFLICT, True, status
    if status >= 500:
        return LLM_SERVER_ERROR, True, status
    if 400 <= status < 500:
        return LLM_BAD_REQUEST, is_retryable_status(status), status
    return LLM_ERROR, True, status


def _provider(spec: ModelSpec | None) -> str:
    if spec is None:
        return ""
    if spec.provider:
        return spec.provider
    # A bare model name ("gpt-4o"): LiteLLM infers the provider from its model list.
    try:
        return str(load_litellm().get_llm_provider(spec.litellm_model)[1])
    except Exception:
        return ""


# Environment variable names whose values are scrubbed when LiteLLM reads a provider's
# key itself (OPENAI_API_KEY, ANTHROPIC_AUTH_TOKEN, AWS_SECRET_ACCESS_KEY, ...).
_KEY_LIKE = ("_KEY", "_TOKEN", "_SECRET")

# Names LiteLLM lists as "missing" that are endpoints or versions, not keys: a provider
# with a default endpoint (Ollama's localhost) runs without them.
_NOT_KEYS = ("_API_BASE", "_BASE_URL", "_URL", "_API_VERSION")


def missing_key_vars(litellm_model: str) -> list[str]:
    """The environment variables LiteLLM reads the key of ``litellm_model``'s provider from
    and that are not set on this worker (``OPENAI_API_KEY``...; several where the provider
    takes any of them), from ``litellm.validate_environment``."""
    try:
        found = load_litellm().validate_environment(model=litellm_model)
    except Exception:
        return []
    return [
        str(k) for k in found.get("missing_keys") or [] if not str(k).upper().endswith(_NOT_KEYS)
    ]


def qualify_model(name: str) -> str | None:
    """``provider/model`` for a bare model name LiteLLM knows (``gpt-4o`` is
    ``openai/gpt-4o``), or None: only names in LiteLLM's model table, so a typo is an
    unknown model rather than a call to a guessed provider."""
    litellm = load_litellm()
    if name not in litellm.model_cost:
        return None
    try:
        model, provider, _, _ = litellm.get_llm_provider(name)
    except Exception:
        return None
    return f"{provider}/{model}" if provider else None


class LLMGateway:
    """Holds the models config and the call recorder; exposes the ``llm.complete`` activity.

    Args:
        models: the loaded models config.
        on_call: awaited with an ``LLMCallLog`` after every call, success or failure. Its
            own failures are logged and do not fail the call: a lost log row is cheaper
            than paying for the model call again.
    """

    def __init__(self, models: ModelsConfig, on_call: OnCall | None = None) -> None:
        self.models = models
        self.on_call = on_call

    def resolve(self, name: str = "") -> tuple[str, ModelSpec]:
        """``(name, spec)`` of a configured name, a LiteLLM model string or a bare model
        name LiteLLM knows (``gpt-4o``), as :meth:`ModelsConfig.resolve` with the allow
        list enforced. An unconfigured string gets the structured-output form LiteLLM
        knows its model to take (``json_schema`` where ``supports_response_schema``).

        Raises:
            ModelNotAllowedError: the config's ``allow`` list does not match the string.
            UnknownModelError: neither configured nor a model string of a provider
                LiteLLM knows.
        """
        name = name or self.models.default
        if name not in self.models.models and "/" not in name:
            name = qualify_model(name) or name
        model_name, spec = self.models.resolve(name)
        if self.models.is_configured(model_name):
            return model_name, spec
        litellm = load_litellm()
        try:
            model, provider, _, _ = litellm.get_llm_provider(spec.litellm_model)
        except Exception:
            raise UnknownModelError(
                f"unknown model {name!r}: LiteLLM knows no provider {spec.provider!r} "
                f"(configured models: {', '.join(sorted(self.models.models))})"
            ) from None
        try:
            schema = bool(
                litellm.supports_response_schema(model=model, custom_llm_provider=provider)
            )
        except Exception:
            schema = False
        return model_name, spec.model_copy(
            update={"structured_output": "json_schema" if schema else "none"}
        )

    @activity.defn(name=LLM_COMPLETE.name)
    async def complete(self, req: LLMRequest) -> LLMResponse:
        """Call the model named in ``req`` (or the default) once and return its reply.

        Raises:
            ApplicationError: with a ``type`` from this module's ``LLM_*`` constants;
                retryable or not as docs/llm.md tables; ``next_retry_delay`` follows the
                server's ``Retry-After``.
        """
        info = activity.info()
        return await self.call(
            req,
            call_key=f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}",
            workflow_id=info.workflow_id,
            meter=activity.metric_meter(),
        )

    async def call(
        self, req: LLMRequest, *, call_key: str, workflow_id: str | None, meter: MetricMeter | None
    ) -> LLMResponse:
        """One model call from async code, recorded (:meth:`record`) whether it succeeds or
        fails. ``call_key`` names the call in ``llm_calls`` (a second record under the same
        key is ignored); ``meter`` receives the ``keel_llm_*`` metrics.

        Raises:
            ApplicationError: as :meth:`complete`.
        """
        model_name = req.model or self.models.default
        spec: ModelSpec | None = None
        key: str | None = None
        started = time.monotonic()
        try:
            if not self.models.is_configured(model_name):
                await load_litellm_async()  # resolving a model string asks LiteLLM
            model_name, spec = self.resolve(req.model)
            key = self._api_key(model_name, spec)
            kwargs, form = self._call_kwargs(req, spec, key)
            litellm = await load_litellm_async()
            started = time.monotonic()
            raw = await litellm.acompletion(**kwargs)
            outcome = self._outcome(
                litellm, raw, model_name, spec, started, call_key, workflow_id, form
            )
        except Exception as e:
            outcome = self._failed(e, model_name, spec, key, started, call_key, workflow_id)
        await self.record(outcome.log, meter)
        return outcome.result()

    def call_blocking(
        self,
        req: LLMRequest,
        *,
        call_key: str,
        workflow_id: str | None,
        around: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext,
    ) -> LLMOutcome:
        """One model call from synchronous code (operator threads, Ray workers), not yet
        recorded: the caller hands :attr:`LLMOutcome.log` to :meth:`record` from its
        activity, where the call row and metrics are written. ``around`` wraps the
        provider call itself (MRP lifts its egress guard there). A failed call does not
        raise here (:meth:`LLMOutcome.result` does); a ``PermissionError`` (the caller's
        guard refusing the call) does, and is no call."""
        model_name = req.model or self.models.default
        spec: ModelSpec | None = None
        key: str | None = None
        started = time.monotonic()
        try:
            model_name, spec = self.resolve(req.model)
            key = self._api_key(model_name, spec)
            kwargs, form = self._call_kwargs(req, spec, key)
            with around():
                # A first import of LiteLLM may happen here, inside the guarded call.
                litellm = load_litellm()
                started = time.monotonic()
                raw = litellm.completion(**kwargs)
            return self._outcome(
                litellm, raw, model_name, spec, started, call_key, workflow_id, form
            )
        except PermissionError:
            raise  # the caller's own guard refused the call: its policy, not a model failure
        except Exception as e:
            return self._failed(e, model_name, spec, key, started, call_key, workflow_id)

    async def record(self, log: LLMCallLog, meter: MetricMeter | None) -> None:
        """Write one call: ``keel_llm_*`` metrics to ``meter`` (when there is one) and the
        row through ``on_call``. Neither failure fails the caller: a lost log row is
        cheaper than paying for the model call again."""
        if log.status == "error":
            logger.warning("LLM call failed: %s (%s)", log.error_code, log.model_name)
        if meter is not None:
            attrs = {"model": log.model_name, "status": log.status}
            try:
                meter.create_counter("keel_llm_calls", "LLM calls by model and outcome").add(
                    1, attrs
                )
                meter.create_histogram("keel_llm_latency_ms", "LLM call latency", "ms").record(
                    round(log.latency_ms), attrs
                )
                tokens = meter.create_counter("keel_llm_tokens", "LLM tokens by model and kind")
                if log.prompt_tokens:
                    tokens.add(log.prompt_tokens, {"model": log.model_name, "kind": "prompt"})
                if log.completion_tokens:
                    tokens.add(
                        log.completion_tokens, {"model": log.model_name, "kind": "completion"}
                    )
            except Exception as e:
                logger.warning("LLM metrics for %s failed: %s", log.call_key, e)
        if self.on_call is None:
            return
        try:
            await self.on_call(log)
        except Exception as e:
            logger.warning(
                "recording LLM call %s failed: %s", log.call_key, _scrubber.scrub(repr(e))
            )

    # -- helpers -----------------------------------------------------------------------
    def _api_key(self, model_name: str, spec: ModelSpec) -> str | None:
        if spec.api_key_env:
            value = os.environ.get(spec.api_key_env)
            if not value:
                raise ApplicationError(
                    f"model {model_name!r}: environment variable {spec.api_key_env} is not set "
                    "on the worker",
                    type=LLM_CONFIG_ERROR,
                    non_retryable=True,
                )
            _scrubber.add(value)
            return value
        if spec.api_base:
            return NO_KEY_PLACEHOLDER
        # No key passed: LiteLLM reads the provider's own variable, whose name the gateway
        # does not know; every key-like variable's value is scrubbed instead.
        for name, value in os.environ.items():
            if name.upper().endswith(_KEY_LIKE) and value:
                _scrubber.add(value)
        return None

    def _call_kwargs(
        self, req: LLMRequest, spec: ModelSpec, key: str | None
    ) -> tuple[dict[str, Any], StructuredOutputForm]:
        """LiteLLM's keyword arguments, and the structured form the schema goes in."""
        params: dict[str, Any] = {**spec.params, **req.params}
        fmt, form = response_format(
            spec.structured_output,
            json_mode=req.json_mode,
            schema=req.json_schema,
            name=req.schema_name,
        )
        if fmt is not None:
            params["response_format"] = fmt
        kwargs: dict[str, Any] = {
            **params,
            "model": spec.litellm_model,
            "messages": [m.model_dump() for m in req.messages],
            "timeout": req.timeout_s,
            # Temporal owns retries: none in LiteLLM, none in the OpenAI client under it.
            "num_retries": 0,
            "max_retries": 0,
        }
        if spec.api_base:
            kwargs["api_base"] = spec.api_base
        if key is not None:
            kwargs["api_key"] = key
        return kwargs, form

    def _response(
        self,
        litellm: ModuleType,
        raw: Any,
        model_name: str,
        spec: ModelSpec,
        latency_ms: float,
        structured: StructuredOutputForm = "none",
    ) -> LLMResponse:
        choice = raw.choices[0]
        u = getattr(raw, "usage", None)
        prompt = int(getattr(u, "prompt_tokens", 0) or 0)
        completion = int(getattr(u, "completion_tokens", 0) or 0)
        total = int(getattr(u, "total_tokens", 0) or 0) or prompt + completion
        usage = LLMUsage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=total)
        cost = spec.cost(usage)
        if cost is None:
            try:
                cost = float(litellm.completion_cost(completion_response=raw))
            except Exception:
                cost = None  # not in LiteLLM's price table: unknown, not an error
        return LLMResponse(
            content=choice.message.content or "",
            model_name=model_name,
            litellm_model=spec.litellm_model,
            usage=usage,
            latency_ms=latency_ms,
            cost_usd=cost,
            finish_reason=getattr(choice, "finish_reason", None),
            reasoning=getattr(choice.message, "reasoning_content", None) or None,
            structured=structured,
        )

    def _failure(
        self, exc: Exception, model_name: str, spec: ModelSpec | None, key: str | None
    ) -> ApplicationError:
        err_type, retryable, status = classify(exc)
        text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
        text = _scrubber.scrub(text, key)
        if len(text) > _MAX_MESSAGE_CHARS:
            text = text[:_MAX_MESSAGE_CHARS] + "..."
        where = (
            f"{model_name} ({spec.litellm_model})"
            if spec and spec.litellm_model != model_name
            else model_name
        )
        # No key passed: LiteLLM read the provider's own variable. When that is missing,
        # it is the cause whatever the provider made of it (OpenAI's client: a 500;
        # Anthropic: a 401; Gemini: a connection error), and no retry sets it.
        missing = missing_key_vars(spec.litellm_model) if spec and key is None else []
        if spec is not None and missing:
            names = ", ".join(missing)
            what = (
                f"environment variable {names} is not set"
                if len(missing) == 1
                else f"environment variables {names} are not set"
            )
            return ApplicationError(
                f"{where}: {what} on the worker (LiteLLM reads the key of provider "
                f"{spec.provider or _provider(spec)!r} from it): {text}",
                {
                    "model_name": model_name,
                    "litellm_model": spec.litellm_model,
                    "missing_env": missing,
                    "exception": type(exc).__name__,
                },
                type=LLM_CONFIG_ERROR,
                non_retryable=True,
            )
        prefix = f"HTTP {status}: " if status else ""
        delay: timedelta | None = None
        retry_after_s: float | None = None
        if retryable:
            retry_after_s = _retry_after(_headers_of(exc))
            if retry_after_s is not None:
                delay = timedelta(seconds=retry_after_s)
        details = {
            "model_name": model_name,
            "litellm_model": spec.litellm_model if spec else None,
            "status_code": status,
            "exception": type(exc).__name__,
            "retry_after_s": retry_after_s,
        }
        return ApplicationError(
            f"{where}: {prefix}{text}",
            details,
            type=err_type,
            non_retryable=not retryable,
            next_retry_delay=delay,
        )

    def _outcome(
        self,
        litellm: ModuleType,
        raw: Any,
        model_name: str,
        spec: ModelSpec,
        started: float,
        call_key: str,
        workflow_id: str | None,
        structured: StructuredOutputForm = "none",
    ) -> LLMOutcome:
        latency_ms = (time.monotonic() - started) * 1000.0
        response = self._response(litellm, raw, model_name, spec, latency_ms, structured)
        log = _log(call_key, workflow_id, model_name, spec, "ok", None, latency_ms)
        log = log.model_copy(
            update={
                "prompt_tokens": response.usage.prompt_tokens,
                "completion_tokens": response.usage.completion_tokens,
                "total_tokens": response.usage.total_tokens,
                "cost_usd": response.cost_usd,
            }
        )
        return LLMOutcome(log=log, response=response)

    def _failed(
        self,
        exc: Exception,
        model_name: str,
        spec: ModelSpec | None,
        key: str | None,
        started: float,
        call_key: str,
        workflow_id: str | None,
    ) -> LLMOutcome:
        if isinstance(exc, ApplicationError):
            failure = exc
        elif isinstance(exc, ModelNotAllowedError):
            failure = ApplicationError(
                str(exc),
                {"model": exc.model, "allow": exc.allow},
                type=LLM_MODEL_NOT_ALLOWED,
                non_retryable=True,
            )
        elif isinstance(exc, UnknownModelError):
            failure = ApplicationError(str(exc), type=LLM_UNKNOWN_MODEL, non_retryable=True)
        else:
            failure = self._failure(exc, model_name, spec, key)
        latency_ms = (time.monotonic() - started) * 1000.0
        log = _log(call_key, workflow_id, model_name, spec, "error", failure.type, latency_ms)
        return LLMOutcome(log=log, failure=failure)


@dataclass(frozen=True)
class LLMOutcome:
    """What one call gave: the reply or the failure, and the record of the call."""

    log: LLMCallLog
    response: LLMResponse | None = None
    failure: ApplicationError | None = None

    def result(self) -> LLMResponse:
        """The reply; the failure (scrubbed, without its original cause) raised otherwise."""
        if self.failure is not None:
            # "from None": the original exception would otherwise travel to history as the
            # failure's cause, with its unscrubbed text.
            raise self.failure from None
        assert self.response is not None
        return self.response


def _log(
    call_key: str,
    workflow_id: str | None,
    model_name: str,
    spec: ModelSpec | None,
    status: Literal["ok", "error"],
    error_code: str | None,
    latency_ms: float,
) -> LLMCallLog:
    return LLMCallLog(
        call_key=call_key,
        workflow_id=workflow_id,
        model_name=model_name,
        litellm_model=spec.litellm_model if spec else "",
        provider=_provider(spec),
        status=status,
        error_code=error_code,
        latency_ms=latency_ms,
        created_at=datetime.now(UTC),
    )


def sql_recorder(sessions: sessionmaker[Session]) -> OnCall:
    """An ``on_call`` that writes each call to the ``llm_calls`` table (off the event loop)."""
    from store.records import record_llm_call

    async def on_call(entry: LLMCallLog) -> None:
        await asyncio.to_thread(record_llm_call, sessions, entry)

    return on_call
