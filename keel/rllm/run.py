"""The ``RllmApp`` workflow's contract: its input, its result and the per-attempt record.

Pure models shared by the workflow (workflows/rllm.py), its activities
(activities/rllm.py), the ``runllm`` CLI and the API. A client that runs an app on a
remote worker sends every file the app needs in :attr:`RllmRunInput.files`
(``store.files.bundle_files`` builds that mapping), so the worker never needs the client's disk.

Failures are not part of :class:`RllmRunResult`: the workflow fails with
``ApplicationError(message, payload, type=<error class name>, non_retryable=True)``
whose first detail is an :class:`keel.rllm.errors.RllmErrorPayload` as JSON;
:func:`keel.rllm.errors.error_from_payload` turns it back into the exception.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field

from keel.llm import LLMUsage, ModelNotAllowedError, ModelsConfig, is_model_string
from keel.refs import ActivityRef
from keel.rllm.contracts import coerce_input
from keel.rllm.deps import ResolvedApp
from keel.rllm.errors import (
    MetadataValidationError,
    RllmError,
    RllmErrorPayload,
)
from keel.rllm.model import LLMSpec, PythonBlock, RllmProgram
from keel.rllm.output import OutputCheck
from keel.rllm.stats import RllmRunRecord

#: Temporal workflow type name of the runner.
WORKFLOW_TYPE = "RllmApp"
#: Recovery retries after the first attempt when neither the input nor the app says.
DEFAULT_MAX_RETRIES = 2
#: Highest ``max_retries`` accepted (each retry is a paid model call).
MAX_RETRIES_LIMIT = 10


def workflow_id_for(app_name: str, unique: str) -> str:
    """The workflow id clients use: ``rllm/<app name>/<unique>`` (a uuid4 in practice)."""
    return f"rllm/{app_name}/{unique}"


class RllmRunInput(BaseModel):
    """Input of the ``RllmApp`` workflow.

    ``path`` is the root app: a key of ``files`` when ``files`` is given, else a path
    the worker can read. ``files`` maps relative paths (``/`` separated, relative to the
    root file's directory, like ``uses`` paths) to file texts. ``input`` is a dict, a
    JSON or YAML text of one, or a bare string for an app with one required string
    input (see :func:`keel.rllm.contracts.coerce_input`). ``model`` overrides the app's
    ``llm`` with a name from the models config or a LiteLLM model string
    (:func:`resolve_model_name`); it applies to children as well.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1)
    files: dict[str, str] = Field(default_factory=dict)
    input: Any = None
    model: str | None = None
    max_retries: int | None = Field(default=None, ge=0, le=MAX_RETRIES_LIMIT)
    ollama_auto_pull: bool = False
    record_stats: bool = True


class RllmAttempt(BaseModel):
    """One model call of a run: the first answer or a recovery retry.

    ``errors`` are the validation issues exactly as the model was shown them
    (``path: message`` lines; empty when ``ok``); ``raw`` is the model's whole answer.
    """

    attempt: int = Field(ge=1)
    ok: bool
    errors: list[str] = Field(default_factory=list)
    raw: str = ""
    usage: LLMUsage = Field(default_factory=LLMUsage)
    latency_ms: float = 0.0
    model_name: str = ""
    finish_reason: str | None = None


class RllmRunResult(BaseModel):
    """Result of the ``RllmApp`` workflow.

    ``model`` is the models-config name the app ran on, or the LiteLLM model string for a
    model the config does not list (for a pure composition, which
    makes no call itself, the name it resolved to). ``attempts`` are this app's own calls; ``children`` the
    results of its ``uses`` entries by alias. ``usage`` and ``llm_latency_ms`` include
    the children; ``retries`` counts this app's recovery retries only.
    """

    app: str
    version: str
    model: str
    output: dict[str, Any]
    attempts: list[RllmAttempt] = Field(default_factory=list)
    retries: int = 0
    children: dict[str, RllmRunResult] = Field(default_factory=dict)
    usage: LLMUsage = Field(default_factory=LLMUsage)
    llm_latency_ms: float = 0.0
    total_latency_ms: float = 0.0


