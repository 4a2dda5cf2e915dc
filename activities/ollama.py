"""The Ollama assist: check the worker's Ollama server for a run's models, pull missing ones.

Ollama's HTTP API: ``GET /api/tags`` lists installed models, ``POST /api/pull`` with
``{"model": ..., "stream": true}`` downloads one and streams JSON status lines
(``pulling manifest``, ``pulling <digest>`` with ``completed``/``total``, ...,
``success``, or ``{"error": ...}``). :func:`ensure_models` does the work with a progress
callback (the CLI prints lines, the activity heartbeats them); the activity
``rllm.ollama_ensure`` wraps it for the ``RllmApp`` workflow. Nothing is pulled unless
auto-pull is on; a missing model is then an ``OllamaModelMissingError``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from keel.llm import ModelsConfig, UnknownModelError
from keel.rllm.errors import OllamaModelMissingError, ollama_model_missing
from keel.rllm.ollama import (
    OLLAMA_ENSURE,
    OllamaEnsureInput,
    OllamaEnsureResult,
    OllamaProgress,
    normalize_model,
    ollama_model_of,
)

log = logging.getLogger(__name__)

OnProgress = Callable[[OllamaProgress], Awaitable[None] | None]

# Listing is quick; a pull streams for as long as the download takes, so only the gap
# between two lines is bounded.
_TIMEOUT = httpx.Timeout(30.0, read=300.0)


class OllamaUnavailableError(RuntimeError):
    """The Ollama server did not answer, or answered something that is not its API."""


async def list_models(client: httpx.AsyncClient, base_url: str) -> list[str]:
    """Full names (``name:tag``) of the models installed on the server."""
    try:
        resp = await client.get(f"{base_url}/api/tags")
        resp.raise_for_status()
        body = resp.json()
    except (httpx.HTTPError, ValueError) as e:
        raise OllamaUnavailableError(f"{base_url}/api/tags: {e}") from None
    models = body.get("models") if isinstance(body, dict) else None
    if not isinstance(models, list):
        raise OllamaUnavailableError(f"{base_url}/api/tags: no 'models' list in the answer")
    names = []
    for m in models:
        if isinstance(m, dict) and isinstance(m.get("name") or m.get("model"), str):
            names.append(normalize_model(m.get("name") or m["model"]))
    return names


async def pull_model(
    client: httpx.AsyncClient, base_url: str, model: str, on_progress: OnProgress | None
) -> None:
    """Pull ``model``, passing every streamed status line to ``on_progress``.

    Raises:
        OllamaModelMissingError: the server refused the pull (unknown model, no space...).
        OllamaUnavailableError: the connection failed or the stream ended without success.
    """
    last = ""
    try:
        async with client.stream(
            "POST", f"{base_url}/api/pull", json={"model": model, "stream": True}
        ) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode(errors="replace")
                raise _pull_refused(
                    model, base_url, _error_text(text) or f"HTTP {resp.status_code}"
                )
            async for raw in resp.aiter_lines():
                if not raw.strip():
                    continue
                try:
                    line: Any = json.loads(raw)
                except ValueError:
                    continue
                if not isinstance(line, dict):
                    continue
                if line.get("error"):
                    raise _pull_refused(model, base_url, str(line["error"]))
                last = str(line.get("status", ""))
                if on_progress is not None:
                    progress = OllamaProgress(
                        model=model,
                        status=last,
                        completed=line.get("completed"),
                        total=line.get("total"),
                    )
                    maybe = on_progress(progress)
                    if maybe is not None:
                        await maybe
    except httpx.HTTPError as e:
        raise OllamaUnavailableError(f"{base_url}/api/pull {model}: {e}") from None
    if last != "success":
        raise OllamaUnavailableError(
            f"{base_url}/api/pull {model}: the stream ended at {last!r}, not 'success'"
        )


def _error_text(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:500]
    return str(body.get("error", "")) if isinstance(body, dict) else text.strip()[:500]


def _pull_refused(model: str, base_url: str, reason: str) -> OllamaModelMissingError:
    return OllamaModelMissingError(
        f"the Ollama server at {base_url} could not pull {model!r}: {reason}",
        details={"model": model, "ollama_url": base_url, "reason": reason},
        recovery_hint="Check the model name on https://ollama.com/library, or pull it by "
        "hand with 'ollama pull <model>'.",
    )


def _unavailable(model: str, base_url: str, err: Exception, app: str) -> OllamaModelMissingError:
    return OllamaModelMissingError(
        f"the Ollama server at {base_url} does not answer, so {model!r} cannot be checked: {err}",
        details={"model": model, "ollama_url": base_url, "reason": "unreachable", "app": app},
        recovery_hint="Start Ollama ('ollama serve') or set KEEL_OLLAMA_BASE_URL to where it "
        "answers.",
    )


async def ensure_models(
    base_url: str,
    *,
    required: list[str],
    recommended: list[str],
    auto_pull: bool,
    app: str = "",
    on_progress: OnProgress | None = None,
) -> OllamaEnsureResult:
    """Make sure ``required`` (and, with auto-pull, ``recommended``) are installed.

    Raises:
        OllamaModelMissingError: a required model is missing and auto-pull is off, a pull
            was refused, or the server does not answer (``details.reason``).
    """
    base_url = base_url.rstrip("/")
    required = list(dict.fromkeys(normalize_model(m) for m in required))
    wanted = required + [
        m for m in dict.fromkeys(normalize_model(m) for m in recommended) if m not in required
    ]
    result = OllamaEnsureResult(base_url=base_url, required=required)
    check = wanted if auto_pull else required
    if not check:
        return result
    async with httpx.AsyncClient(timeout=_TIMEOUT) as client:
        try:
            installed = set(await list_models(client, base_url))
        except OllamaUnavailableError as e:
            raise _unavailable(check[0], base_url, e, app) from None
        result.checked = list(check)
        for model in check:
            if model in installed:
                result.present.append(model)
                continue
            if not auto_pull:
                raise ollama_model_missing(model, app=app or None)
            log.info("pulling Ollama model %s from %s", model, base_url)
            try:
                await pull_model(client, base_url, model, on_progress)
            except OllamaUnavailableError as e:
                raise _unavailable(model, base_url, e, app) from None
            result.pulled.append(model)
    return result


class OllamaActivities:
    """``rllm.ollama_ensure``, bound to the worker's Ollama URL and models config."""

    def __init__(self, base_url: str, models: ModelsConfig | None = None) -> None:
        self.base_url = base_url
        self.models = models

    def _resolve(self, model: str | None) -> tuple[str | None, str]:
        """(Ollama model name or None, base URL) for what the app runs on."""
        direct = ollama_model_of(model)
        if direct or not model or self.models is None:
            return direct, self.base_url
        try:
            _, spec = self.models.resolve(model)
        except UnknownModelError:
            return None, self.base_url  # the model call reports unknown names
        name = ollama_model_of(spec.litellm_model)
        return name, (spec.api_base or self.base_url) if name else self.base_url

    @activity.defn(name=OLLAMA_ENSURE.name)
    async def ensure(self, req: OllamaEnsureInput) -> OllamaEnsureResult:
        """Check (and with ``auto_pull`` pull) the run's Ollama models; heartbeats progress."""
        used, base_url = self._resolve(req.model)

        def beat(p: OllamaProgress) -> None:
            activity.heartbeat(p.model_dump(mode="json"))
            activity.logger.info("ollama %s", p.line())

        try:
            return await ensure_models(
                base_url,
                required=[used] if used else [],
                recommended=req.recommended,
                auto_pull=req.auto_pull,
                app=req.app,
                on_progress=beat,
            )
        except OllamaModelMissingError as e:
            raise ApplicationError(
                e.message,
                e.to_payload().model_dump(mode="json"),
                type=type(e).__name__,
                non_retryable=True,
            ) from None
