"""The SRL actor pool: OpenAI-compatible actor servers, health-checked, least-loaded, with fail-over.

In production each actor is one ``vllm serve`` per GPU (``configs/vllm_actors.yaml``,
``keel actors serve``); locally and in tests they are llama.cpp servers with the embedded
model. The pool talks ``/v1/chat/completions`` over httpx itself, not through LiteLLM:
it owns the routing, and it keeps the token ids and logprobs the servers return.

- Health: ``GET /health`` at the server's root (vLLM); where that is 404/405, ``GET
  /v1/models`` (llama-cpp-python's server has no ``/health``).
- Routing: the healthy endpoint with the fewest requests in flight, ties broken by the
  fewest served, then by name.
- Fail-over: a connection error, a 5xx or a timeout marks the endpoint dead (no new
  requests) and the same request goes to another healthy endpoint; the caller gets one
  :class:`Generation` whose ``attempts`` lists every endpoint tried, and records the step
  once. A dead endpoint is checked again every ``retry_dead_after_s`` and returns when
  it answers.

Retries across time are Temporal's: when no endpoint is healthy the pool raises
:class:`NoHealthyActor` at once and the activity's retry policy decides when to try again.
See docs/srl-actors.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import httpx
from pydantic import BaseModel

from activities.telemetry import meter_add, meter_hist
from keel.retry import is_retryable_status
from keel.srl.actors import ActorEndpoint, ActorsConfig

log = logging.getLogger(__name__)

#: A health check is a small GET; it must not wait as long as a generation does.
HEALTH_TIMEOUT_S = 5.0
#: How much of an error body goes into ``last_error`` and exception messages.
ERROR_EXCERPT = 300
# vLLM with ``return_tokens_as_token_ids`` writes each logprobs token as ``token_id:<id>``.
_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


class Generation(BaseModel):
    """One completed generation and where it ran.

    ``token_ids`` and ``logprobs`` are the completion's, one per generated token, where the
    server returned them (docs/srl-actors.md says which do); ``attempts`` lists the
    endpoints tried in order, the last one being the one that answered.
    """

    text: str
    endpoint: str
    model: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    latency_s: float
    attempts: list[str]


class EndpointState(BaseModel):
    """What :meth:`ActorPool.snapshot` reports for one endpoint.

    ``dead_since`` is a Unix time (seconds), None while healthy; ``server`` is what the
    health check found: ``health`` (answers ``/health``, as vLLM does), ``models`` (only
    ``/v1/models``, as llama-cpp-python), or ``unknown`` before the first good check.
    """

    name: str
    base_url: str
    model: str
    healthy: bool
    in_flight: int
    served: int
    failures: int
    last_error: str | None
    dead_since: float | None
    server: Literal["health", "models", "unknown"]


class NoHealthyActor(RuntimeError):
    """No healthy endpoint is left to try for a request; ``attempts`` lists those tried."""

    def __init__(self, message: str, attempts: list[str]) -> None:
        super().__init__(message)
        self.attempts = attempts


class ActorRequestError(RuntimeError):
    """An endpoint refused the request itself (a 4xx ``keel.retry`` calls final).

    Another endpoint would refuse it too (a prompt over the context window, a bad
    parameter), so it is not re-routed; the caller should not retry it unchanged.
    """

    def __init__(self, endpoint: str, status: int, body: str) -> None:
        super().__init__(f"actor {endpoint} refused the request: HTTP {status}: {body}")
        self.endpoint = endpoint
        self.status = status
        self.body = body


@dataclass
class _Slot:
    endpoint: ActorEndpoint
    healthy: bool = False
    in_flight: int = 0
    served: int = 0
    failures: int = 0
    last_error: str | None = None
    dead_since: float | None = None
    server: Literal["health", "models", "unknown"] = "unknown"
    next_check: float = 0.0  # monotonic
    checking: bool = field(default=False)

    def state(self) -> EndpointState:
        e = self.endpoint
        return EndpointState(
            name=e.name,
            base_url=e.base_url,
            model=e.model,
            healthy=self.healthy,
            in_flight=self.in_flight,
            served=self.served,
            failures=self.failures,
            last_error=self.last_error,
            dead_since=self.dead_since,
            server=self.server,
        )


class _EndpointFailed(Exception):
    """An attempt failed in a way that says the endpoint, not the request, is at fault."""

    def __init__(self, reason: str, kind: str, *, drain: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.drain = drain


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_EXCERPT else text[: ERROR_EXCERPT - 1] + "…"


def _chat_body(
    messages: list[dict[str, str]],
    max_tokens: int,
    temperature: float,
    *,
    seed: int | None,
    stop: list[str] | None,
    top_p: float | None,
) -> dict[str, Any]:
    """A ``/v1/chat/completions`` request asking for the chosen tokens' logprobs and ids
    (the endpoint's model is added per attempt)."""
    body: dict[str, Any] = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": True,
        # The chosen token's logprob only; llama-cpp-python computes none without it.
        "top_logprobs": 1,
        # vLLM: completion token ids on the choice, and ids in the logprobs tokens.
        # Servers that do not know these fields ignore them.
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }
    if seed is not None:
        body["seed"] = seed
    if top_p is not None:
        body["top_p"] = top_p
    if stop:
        body["stop"] = stop
    return body