def resolve_model_name(
    llm: LLMSpec,
    override: str | None,
    models: ModelsConfig,
    qualify: Callable[[str], str | None] | None = None,
) -> str:
    """The model an app runs on: a models-config name or a LiteLLM model string.

    ``override`` (``--model``) wins: a models-config name, a LiteLLM model string
    (``openai/gpt-4o``) or, where ``qualify`` turns it into one (the worker asks
    LiteLLM), a bare model name (``gpt-4o``). Otherwise ``provider: keel`` names a
    models-config entry, and any other provider is the string ``provider/model``.
    A string that an entry serves (its ``litellm_model``) becomes that entry's name (the
    first by name), so the entry's endpoint, key and prices apply; any other string is
    returned as is, to run with LiteLLM's defaults, if the config's ``allow`` list lets it.

    Raises:
        MetadataValidationError: an unknown name (``details.known`` lists the configured
            names), or a string ``allow`` refuses (``details.allow`` lists the patterns).
    """
    known = sorted(models.models)
    if override:
        wanted, key = override, "model"
    elif llm.is_config_name:
        wanted, key = llm.model, "llm.model"
    else:
        wanted, key = llm.litellm_model, "llm"
    if wanted in models.models:
        return wanted
    string = wanted if is_model_string(wanted) else None
    if string is None and key == "model" and qualify is not None and "/" not in wanted:
        string = qualify(wanted)
    if string is None:
        if key == "llm.model":
            raise MetadataValidationError(
                f"llm.model {wanted!r} is not in the models config (known: {', '.join(known)})",
                details={"key": key, "model": wanted, "known": known},
                recovery_hint="Use one of details.known as llm.model, name a LiteLLM model "
                "(llm: {provider: openai, model: gpt-4o-mini}), pass --model, or add the "
                "model to the models config (configs/models.yaml).",
            )
        raise MetadataValidationError(
            f"model {wanted!r} is neither in the models config (known: {', '.join(known)}) "
            "nor a LiteLLM model string (provider/model)",
            details={"key": key, "model": wanted, "known": known},
            recovery_hint="Pass --model with one of details.known or a LiteLLM model "
            "string such as openai/gpt-4o-mini.",
        )
    try:
        # The config's own resolution: an entry serving the string, else the string itself
        # where the allow list lets it.
        return models.resolve(string)[0]
    except ModelNotAllowedError as e:
        raise MetadataValidationError(
            str(e),
            details={"key": key, "model": string, "allow": e.allow, "known": known},
            recovery_hint="Use a model that matches one of details.allow or one of "
            "details.known, or add the model to the models config's allow list "
            "(configs/models.yaml).",
        ) from None


def add_usage(*usages: LLMUsage) -> LLMUsage:
    """The sum of several token counts."""
    return LLMUsage(
        prompt_tokens=sum(u.prompt_tokens for u in usages),
        completion_tokens=sum(u.completion_tokens for u in usages),
        total_tokens=sum(u.total_tokens for u in usages),
    )


def uses_paths(text: str) -> list[str]:
    """The ``uses[].path`` values of a file's frontmatter (empty when there are none)."""
    lines = text.removeprefix("\ufeff").replace("\r\n", "\n").split("\n")
    if not lines or lines[0].strip() != "---":
        return []
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        return []
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError:
        return []
    uses = data.get("uses") if isinstance(data, dict) else None
    if not isinstance(uses, list):
        return []
    return [u["path"] for u in uses if isinstance(u, dict) and isinstance(u.get("path"), str)]


def error_type_and_payload(err: RllmError) -> tuple[str, dict[str, Any]]:
    """What an ``ApplicationError`` for ``err`` carries: its ``type`` and first detail."""
    return type(err).__name__, err.to_payload().model_dump(mode="json")


