"""The ten ``.rllm`` error classes and the one JSON payload every failure is reported as.

Every failure of an ``.rllm`` app, from a typo in the frontmatter to a model that never
produced valid JSON, is raised as a subclass of :class:`RllmError` and can be turned into
an :class:`RllmErrorPayload` with the same eight fields. The payload is what the CLI
prints, what the workflow puts in ``ApplicationError.details`` and what a calling LLM
reads, so its ``error_code`` strings and the exit codes in :data:`EXIT_CODES` are part of
the public contract: never renumber them (docs/rllm-errors.md lists them).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

DOC_FILE = "docs/rllm-errors.md"

# "token" only as a whole last word: max_tokens is a setting, auth_token a secret.
_SECRET_KEY = re.compile(
    r"(api[_-]?key|secret|password|passwd|authorization|(^|[_-])token$)", re.IGNORECASE
)
REDACTED = "***"


class RllmErrorPayload(BaseModel):
    """The machine- and LLM-readable form of every ``.rllm`` failure."""

    model_config = ConfigDict(extra="forbid")

    error_code: str
    error_type: str
    message: str
    details: dict[str, Any] = Field(default_factory=dict)
    expected_schema: dict[str, Any] | None = None
    received_payload: Any = None
    recovery_hint: str
    doc_ref: str


class RllmError(Exception):
    """Base of the ``.rllm`` errors; subclasses fix the code, exit code and default hint.

    Raise a subclass, never this class: the base has no stable code.
    """

    error_code: ClassVar[str] = "RLLM_ERROR"
    exit_code: ClassVar[int] = 1
    default_hint: ClassVar[str] = "See the error reference."

    def __init__(
        self,
        message: str,
        *,
        details: dict[str, Any] | None = None,
        expected_schema: dict[str, Any] | None = None,
        received_payload: Any = None,
        recovery_hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        self.expected_schema = expected_schema
        self.received_payload = received_payload
        self.recovery_hint = recovery_hint or self.default_hint

    @classmethod
    def doc_ref(cls) -> str:
        """Where this class is documented: the file and the heading anchor of the class."""
        return f"{DOC_FILE}#{cls.__name__.lower()}"

    def to_payload(self) -> RllmErrorPayload:
        """The error as the standard eight-field payload."""
        return RllmErrorPayload(
            error_code=self.error_code,
            error_type=type(self).__name__,
            message=self.message,
            details=self.details,
            expected_schema=self.expected_schema,
            received_payload=self.received_payload,
            recovery_hint=self.recovery_hint,
            doc_ref=self.doc_ref(),
        )

    def __str__(self) -> str:
        return self.message


class ParseError(RllmError):
    """The file is not a well-formed ``.rllm`` file (frontmatter, YAML, sections, templates)."""

    error_code = "RLLM_PARSE_ERROR"
    exit_code = 10
    default_hint = (
        "Fix the file at the line and column given in details; the layout is: a '---' line, "
        "YAML frontmatter, a '---' line, the prompt template, then optional '=== ... ===' "
        "sections."
    )


class MetadataValidationError(RllmError):
    """A frontmatter key is missing, unknown, of the wrong type, or a schema is unsupported."""

    error_code = "RLLM_METADATA_INVALID"
    exit_code = 11
    default_hint = (
        "Correct the frontmatter key named in details.key so that it matches expected_schema."
    )


class LLMParamValidationError(RllmError):
    """``llm_params`` holds an unknown, reserved or out-of-range parameter."""

    error_code = "RLLM_LLM_PARAMS_INVALID"
    exit_code = 12
    default_hint = (
        "Use only the parameters listed in expected_schema, within their ranges, and set "
        "max_tokens."
    )


class InputSchemaError(RllmError):
    """The input given to an app does not match its ``input_schema``."""

    error_code = "RLLM_INPUT_SCHEMA_MISMATCH"
    exit_code = 13
    default_hint = (
        "Change the input so that every issue in details.issues is resolved; expected_schema "
        "is the app's input_schema."
    )


class OutputSchemaError(RllmError):
    """The model's answer is not JSON, or its JSON does not match ``output_schema``."""

    error_code = "RLLM_OUTPUT_SCHEMA_MISMATCH"
    exit_code = 14
    default_hint = (
        "Answer again with a single JSON object that matches expected_schema, fixing every "
        "issue in details.issues."
    )


