"""``CachedLLMClient``: the LLM client MRP operators get as ``ctx.llm``.

It calls models through the one gateway (``activities.llm.LLMGateway.call_blocking``: the
request building, key handling, response reading, cost and error classification of every
model call in Keel), synchronously, from inside operator code, and with a cache:

- Every request is named by its **request digest**: BLAKE3 over the model name, LiteLLM
  model, messages, merged params (model defaults + call params) and JSON mode. The API base
  and timeout are left out (a local server's port changes between runs; the answer does
  not).
- Each answer is stored in the artifact store (content-addressed), and a small reference
  ``request digest -> answer digest`` is written beside it (``<root>/refs/mrp-llm/`` for
  the local store, ``refs/mrp-llm/<hex>`` objects in the S3 bucket).
- A request whose digest is cached is answered from the store: no model call, ``cached``
  is True and ``cost_usd`` is 0 (nothing was spent).
- ``replay_only=True`` (``mrp replay``) refuses a cache miss with :class:`LLMReplayMiss`
  instead of calling a model.

- Each real model call (not a cache hit) leaves an ``LLMCallLog`` in :attr:`LLMCallStats.logs`;
  the activity that ran the operator records them (:func:`record_calls`): one ``llm_calls``
  row and the ``keel_llm_*`` metrics per call, as for every other model call.

The model call runs under :func:`activities.mrp.egress.llm_egress`, which lifts the egress
guard for this call only, and only for operators that declare ``llm`` egress.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError
from temporalio.common import MetricMeter

from activities.llm import LLMGateway
from activities.mrp.egress import guarded_operator, llm_egress
from keel.digest import digest_json
from keel.llm import (
    LLMMessage,
    LLMRequest,
    LLMUsage,
    ModelsConfig,
    UnknownModelError,
)
from keel.mrp.normalize import to_decimal
from keel.mrp.registry import OperatorSpec
from keel.mrp.sdk import LLMClient, LLMResult, LLMUnavailable, NoLLM, OperatorError
from keel.records import LLMCallLog
from keel.settings import Settings
from store.artifacts import ArtifactError, ArtifactStore, artifact_store_from_settings
from store.files import load_models_config
from store.refs import RefIndex, ref_index_for

__all__ = [
    "REQUEST_DIGEST_KIND",
    "CachedLLMClient",
    "LLMCacheEntry",
    "LLMCallFailed",
    "LLMCallStats",
    "LLMReplayMiss",
    "llm_client_for",
    "record_calls",
    "request_digest",
]

REQUEST_DIGEST_KIND = "keel.mrp.llm-request/v1"
REFS_DIR = "refs/mrp-llm"


class LLMReplayMiss(LLMUnavailable):
    """A replay asked for an answer that is not in the cache (the request changed)."""

    def __init__(self, operator: str, digest: str) -> None:
        self.request_digest = digest
        super().__init__(
            operator,
            f"replay has no cached answer for LLM request {digest} "
            "(the prompt, params or model differ from the recorded run)",
        )


class LLMCallFailed(OperatorError):
    """The model call failed; ``error_type`` is one of ``activities.llm.LLM_*``."""

    def __init__(self, operator: str, error_type: str, message: str, *, retryable: bool) -> None:
        self.error_type = error_type
        super().__init__(
            operator, f"LLM call failed ({error_type}): {message}", retryable=retryable
        )


class LLMCacheEntry(BaseModel):
    """What the cache stores for one request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: str = "keel.mrp.llm-answer/v1"
    request_digest: str
    request: dict[str, JsonValue]
    content: str
    usage: LLMUsage
    cost_usd: Decimal | None
    model_name: str
    litellm_model: str
    finish_reason: str | None = None


# ---------------------------------------------------------------------------------------
# The client


@dataclass
class LLMCallStats:
    """What one client (or fork) did: model calls, cache hits, tokens and spend, and the
    record of each model call for ``llm_calls`` (failed calls too)."""

    calls: int = 0
    cache_hits: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Decimal = Decimal(0)
    unknown_cost_calls: int = 0
    request_digests: list[str] = field(default_factory=list)
    logs: list[LLMCallLog] = field(default_factory=list)

    def add(self, result: LLMResult) -> None:
        self.request_digests.append(result.request_digest)
        if result.cached:
            self.cache_hits += 1
            return
        self.calls += 1
        self.prompt_tokens += result.usage.prompt_tokens
        self.completion_tokens += result.usage.completion_tokens
        if result.cost_usd is None:
            self.unknown_cost_calls += 1
        else:
            self.cost_usd += result.cost_usd