def decode_input(program: RllmProgram, value: Any) -> Any:
    """Turn a run's ``input`` into the value :func:`keel.rllm.contracts.validate_input` checks.

    A dict is taken as is. A string is, in order: a JSON object (when it parses as one);
    a YAML mapping whose keys are all input properties (so prose such as
    ``"Note: this is text"`` is not mistaken for a mapping); else a bare string, which
    :func:`keel.rllm.contracts.coerce_input` turns into the app's single required
    string input when it has one. Anything else is returned unchanged for the schema
    check to refuse.
    """
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return parsed
    props = program.input_schema.get("properties", {})
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
        loaded = None
    if isinstance(loaded, dict) and loaded and all(k in props for k in loaded):
        return loaded
    return coerce_input(program, value)


# --------------------------------------------------------------- activity contracts


class LoadRequest(BaseModel):
    """Input of ``rllm.load``: the app to load (as in :class:`RllmRunInput`) and the override."""

    model_config = ConfigDict(extra="forbid")

    path: str
    files: dict[str, str] = Field(default_factory=dict)
    model: str | None = None


class LoadedApp(BaseModel):
    """Result of ``rllm.load``: the resolved app and what its root runs on.

    ``model`` is the models-config name or, for a model the config does not list, the
    LiteLLM model string itself; ``litellm_model`` the LiteLLM string and
    ``supported_params`` what LiteLLM accepts for it (None when LiteLLM does not say).
    ``path`` is the root's path as given (children are found from it).
    """

    resolved: ResolvedApp
    path: str
    model: str
    litellm_model: str
    supported_params: list[str] | None = None


class GenerateRequest(BaseModel):
    """Input of ``rllm.generate``: one prompt, one model call, one verdict."""

    model_config = ConfigDict(extra="forbid")

    app: str
    attempt: int = Field(ge=1)
    model: str
    prompt: str
    params: dict[str, Any] = Field(default_factory=dict)
    output_schema: dict[str, Any]
    timeout_s: float = Field(default=120.0, gt=0)
    #: The app's ``structured_output``: send the schema for the server to decode against.
    structured_output: bool = True


class GenerateResult(BaseModel):
    """Result of ``rllm.generate``: the attempt record and the parsed verdict.

    An answer that does not match the schema is a normal result (``check.ok`` False),
    not an error: the workflow decides whether to retry.
    """

    attempt: RllmAttempt
    check: OutputCheck


class BlockRequest(BaseModel):
    """Input of ``rllm.block``: one Python block and the values of its declared inputs."""

    model_config = ConfigDict(extra="forbid")

    app: str
    block: PythonBlock
    inputs: dict[str, Any] = Field(default_factory=dict)


class BlockResult(BaseModel):
    """Result of ``rllm.block``: the declared outputs, and what the block printed."""

    outputs: dict[str, Any]
    stdout: str = ""
    stderr: str = ""
    duration_ms: int = 0


# The runner's activities (workflows/rllm.py calls them, activities/rllm.py defines them).
LOAD: ActivityRef[LoadRequest, LoadedApp] = ActivityRef("rllm.load", LoadRequest, LoadedApp)
GENERATE: ActivityRef[GenerateRequest, GenerateResult] = ActivityRef(
    "rllm.generate", GenerateRequest, GenerateResult
)
BLOCK: ActivityRef[BlockRequest, BlockResult] = ActivityRef("rllm.block", BlockRequest, BlockResult)
RECORD_STATS: ActivityRef[RllmRunRecord, bool] = ActivityRef(
    "rllm.record_stats", RllmRunRecord, bool
)


__all__ = [
    "BLOCK",
    "DEFAULT_MAX_RETRIES",
    "GENERATE",
    "LOAD",
    "MAX_RETRIES_LIMIT",
    "RECORD_STATS",
    "WORKFLOW_TYPE",
    "BlockRequest",
    "BlockResult",
    "GenerateRequest",
    "GenerateResult",
    "LoadRequest",
    "LoadedApp",
    "RllmAttempt",
    "RllmErrorPayload",
    "RllmRunInput",
    "RllmRunResult",
    "add_usage",
    "decode_input",
    "error_type_and_payload",
    "resolve_model_name",
    "workflow_id_for",
]