def _token_data(choice: dict[str, Any]) -> tuple[list[float] | None, list[int] | None]:
    """A choice's logprobs and token ids: vLLM's ``choices[0].token_ids``
    (``return_token_ids``) or ``token_id:<id>`` logprobs tokens
    (``return_tokens_as_token_ids``); None where the server gave none."""
    logprobs: list[float] | None = None
    ids_from_tokens: list[int] | None = None
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if isinstance(content, list) and content:
        values = [c.get("logprob") if isinstance(c, dict) else None for c in content]
        if all(isinstance(v, int | float) for v in values):
            logprobs = [float(v) for v in values]  # type: ignore[arg-type]
        matches = [
            _TOKEN_ID.match(c["token"])
            if isinstance(c, dict) and isinstance(c.get("token"), str)
            else None
            for c in content
        ]
        if all(m is not None for m in matches):
            ids_from_tokens = [int(m.group(1)) for m in matches if m is not None]
    raw_ids = choice.get("token_ids")
    if isinstance(raw_ids, list) and all(isinstance(t, int) for t in raw_ids):
        return logprobs, list(raw_ids)
    return logprobs, ids_from_tokens


def parse_chat_response(body: Any) -> tuple[str, dict[str, Any]]:
    """The text and the per-token data of a ``/v1/chat/completions`` answer.

    Returns ``(text, extras)`` with ``extras`` holding ``token_ids``, ``logprobs``,
    ``prompt_tokens``, ``completion_tokens`` and ``finish_reason`` (each None where the
    server left it out). Token ids come from vLLM's ``choices[0].token_ids``
    (``return_token_ids``) or from ``token_id:<id>`` logprobs tokens
    (``return_tokens_as_token_ids``); llama-cpp-python returns token strings, so no ids.

    Raises:
        ValueError: the body is not a chat completion with a text message.
    """
    if not isinstance(body, dict):
        raise ValueError("the answer is not a JSON object")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("the answer has no choices")
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else None
    if text is None and isinstance(message, dict):
        text = ""  # a model that only called tools or only reasoned
    if not isinstance(text, str):
        raise ValueError("choices[0].message.content is not text")
    logprobs, token_ids = _token_data(choice)
    raw_usage = body.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    prompt_tokens = usage.get("prompt_tokens")
    completion_tokens = usage.get("completion_tokens")
    finish = choice.get("finish_reason")
    return text, {
        "token_ids": token_ids,
        "logprobs": logprobs,
        "prompt_tokens": prompt_tokens if isinstance(prompt_tokens, int) else None,
        "completion_tokens": completion_tokens if isinstance(completion_tokens, int) else None,
        "finish_reason": finish if isinstance(finish, str) else None,
    }