def _messages(messages: list[dict[str, str]] | str) -> list[LLMMessage]:
    if isinstance(messages, str):
        return [LLMMessage(role="user", content=messages)]
    return [LLMMessage.model_validate(m) for m in messages]


def request_digest(
    model_name: str, litellm_model: str, req: LLMRequest, merged: dict[str, Any]
) -> str:
    """The digest that names a request in the cache (see the module docstring)."""
    return digest_json(
        {
            "kind": REQUEST_DIGEST_KIND,
            "model": model_name,
            "litellm_model": litellm_model,
            "messages": [m.model_dump() for m in req.messages],
            "params": merged,
            "json_mode": req.json_mode,
            # Only when set, so every request digest made before schemas existed holds.
            **({"json_schema": req.json_schema} if req.json_schema is not None else {}),
        }
    )


class CachedLLMClient:
    """The :class:`keel.mrp.sdk.LLMClient` of MRP operators (see the module docstring).

    Args:
        models: the models config (``configs/models.yaml``).
        store: the artifact store answers are kept in.
        replay_only: refuse cache misses (no model calls at all).
        default_model: model used when a call names none ('' = the config's default).
        index: where references live; default: beside ``store``.
        timeout_s: per-call timeout.
        workflow_id: the run's workflow, written with each call's record.

    Thread-safe. :meth:`fork` gives a client that shares everything but its
    :attr:`stats`, so a runtime can count (and record) each shard's calls and spend.
    """

    def __init__(
        self,
        models: ModelsConfig,
        store: ArtifactStore,
        *,
        replay_only: bool = False,
        default_model: str = "",
        index: RefIndex | None = None,
        timeout_s: float = 60.0,
        workflow_id: str | None = None,
    ) -> None:
        self.models = models
        self.store = store
        self.replay_only = replay_only
        self.default_model = default_model
        self.index = index if index is not None else ref_index_for(store, REFS_DIR)
        self.timeout_s = timeout_s
        self.workflow_id = workflow_id
        self.stats = LLMCallStats()
        self._gateway = LLMGateway(models)
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._stats_lock = threading.Lock()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, replay_only: bool = False, default_model: str = ""
    ) -> CachedLLMClient:
        """A client on ``settings``' models config and artifact store."""
        return cls(
            load_models_config(settings.models_config),
            artifact_store_from_settings(settings),
            replay_only=replay_only,
            default_model=default_model,
        )

    def fork(self, workflow_id: str | None = None) -> CachedLLMClient:
        """A client sharing models, store, index and locks, with its own fresh stats (and,
        when given, the workflow its calls are recorded under)."""
        child = object.__new__(CachedLLMClient)
        child.__dict__.update(self.__dict__)
        child.stats = LLMCallStats()
        child._stats_lock = threading.Lock()
        if workflow_id is not None:
            child.workflow_id = workflow_id
        return child

    def _lock_for(self, digest: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(digest, threading.Lock())

    def _cached(self, digest: str) -> LLMCacheEntry | None:
        answer = self.index.get(digest)
        if answer is None:
            return None
        try:
            entry = LLMCacheEntry.model_validate(self.store.get_json(answer))
        except (ArtifactError, ValidationError, ValueError):
            return None  # a lost or damaged answer is a miss, never a wrong answer
        return entry if entry.request_digest == digest else None

    def complete(self, messages: list[dict[str, str]] | str, **params: Any) -> LLMResult:
        """Ask the model once (or answer from the cache). ``model``, ``json_mode`` and
        ``json_schema`` (the JSON Schema the answer must fit: sent for the server to decode
        against where the model's config says it can, docs/llm.md) may be passed as
        keywords; every other keyword is a model parameter."""
        operator = guarded_operator() or "?"
        model = str(params.pop("model", "") or self.default_model)
        json_mode = bool(params.pop("json_mode", False))
        json_schema = params.pop("json_schema", None)
        try:
            req = LLMRequest(
                model=model,
                messages=_messages(messages),
                params=params,
                json_mode=json_mode,
                json_schema=json_schema,
                timeout_s=self.timeout_s,
            )
            model_name, spec = self.models.resolve(req.model)
        except UnknownModelError as e:
            raise LLMCallFailed(operator, "LLMUnknownModel", str(e), retryable=False) from None
        except (ValidationError, ValueError) as e:
            raise LLMCallFailed(operator, "LLMBadRequest", str(e), retryable=False) from None
        merged = {**spec.params, **req.params}
        digest = request_digest(model_name, spec.litellm_model, req, merged)

        with self._lock_for(digest):
            entry = self._cached(digest)
            if entry is not None:
                result = LLMResult(
                    content=entry.content,
                    usage=entry.usage,
                    cost_usd=Decimal(0),
                    cached=True,
                    model_name=entry.model_name,
                    request_digest=digest,
                    finish_reason=entry.finish_reason,
                )
            elif self.replay_only:
                raise LLMReplayMiss(operator, digest)
            else:
                entry = self._call(operator, req, model_name, spec.litellm_model, merged, digest)
                self.index.put(digest, self.store.put_json(entry.model_dump(mode="json")))
                result = LLMResult(
                    content=entry.content,
                    usage=entry.usage,
                    cost_usd=entry.cost_usd,
                    cached=False,
                    model_name=entry.model_name,
                    request_digest=digest,
                    finish_reason=entry.finish_reason,
                )
        with self._stats_lock:
            self.stats.add(result)
        return result

    def _call(
        self,
        operator: str,
        req: LLMRequest,
        model_name: str,
        litellm_model: str,
        merged: dict[str, Any],
        digest: str,
    ) -> LLMCacheEntry:
        outcome = self._gateway.call_blocking(
            req,
            # Unique per model call: each one is spent, retried attempts included.
            call_key=f"{self.workflow_id or 'mrp'}/llm/{digest[7:23]}/{uuid.uuid4().hex[:12]}",
            workflow_id=self.workflow_id,
            around=llm_egress,
        )
        with self._stats_lock:
            self.stats.logs.append(outcome.log)
        failure = outcome.failure
        if failure is not None:
            raise LLMCallFailed(
                operator,
                failure.type or "LLMError",
                failure.message,
                retryable=not failure.non_retryable,
            ) from None
        response = outcome.result()
        return LLMCacheEntry(
            request_digest=digest,
            request={
                "model": model_name,
                "litellm_model": litellm_model,
                "messages": [m.model_dump() for m in req.messages],
                "params": merged,
                "json_mode": req.json_mode,
                **({"json_schema": req.json_schema} if req.json_schema is not None else {}),
            },
            content=response.content,
            usage=response.usage,
            cost_usd=None if response.cost_usd is None else to_decimal(response.cost_usd),
            model_name=model_name,
            litellm_model=litellm_model,
            finish_reason=response.finish_reason,
        )


# ---------------------------------------------------------------------------------------
# What the runtime hands operators, and how their calls are recorded


_cache_lock = threading.Lock()
_llm_clients: dict[tuple[str, bool, str], CachedLLMClient] = {}


def llm_client_for(
    spec: OperatorSpec,
    settings: Settings,
    *,
    replay_only: bool,
    default_model: str = "",
    workflow_id: str | None = None,
) -> LLMClient:
    """The LLM client an operator gets: a fork of the process's :class:`CachedLLMClient`
    for these settings and mode when its operator.yaml lists ``llm`` egress, else one that
    refuses every call."""
    if "llm" not in spec.egress:
        return NoLLM(spec.ref)
    key = (
        f"{settings.models_config}|{settings.artifact_backend}|{settings.artifacts_dir}",
        replay_only,
        default_model,
    )
    with _cache_lock:
        client = _llm_clients.get(key)
        if client is None:
            client = CachedLLMClient.from_settings(
                settings, replay_only=replay_only, default_model=default_model
            )
            _llm_clients[key] = client
    return client.fork(workflow_id)


def call_stats(client: LLMClient) -> LLMCallStats:
    """What ``client`` did (nothing, for a client that refuses every call)."""
    return client.stats if isinstance(client, CachedLLMClient) else LLMCallStats()


async def record_calls(
    gateway: LLMGateway, logs: list[LLMCallLog], meter: MetricMeter | None
) -> None:
    """Record MRP's model calls like every other one: ``llm_calls`` rows and metrics."""
    for log in logs:
        await gateway.record(log, meter)
