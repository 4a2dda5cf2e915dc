"""The Ollama assist, pure part: which Ollama models a run needs, and the activity's models.

An app runs on an Ollama model when its ``llm`` (or the ``--model`` override) is
``ollama/<name>`` / ``ollama_chat/<name>``, or a models-config name whose
``litellm_model`` is one. That model must be installed on the worker's Ollama server;
when it is not, the run fails with :class:`~keel.rllm.errors.OllamaModelMissingError`
unless auto-pull is on, in which case it is pulled. With auto-pull on, the ``ollama/...``
entries of ``recommended_models`` are pulled too. The HTTP side is
``activities/ollama.py`` (activity ``rllm.ollama_ensure``); docs/rllm-ollama.md.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from keel.refs import ActivityRef

#: LiteLLM provider prefixes that reach an Ollama server.
OLLAMA_PROVIDERS = ("ollama", "ollama_chat")


def normalize_model(name: str) -> str:
    """Ollama's full name of a model: ``smollm2`` -> ``smollm2:latest`` (tags compare equal)."""
    name = name.strip()
    last = name.rsplit("/", 1)[-1]
    return name if ":" in last else f"{name}:latest"


def ollama_model_of(model: str | None) -> str | None:
    """The Ollama model name in a ``provider/model`` string, or None for other providers."""
    if not model:
        return None
    provider, sep, rest = model.partition("/")
    if sep and provider in OLLAMA_PROVIDERS and rest:
        return rest
    return None


class OllamaEnsureInput(BaseModel):
    """Input of ``rllm.ollama_ensure``.

    ``model`` is what the app runs on: a models-config name (resolved by the worker) or
    a ``provider/model`` string; only an Ollama model is checked. ``recommended`` are the
    app's ``ollama/...`` recommendations (model names), pulled only when ``auto_pull``.
    """

    model_config = ConfigDict(extra="forbid")

    app: str = ""
    model: str | None = None
    recommended: list[str] = Field(default_factory=list)
    auto_pull: bool = False


class OllamaProgress(BaseModel):
    """One progress line of a pull (Ollama's streamed status), as heartbeat details."""

    model: str
    status: str
    completed: int | None = None
    total: int | None = None

    def line(self) -> str:
        """``smollm2:135m: pulling 4a5b 50% (2000/4000 bytes)``."""
        text = f"{self.model}: {self.status}"
        if self.total:
            pct = 100.0 * (self.completed or 0) / self.total
            text += f" {pct:.0f}% ({self.completed or 0}/{self.total} bytes)"
        return text


class OllamaEnsureResult(BaseModel):
    """What the check found: ``required`` must be installed, ``present`` were, ``pulled`` were fetched."""

    base_url: str
    required: list[str] = Field(default_factory=list)
    checked: list[str] = Field(default_factory=list)
    present: list[str] = Field(default_factory=list)
    pulled: list[str] = Field(default_factory=list)


#: The check-and-pull step (activities/ollama.py); the CLI follows its heartbeats by name.
OLLAMA_ENSURE: ActivityRef[OllamaEnsureInput, OllamaEnsureResult] = ActivityRef(
    "rllm.ollama_ensure", OllamaEnsureInput, OllamaEnsureResult
)


def needs_ollama_step(*, llm_model: str | None, override: str | None, auto_pull: bool) -> bool:
    """Whether a run should call ``rllm.ollama_ensure`` (a pure decision for the workflow).

    Always with auto-pull on (the activity resolves config names and pulls what is
    missing); otherwise only when the app's model (``llm_model``, ``provider/model``) or
    the override names an Ollama model directly. A models-config name that points at
    Ollama is resolved only inside the worker, so with auto-pull off a missing model of
    that kind is reported by the model call itself.
    """
    return auto_pull or ollama_model_of(override or llm_model) is not None
