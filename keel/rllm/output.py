"""Reading a model's answer: find the JSON object in it and check it against the schema.

Small models wrap JSON in prose or Markdown fences, so the reader is lenient about
*where* the object is and strict about *what* it is: the first fenced block is tried
first, then the whole answer, then the first ``{`` at which a complete JSON object can be
decoded. The JSON itself is never repaired (no trailing-comma or quote fixing): a
repaired answer would be a guess, and the recovery prompt gives the model the exact
problem to fix instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, Field

from keel.rllm.errors import OutputSchemaError, RetryExhaustedError
from keel.rllm.schema import ValidationIssue, json_type_of, validate_instance

_FENCE = re.compile(r"```[ \t]*(?:json|JSON|javascript|js)?[ \t]*\n(.*?)```", re.DOTALL)
# Bound the scan for an object start, so a long answer full of braces stays cheap.
_MAX_OBJECT_STARTS = 200


class OutputCheck(BaseModel):
    """The verdict on one answer: the parsed object when valid, else the issues."""

    ok: bool
    value: dict[str, Any] | None = None
    issues: list[ValidationIssue] = Field(default_factory=list)
    raw: str


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constants)


def extract_json(text: str) -> tuple[dict[str, Any] | None, list[ValidationIssue]]:
    """The first JSON object in ``text``, or ``None`` and one issue saying why there is none."""
    stripped = text.strip()
    if not stripped:
        return None, [ValidationIssue(path="$", message="the answer is empty")]
    fence = _FENCE.search(stripped)
    candidates = [fence.group(1), stripped] if fence else [stripped]
    for cand in candidates:
        try:
            value = _loads(cand.strip())
        except ValueError:
            continue
        else:
            if isinstance(value, dict):
                return value, []
            return None, [
                ValidationIssue(
                    path="$", message=f"expected a JSON object, got {json_type_of(value)}"
                )
            ]
    decoder = json.JSONDecoder(parse_constant=_no_constants)
    starts = [m.start() for m in re.finditer(r"\{", stripped)][:_MAX_OBJECT_STARTS]
    scan_error = ""
    for idx in starts:
        try:
            value, _ = decoder.raw_decode(stripped, idx)
        except ValueError as e:
            scan_error = scan_error or str(e)
            continue
        if isinstance(value, dict):
            return value, []
    if starts:
        why = f"no complete JSON object found (first '{{' does not parse: {scan_error})"
    else:
        why = "no JSON object found: the answer contains no '{'"
    return None, [ValidationIssue(path="$", message=why)]


def check_output(text: str, schema: Mapping[str, Any]) -> OutputCheck:
    """Extract the JSON object from ``text`` and validate it against ``schema``."""
    value, issues = extract_json(text)
    if value is None:
        return OutputCheck(ok=False, issues=issues, raw=text)
    issues = validate_instance(schema, value)
    if issues:
        return OutputCheck(ok=False, value=value, issues=issues, raw=text)
    return OutputCheck(ok=True, value=value, raw=text)


def output_error(check: OutputCheck, schema: Mapping[str, Any]) -> OutputSchemaError:
    """The :class:`OutputSchemaError` for a failed :class:`OutputCheck`."""
    first = check.issues[0].line() if check.issues else "invalid output"
    more = f" (and {len(check.issues) - 1} more)" if len(check.issues) > 1 else ""
    return OutputSchemaError(
        f"the model's answer does not match output_schema: {first}{more}",
        details={
            "issues": [i.model_dump() for i in check.issues],
            "parsed": check.value,
        },
        expected_schema=dict(schema),
        received_payload=check.raw,
    )


def parse_output(text: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """The validated JSON object of an answer.

    Raises:
        OutputSchemaError: with every issue in ``details.issues``, the raw answer as
            ``received_payload`` and ``schema`` as ``expected_schema``.
    """
    check = check_output(text, schema)
    if not check.ok or check.value is None:
        raise output_error(check, schema)
    return check.value


def validate_output(value: Any, schema: Mapping[str, Any]) -> dict[str, Any]:
    """Validate an already-built output (after ``output_map`` or a post block).

    Raises:
        OutputSchemaError: as :func:`parse_output`, with ``value`` as the payload.
    """
    issues = (
        validate_instance(schema, value)
        if isinstance(value, dict)
        else [ValidationIssue(path="$", message=f"expected object, got {json_type_of(value)}")]
    )
    if issues:
        err = output_error(OutputCheck(ok=False, value=None, issues=issues, raw=""), schema)
        err.message = f"the app's final output does not match output_schema: {issues[0].line()}"
        err.details["parsed"] = value
        err.received_payload = value
        raise err
    return dict(value)


def retry_exhausted(
    attempts: Sequence[OutputCheck], schema: Mapping[str, Any], max_retries: int
) -> RetryExhaustedError:
    """The error raised when the first attempt and all ``max_retries`` recoveries failed.

    ``details.attempts`` keeps each attempt's issues and raw answer, in order, so the
    reader can see whether the model was getting closer.
    """
    last = attempts[-1] if attempts else OutputCheck(ok=False, raw="")
    last_issue = last.issues[0].line() if last.issues else "no answer"
    return RetryExhaustedError(
        f"no valid output after {len(attempts)} attempts (1 + max_retries={max_retries}); "
        f"last problem: {last_issue}",
        details={
            "max_retries": max_retries,
            "attempts": [
                {
                    "attempt": n,
                    "issues": [i.model_dump() for i in a.issues],
                    "output": a.raw,
                }
                for n, a in enumerate(attempts, start=1)
            ],
        },
        expected_schema=dict(schema),
        received_payload=last.raw,
    )