class ContextWindowExceededError(RllmError):
    """The rendered prompt plus ``max_tokens`` does not fit in ``max_context_window``."""

    error_code = "RLLM_CONTEXT_WINDOW_EXCEEDED"
    exit_code = 15
    default_hint = (
        "Shorten the input, lower llm_params.max_tokens, or raise max_context_window if the "
        "model really has a larger window."
    )


class RetryExhaustedError(RllmError):
    """Every attempt, the first and each recovery retry, gave an invalid output."""

    error_code = "RLLM_RETRY_EXHAUSTED"
    exit_code = 16
    default_hint = (
        "Read details.attempts for what went wrong each time; simplify output_schema, add an "
        "example to the prompt, pick a stronger model or raise max_retries."
    )


class DependencyResolutionError(RllmError):
    """A ``uses`` entry cannot be loaded, forms a cycle, or its contract does not fit."""

    error_code = "RLLM_DEPENDENCY_UNRESOLVED"
    exit_code = 17
    default_hint = (
        "Check the uses entry named in details: the path (relative to the parent file), the "
        "exposed fields and the input_map against the child's schemas."
    )


class PythonBlockExecutionError(RllmError):
    """A pre or post Python block raised, timed out, or returned unusable values."""

    error_code = "RLLM_PYTHON_BLOCK_FAILED"
    exit_code = 18
    default_hint = (
        "Fix the block named in details.block; it must assign every declared output as a "
        "JSON value and may not use files, network or subprocesses."
    )


class OllamaModelMissingError(RllmError):
    """A recommended Ollama model is not installed and auto-pull is off."""

    error_code = "RLLM_OLLAMA_MODEL_MISSING"
    exit_code = 19
    default_hint = (
        "Run 'ollama pull <model>' for the model in details.model, or rerun with "
        "--ollama-auto-pull."
    )


ERROR_CLASSES: tuple[type[RllmError], ...] = (
    ParseError,
    MetadataValidationError,
    LLMParamValidationError,
    InputSchemaError,
    OutputSchemaError,
    ContextWindowExceededError,
    RetryExhaustedError,
    DependencyResolutionError,
    PythonBlockExecutionError,
    OllamaModelMissingError,
)

#: Process exit status for each class (0 is success, 1 an unexpected crash, 2 a CLI usage
#: error, so the classes start at 10).
EXIT_CODES: dict[type[RllmError], int] = {cls: cls.exit_code for cls in ERROR_CLASSES}

_BY_CODE: dict[str, type[RllmError]] = {cls.error_code: cls for cls in ERROR_CLASSES}


def redact_secrets(value: Any) -> Any:
    """A copy of ``value`` with the values of secret-looking keys replaced by ``***``.

    Used on file contents quoted back in errors (a key pasted into a frontmatter must not
    reach logs or workflow history through the error that refuses it). Not used on model
    outputs, whose field names are the app's business.
    """
    if isinstance(value, dict):
        return {
            k: REDACTED if isinstance(k, str) and _SECRET_KEY.search(k) else redact_secrets(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_secrets(v) for v in value]
    return value


def ollama_model_missing(model: str, *, app: str | None = None) -> OllamaModelMissingError:
    """The error for an Ollama model that is not installed while auto-pull is off."""
    return OllamaModelMissingError(
        f"the Ollama model {model!r} is not installed"
        + (f" (recommended by {app!r})" if app else "")
        + " and automatic pulls are off",
        details={"model": model, **({"app": app} if app else {})},
        recovery_hint=f"Run 'ollama pull {model}', or rerun with --ollama-auto-pull.",
    )


def error_from_payload(payload: RllmErrorPayload | dict[str, Any]) -> RllmError:
    """Rebuild the exception from its payload (e.g. read back from a workflow failure).

    Raises:
        ValueError: the payload's ``error_code`` is not one of the known codes.
    """
    p = RllmErrorPayload.model_validate(payload)
    cls = _BY_CODE.get(p.error_code)
    if cls is None:
        raise ValueError(f"unknown .rllm error code {p.error_code!r}")
    return cls(
        p.message,
        details=p.details,
        expected_schema=p.expected_schema,
        received_payload=p.received_payload,
        recovery_hint=p.recovery_hint,
    )
