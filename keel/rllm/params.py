"""``llm_params``: the model parameters an app may set, with their types and ranges.

The allowlist is the OpenAI-style parameter set that LiteLLM accepts and maps for every
provider it supports (``temperature``, ``max_tokens``, ``stop``...), plus ``top_k``,
which LiteLLM forwards to the providers that have it. It is written out here rather
than read from LiteLLM because ``keel/`` is pure: LiteLLM takes seconds to import and
has no place in workflow code. Parameters the runner itself owns are refused with a
reason (they would let a file carry a key, turn client retries on, or break the single
JSON answer the runner expects).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any

from keel.llm import RESERVED_PARAMS
from keel.problems import located
from keel.rllm.errors import REDACTED, LLMParamValidationError, redact_secrets
from keel.rllm.schema import ValidationIssue, validate_instance

#: Parameters an app may not set, with the reason given in the error.
RESERVED_LLM_PARAMS: dict[str, str] = {
    **{k: "the gateway owns it (connection, keys, retries, streaming)" for k in RESERVED_PARAMS},
    "response_format": "the runner sets it from output_format",
    "n": "an app makes exactly one completion per attempt",
    "tools": "tool calling is not part of format v0.1",
    "tool_choice": "tool calling is not part of format v0.1",
    "functions": "tool calling is not part of format v0.1",
    "function_call": "tool calling is not part of format v0.1",
    "parallel_tool_calls": "tool calling is not part of format v0.1",
    "stream_options": "the gateway owns streaming",
}

_PENALTY: dict[str, Any] = {"type": "number", "minimum": -2, "maximum": 2}

#: JSON Schema of ``llm_params`` (also the ``expected_schema`` of its errors).
LLM_PARAMS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": 1},
        "max_tokens": {"type": "integer", "minimum": 1},
        "max_completion_tokens": {"type": "integer", "minimum": 1},
        "stop": {
            "type": ["string", "array"],
            "items": {"type": "string", "minLength": 1},
            "minLength": 1,
            "maxItems": 4,
        },
        "presence_penalty": _PENALTY,
        "frequency_penalty": _PENALTY,
        "seed": {"type": "integer"},
        "logit_bias": {
            "type": "object",
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        },
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
        "user": {"type": "string"},
        "reasoning_effort": {"enum": ["low", "medium", "high"]},
    },
}


def llm_param_issues(params: Any) -> list[ValidationIssue]:
    """Everything wrong with ``params``, sorted by path (empty when they are acceptable).

    Paths are ``$.name``. Unknown names come with the closest allowed name, reserved ones
    with the reason. Exactly one of ``max_tokens`` and ``max_completion_tokens`` must be
    set, because the context-window guard needs to know how long the answer may be.
    """
    if not isinstance(params, Mapping):
        return [ValidationIssue(path="$", message="llm_params must be a mapping")]
    allowed = LLM_PARAMS_SCHEMA["properties"]
    issues: list[ValidationIssue] = []
    known = {k: v for k, v in params.items() if k in allowed}
    for name in sorted(set(params) - set(allowed), key=str):
        if name in RESERVED_LLM_PARAMS:
            msg = f"may not be set in an app: {RESERVED_LLM_PARAMS[name]}"
        else:
            close = difflib.get_close_matches(str(name), list(allowed), n=1)
            msg = "is not a supported parameter" + (
                f" (did you mean {close[0]!r}?)" if close else ""
            )
        issues.append(ValidationIssue(path=f"$.{name}", message=msg))
    issues += validate_instance(LLM_PARAMS_SCHEMA, known)
    limits = [k for k in ("max_tokens", "max_completion_tokens") if k in params]
    if not limits:
        issues.append(
            ValidationIssue(
                path="$.max_tokens",
                message="is required: the answer length bounds the context-window check",
            )
        )
    elif len(limits) == 2:
        issues.append(
            ValidationIssue(
                path="$.max_completion_tokens",
                message="set either max_tokens or max_completion_tokens, not both",
            )
        )
    return sorted(set(issues), key=lambda i: (i.path, i.message))


def answer_tokens(params: Mapping[str, Any]) -> int:
    """The answer length the app reserves: ``max_tokens`` or ``max_completion_tokens``."""
    value = params.get("max_tokens", params.get("max_completion_tokens"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise LLMParamValidationError(
            "llm_params sets neither max_tokens nor max_completion_tokens",
            details={"issues": [{"path": "$.max_tokens", "message": "is required"}]},
            expected_schema=LLM_PARAMS_SCHEMA,
            received_payload=dict(params),
        )
    return value


def validate_llm_params(
    params: Any,
    *,
    file: str | None = None,
    locate: Callable[[str], tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """Return ``params`` as a dict when they are acceptable.

    ``file`` and ``locate`` (parameter name -> line and column in that file) only make
    the error point at the right place.

    Raises:
        LLMParamValidationError: naming the first bad parameter, with all of them in
            ``details.issues`` and :data:`LLM_PARAMS_SCHEMA` as ``expected_schema``.
    """
    issues = llm_param_issues(params)
    if not issues:
        return dict(params)
    first = issues[0]
    name = first.path.removeprefix("$.")
    line, column = locate(name) if locate else (None, None)
    more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
    message = f"llm_params.{name} {first.message}{more}"
    raise LLMParamValidationError(
        located(message, file, line or None, column) if file else message,
        details={
            **({"file": file} if file else {}),
            **({"line": line, "column": column} if line else {}),
            "param": name,
            "issues": [i.model_dump() for i in issues],
        },
        expected_schema=LLM_PARAMS_SCHEMA,
        received_payload=redact_secrets(
            {k: REDACTED if k in RESERVED_LLM_PARAMS else v for k, v in params.items()}
            if isinstance(params, Mapping)
            else params
        ),
    )