class ActorPool:
    """Routes chat completions over the configured actor endpoints (module docstring).

    One pool per worker process and event loop: :meth:`start` runs the first health check
    and a background checker, :meth:`aclose` stops it. ``client`` lets a caller share an
    ``httpx.AsyncClient`` (the pool closes only the one it made).
    """

    def __init__(self, config: ActorsConfig, *, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._slots = {e.name: _Slot(e) for e in config.endpoints}
        self._own_client = client is None
        # No transport retries: a failed attempt is the pool's to re-route, and a request
        # that fails everywhere is Temporal's to retry.
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout_s),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )
        self._checker: asyncio.Task[None] | None = None
        self._started = False
        self._start_lock = asyncio.Lock()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Check every endpoint once, then keep checking in the background."""
        async with self._start_lock:
            if self._started:
                return
            await asyncio.gather(*(self._check(s) for s in self._slots.values()))
            self._checker = asyncio.create_task(self._check_loop(), name="actor-pool-health")
            self._started = True
            healthy = [s.endpoint.name for s in self._slots.values() if s.healthy]
            log.info(
                "actor pool started: %d/%d healthy %s", len(healthy), len(self._slots), healthy
            )

    async def aclose(self) -> None:
        """Stop the background checks (and close the HTTP client the pool made)."""
        task, self._checker = self._checker, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._started = False
        if self._own_client:
            await self._client.aclose()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def snapshot(self) -> list[EndpointState]:
        """Every endpoint's state, in config order."""
        return [s.state() for s in self._slots.values()]

    # -- health ------------------------------------------------------------------------------

    async def _check_loop(self) -> None:
        cfg = self.config
        tick = min(cfg.health_interval_s, cfg.retry_dead_after_s, 1.0)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            due = [
                s
                for s in self._slots.values()
                # A busy endpoint is proven alive (or dead) by its own requests; a probe
                # would only queue behind them (llama-cpp-python serves one at a time).
                if now >= s.next_check and not s.checking and (not s.healthy or s.in_flight == 0)
            ]
            if due:
                await asyncio.gather(*(self._check(s) for s in due), return_exceptions=True)

    async def _check(self, slot: _Slot) -> bool:
        """Probe one endpoint; mark it healthy or dead. Returns whether it is healthy."""
        e = slot.endpoint
        slot.checking = True
        try:
            server: Literal["health", "models"] = "health"
            resp: httpx.Response | None = await self._client.get(
                f"{e.root_url}/health", timeout=HEALTH_TIMEOUT_S
            )
            if resp is not None and resp.status_code in (404, 405):
                server = "models"
                try:
                    resp = await self._client.get(f"{e.base_url}/models", timeout=HEALTH_TIMEOUT_S)
                except httpx.TimeoutException:
                    # It answered /health at once, so it serves; llama-cpp-python's
                    # /v1/models waits for the model lock, i.e. behind a generation that
                    # another client (another worker's pool) is running there.
                    resp = None
            if resp is not None and resp.status_code != 200:
                raise _EndpointFailed(
                    f"health check: HTTP {resp.status_code}: {_excerpt(resp.text)}", "health"
                )
        except httpx.TimeoutException:
            if slot.healthy and slot.in_flight > 0:
                # Queued behind a generation that started after the probe: not a death.
                slot.next_check = time.monotonic() + self.config.health_interval_s
                return True
            self._mark_dead(slot, f"health check: no answer in {HEALTH_TIMEOUT_S:g}s", "health")
            return False
        except httpx.HTTPError as err:
            self._mark_dead(slot, f"health check: {type(err).__name__}: {err}", "health")
            return False
        except _EndpointFailed as err:
            self._mark_dead(slot, err.reason, err.kind)
            return False
        finally:
            slot.checking = False
        if not slot.healthy:
            log.info("actor %s is healthy (%s)", e.name, e.base_url)
        slot.healthy = True
        slot.dead_since = None
        slot.server = server
        slot.next_check = time.monotonic() + self.config.health_interval_s
        return True

    def _mark_dead(self, slot: _Slot, reason: str, kind: str) -> None:
        slot.failures += 1
        slot.last_error = reason
        slot.next_check = time.monotonic() + self.config.retry_dead_after_s
        meter_add(
            "keel_srl_actor_failures",
            "SRL actor endpoint failures by kind",
            1,
            {"endpoint": slot.endpoint.name, "kind": kind},
        )
        if slot.healthy or slot.dead_since is None:
            slot.healthy = False
            slot.dead_since = time.time()
            log.warning(
                "actor %s marked dead (drained; next check in %gs): %s",
                slot.endpoint.name,
                self.config.retry_dead_after_s,
                reason,
            )

    # -- routing -----------------------------------------------------------------------------

    def _pick(self, tried: list[str]) -> _Slot | None:
        candidates = [s for s in self._slots.values() if s.healthy and s.endpoint.name not in tried]
        if not candidates:
            return None
        return min(candidates, key=lambda s: (s.in_flight, s.served, s.endpoint.name))

    async def generate(
        self,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        stop: list[str] | None = None,
        top_p: float | None = None,
    ) -> Generation:
        """One chat completion on the least-loaded healthy endpoint, re-sent elsewhere if
        that endpoint fails mid-request.

        Raises:
            NoHealthyActor: no healthy endpoint was left to try (``attempts`` lists those
                that failed this request).
            ActorRequestError: an endpoint refused the request itself (4xx).
        """
        if not self._started:
            await self.start()
        body = _chat_body(messages, max_tokens, temperature, seed=seed, stop=stop, top_p=top_p)
        attempts: list[str] = []
        errors: list[str] = []
        while True:
            slot = self._pick(attempts)
            if slot is None:
                detail = "; ".join(errors) if errors else "every endpoint is marked dead"
                raise NoHealthyActor(
                    f"no healthy actor endpoint left (tried {attempts or 'none'}): {detail}",
                    attempts,
                )
            name = slot.endpoint.name
            attempts.append(name)
            try:
                text, extras, latency = await self._attempt(slot, body)
            except _EndpointFailed as err:
                errors.append(f"{name}: {err.reason}")
                self._failed(slot, err)
                continue
            slot.served += 1
            meter_hist(
                "keel_srl_actor_latency_seconds",
                "SRL actor generation latency",
                "s",
                latency,
                {"endpoint": name},
            )
            return Generation(
                text=text,
                endpoint=name,
                model=slot.endpoint.model,
                latency_s=latency,
                attempts=attempts,
                **extras,
            )

    def _failed(self, slot: _Slot, err: _EndpointFailed) -> None:
        """An endpoint failed a request: drained (marked dead), or only counted where the
        failure does not say the endpoint is gone."""
        name = slot.endpoint.name
        if err.drain:
            self._mark_dead(slot, err.reason, err.kind)
        else:
            slot.failures += 1
            slot.last_error = err.reason
            meter_add(
                "keel_srl_actor_failures",
                "SRL actor endpoint failures by kind",
                1,
                {"endpoint": name, "kind": err.kind},
            )
        log.warning("actor %s failed a request, re-routing: %s", name, err.reason)

    async def _attempt(
        self, slot: _Slot, body: dict[str, Any]
    ) -> tuple[str, dict[str, Any], float]:
        e = slot.endpoint
        slot.in_flight += 1
        started = time.monotonic()
        try:
            resp = await self._client.post(
                f"{e.base_url}/chat/completions",
                json={**body, "model": e.model},
                timeout=self.config.request_timeout_s,
            )
        except httpx.TimeoutException:
            raise _EndpointFailed(
                f"no answer in {self.config.request_timeout_s:g}s", "timeout"
            ) from None
        except httpx.HTTPError as err:
            raise _EndpointFailed(f"{type(err).__name__}: {err}", "connection") from None
        finally:
            slot.in_flight -= 1
        latency = time.monotonic() - started
        status = resp.status_code
        if status >= 500:
            raise _EndpointFailed(f"HTTP {status}: {_excerpt(resp.text)}", "http_5xx")
        if is_retryable_status(status):  # 408, 409, 425, 429 (keel.retry)
            # Overloaded, not broken: try another endpoint, keep this one in rotation.
            raise _EndpointFailed(
                f"HTTP {status}: {_excerpt(resp.text)}", f"http_{status}", drain=False
            )
        if status >= 400:
            raise ActorRequestError(e.name, status, _excerpt(resp.text))
        try:
            text, extras = parse_chat_response(resp.json())
        except ValueError as err:
            raise _EndpointFailed(f"not a chat completion: {err}", "bad_answer") from None
        return text, extras, latency

    # -- tokens ------------------------------------------------------------------------------

    async def count_tokens(self, text: str) -> int | None:
        """Tokens in ``text`` by the serving model's tokenizer, or None when no healthy
        endpoint offers tokenizing (or every one failed).

        vLLM: ``POST /tokenize`` (``{"model", "prompt"}`` → ``count``); llama-cpp-python:
        ``POST /extras/tokenize/count`` (``{"input"}`` → ``count``). Every healthy endpoint
        is asked to serve the same model family, so the first that answers is used.
        """
        if not self._started:
            await self.start()
        slots = sorted(
            (s for s in self._slots.values() if s.healthy),
            key=lambda s: (s.in_flight, s.served, s.endpoint.name),
        )
        for slot in slots:
            e = slot.endpoint
            if slot.server == "models":
                routes = [(f"{e.root_url}/extras/tokenize/count", {"input": text})]
            else:
                routes = [
                    (f"{e.root_url}/tokenize", {"model": e.model, "prompt": text}),
                    (f"{e.root_url}/extras/tokenize/count", {"input": text}),
                ]
            for url, payload in routes:
                try:
                    resp = await self._client.post(url, json=payload)
                except httpx.HTTPError as err:
                    log.info("actor %s could not count tokens: %s", e.name, err)
                    break
                if resp.status_code != 200:
                    continue
                with contextlib.suppress(ValueError):
                    answer = resp.json()
                    count = answer.get("count") if isinstance(answer, dict) else None
                    if isinstance(count, int):
                        return count
        return None
