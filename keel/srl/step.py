"""Parsing one model answer into a typed :class:`Step`.

An answer comes in one of two forms:

* tags: ``<think>…</think><action>…</action><state_update>…</state_update>``, where the
  action is either JSON ``{"pattern", "rewrite", "language"}`` (an ``ast-grep run
  --pattern … --rewrite …`` call) or an ast-grep YAML rule (``id``, ``language``,
  ``rule``, optional ``fix`` …);
* one JSON object ``{"think", "action", "state_update"}`` (:func:`step_schema`), what a
  server that decodes against a JSON Schema returns, so the answer is in format by
  construction.

:func:`parse_step` never lets an exception other than :class:`StepFormatError` escape,
whatever the text: the episode records a malformed answer as a step with reward -1
instead of crashing.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from keel.problems import problem_lines
from keel.srl.errors import StateUpdateInvalid, StepFormatError
from keel.srl.state import StateUpdate, parse_state_update
from keel.yaml_limits import BoundedSafeLoader

Language = Literal["python", "javascript", "typescript", "java"]
LANGUAGES: tuple[Language, ...] = ("python", "javascript", "typescript", "java")

# ast-grep accepts these names (and file-extension aliases) for the four languages.
LANGUAGE_ALIASES: dict[str, Language] = {
    "python": "python",
    "py": "python",
    "javascript": "javascript",
    "js": "javascript",
    "jsx": "javascript",
    "mjs": "javascript",
    "cjs": "javascript",
    "typescript": "typescript",
    "ts": "typescript",
    "mts": "typescript",
    "cts": "typescript",
    "java": "java",
}

FORMAT_ERROR_KINDS = (
    "too_long",
    "missing_tag",
    "duplicate_tag",
    "empty_action",
    "bad_json",
    "bad_yaml",
    "bad_action",
    "unknown_language",
    "bad_state_update",
    "truncated",
)

# Far above any real answer; it bounds regex and parser work on a runaway generation.
MAX_ANSWER_CHARS = 200_000
TAGS = ("think", "action", "state_update")

# ast-grep rule keys (https://ast-grep.github.io/reference/yaml.html and /rule.html).
RULE_TOP_KEYS = frozenset(
    {
        "id",
        "language",
        "rule",
        "constraints",
        "utils",
        "transform",
        "fix",
        "rewriters",
        "severity",
        "message",
        "note",
        "files",
        "ignores",
        "url",
        "metadata",
        "labels",
    }
)
RULE_OBJECT_KEYS = frozenset(
    {
        "pattern",
        "kind",
        "regex",
        "nthChild",
        "range",
        "inside",
        "has",
        "precedes",
        "follows",
        "all",
        "any",
        "not",
        "matches",
    }
)

NonEmpty = Annotated[str, StringConstraints(min_length=1, max_length=20_000)]


def normalise_language(name: str) -> Language:
    """Map an ast-grep language name or alias (any case) to one of :data:`LANGUAGES`."""
    lang = LANGUAGE_ALIASES.get(name.strip().lower())
    if lang is None:
        raise StepFormatError("unknown_language", f"{name!r} is not one of {', '.join(LANGUAGES)}")
    return lang


class PatternAction(BaseModel):
    """``ast-grep run --lang LANGUAGE --pattern PATTERN --rewrite REWRITE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["pattern"] = "pattern"
    pattern: NonEmpty
    rewrite: str = Field(max_length=20_000)
    language: Language


class RuleAction(BaseModel):
    """An ast-grep YAML rule, kept as the parsed mapping and its source text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["rule"] = "rule"
    rule: dict[str, Any]
    language: Language
    yaml_text: str


Action = Annotated[PatternAction | RuleAction, Field(discriminator="kind")]


class Step(BaseModel):
    """One parsed answer: the reasoning, the action and the state update. (The reward
    compares actions in their canonical form, ``keel.srl.canonical``, not as written.)"""

    model_config = ConfigDict(extra="forbid", frozen=True)

    think: str
    action: Action
    state_update: StateUpdate


_FENCE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n(?P<body>.*?)\n?```\Z", re.DOTALL)


def _strip_fence(text: str) -> str:
    text = text.strip()
    match = _FENCE.match(text)
    return match.group("body").strip() if match else text


def _extract(answer: str, tag: str) -> str:
    opens = answer.count(f"<{tag}>")
    closes = answer.count(f"</{tag}>")
    if opens == 0 or closes == 0:
        missing = f"<{tag}>" if opens == 0 else f"</{tag}>"
        raise StepFormatError("missing_tag", f"no {missing} in the answer")
    if opens > 1 or closes > 1:
        raise StepFormatError("duplicate_tag", f"<{tag}> appears more than once")
    start = answer.index(f"<{tag}>") + len(tag) + 2
    end = answer.index(f"</{tag}>")
    if end < start:
        raise StepFormatError("missing_tag", f"</{tag}> comes before <{tag}>")
    return answer[start:end]


def _validation_detail(err: ValidationError) -> str:
    return problem_lines(err, root="<root>")[0]


def parse_pattern_action(text: str) -> PatternAction:
    """Parse the JSON form ``{"pattern", "rewrite", "language"}``."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise StepFormatError("bad_json", f"action is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise StepFormatError("bad_action", "JSON action must be an object")
    missing = [k for k in ("pattern", "rewrite", "language") if k not in data]
    if missing:
        raise StepFormatError("bad_action", f"JSON action lacks {', '.join(missing)}")
    if not isinstance(data["language"], str):
        raise StepFormatError("bad_action", "language: must be a string")
    data = {**data, "language": normalise_language(data["language"])}
    try:
        return PatternAction.model_validate(data)
    except ValidationError as exc:
        raise StepFormatError("bad_action", _validation_detail(exc)) from None


def _check_rule_object(rule: Any, path: str) -> None:
    if not isinstance(rule, dict) or not rule:
        raise StepFormatError("bad_action", f"{path}: must be a non-empty mapping")
    unknown = sorted(str(k) for k in rule if k not in RULE_OBJECT_KEYS)
    if unknown:
        raise StepFormatError("bad_action", f"{path}: unknown rule keys {', '.join(unknown)}")
    for key in ("inside", "has", "precedes", "follows", "not"):
        if key in rule:
            _check_rule_object(rule[key], f"{path}.{key}")
    for key in ("all", "any"):
        if key in rule:
            if not isinstance(rule[key], list) or not rule[key]:
                raise StepFormatError("bad_action", f"{path}.{key}: must be a non-empty list")
            for i, sub in enumerate(rule[key]):
                _check_rule_object(sub, f"{path}.{key}.{i}")
    for key in ("pattern", "regex", "kind"):
        if key in rule and not isinstance(rule[key], str | dict):
            raise StepFormatError("bad_action", f"{path}.{key}: must be a string")


def parse_rule_action(text: str) -> RuleAction:
    """Parse and shape-check an ast-grep YAML rule (``id``, ``language``, ``rule``, ``fix``)."""
    try:
        data = yaml.load(text, Loader=BoundedSafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise StepFormatError("bad_yaml", f"action is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise StepFormatError("bad_action", "action is neither a JSON object nor a YAML rule")
    unknown = sorted(str(k) for k in data if k not in RULE_TOP_KEYS)
    if unknown:
        raise StepFormatError("bad_action", f"unknown top-level rule keys {', '.join(unknown)}")
    for key in ("id", "language", "rule"):
        if key not in data:
            raise StepFormatError("bad_action", f"YAML rule lacks {key}")
    if not isinstance(data["id"], str) or not data["id"].strip():
        raise StepFormatError("bad_action", "id: must be a non-empty string")
    if not isinstance(data["language"], str):
        raise StepFormatError("bad_action", "language: must be a string")
    language = normalise_language(data["language"])
    _check_rule_object(data["rule"], "rule")
    fix = data.get("fix")
    if fix is not None and not isinstance(fix, str | dict):
        raise StepFormatError("bad_action", "fix: must be a string or a mapping")
    try:
        # Canonical JSON round trip: YAML may hold dates or other non-JSON scalars.
        rule = json.loads(json.dumps(data, default=str))
    except (ValueError, TypeError, RecursionError) as exc:
        raise StepFormatError("bad_action", f"rule cannot be represented as JSON: {exc}") from None
    return RuleAction(rule=rule, language=language, yaml_text=text)


def parse_action(body: str) -> PatternAction | RuleAction:
    """Parse an ``<action>`` body: JSON when it starts with ``{``, a YAML rule otherwise."""
    text = _strip_fence(body)
    if not text:
        raise StepFormatError("empty_action", "<action> is empty")
    if text.startswith("{"):
        return parse_pattern_action(text)
    return parse_rule_action(text)


def parse_step(answer: str, *, finish_reason: str | None = None) -> Step:
    """Parse a whole answer, in either form. Raises only :class:`StepFormatError`.

    Tags: text outside the three tags is ignored (models often add a preamble); each tag
    must appear exactly once. JSON: an answer that is one object (after an optional
    leading ``<think>`` block, which thinking models put before it) is read as
    ``{"think", "action", "state_update"}``; the think block stands in for an empty
    ``think``. An answer the server cut at its token limit (``finish_reason`` ``length``)
    that does not parse is ``truncated``, not malformed: the budget was too small.
    """
    try:
        return _parse_any(answer)
    except StepFormatError as exc:
        if finish_reason == "length" and exc.kind != "too_long":
            raise StepFormatError(
                "truncated", f"the answer was cut at the token limit ({exc.kind}: {exc.detail})"
            ) from None
        raise
    except Exception as exc:  # the contract: never an unhandled exception
        raise StepFormatError("bad_action", f"unparseable answer: {type(exc).__name__}") from None


_LEADING_THINK = re.compile(r"\A\s*<think>(?P<think>.*?)</think>\s*", re.DOTALL)


def _parse_any(answer: str) -> Step:
    if len(answer) > MAX_ANSWER_CHARS:
        raise StepFormatError(
            "too_long", f"answer has {len(answer)} chars, limit is {MAX_ANSWER_CHARS}"
        )
    lead = _LEADING_THINK.match(answer)
    rest = answer[lead.end() :] if lead else answer
    body = _strip_fence(rest)
    if body.startswith("{") and "<action>" not in rest:
        return parse_json_step(body, think=lead.group("think").strip() if lead else "")
    if lead and "<think>" in rest:
        # A thinking model's own reasoning block before a whole tag answer: not the answer's.
        return _parse_step(rest)
    return _parse_step(answer)


def parse_json_step(text: str, *, think: str = "") -> Step:
    """Parse the JSON form ``{"think", "action", "state_update"}``. The action is an
    object ``{"pattern", "rewrite", "language"}`` or a string holding either action form;
    ``think`` fills an empty or missing ``think``. Raises only :class:`StepFormatError`."""
    try:
        # strict=False: a raw newline or tab inside a string (a grammar-constrained server
        # lets one through) is read as that character, not refused.
        data = json.loads(text, strict=False)
    except (ValueError, RecursionError) as exc:
        raise StepFormatError("bad_json", f"answer is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise StepFormatError("bad_json", "answer must be a JSON object")
    unknown = sorted(str(k) for k in data if k not in TAGS)
    if unknown:
        raise StepFormatError("bad_action", f"unknown answer keys {', '.join(unknown)}")
    if "action" not in data:
        raise StepFormatError("missing_tag", "the JSON answer has no action")
    own_think = data.get("think", "")
    if not isinstance(own_think, str):
        raise StepFormatError("bad_action", "think: must be a string")
    raw_action = data["action"]
    if isinstance(raw_action, dict):
        action: PatternAction | RuleAction = parse_pattern_action(
            json.dumps(raw_action, ensure_ascii=False)
        )
    elif isinstance(raw_action, str):
        action = parse_action(raw_action)
    else:
        raise StepFormatError("bad_action", "action: must be an object or a string")
    try:
        update = parse_state_update(data.get("state_update") or {})
    except StateUpdateInvalid as exc:
        raise StepFormatError("bad_state_update", str(exc)) from None
    return Step(
        think=own_think.strip() or think,
        action=action,
        state_update=update,
    )


def step_schema(language: Language) -> dict[str, Any]:
    """The JSON Schema of a JSON-form answer for a task in ``language``.

    Properties come in the order a model should write them (think first); the bounds
    keep a constrained answer well inside a step's token budget, and the language is the
    task's, so a constrained answer cannot name another.
    """
    short = {"type": "string", "maxLength": 200}
    return {
        "type": "object",
        "properties": {
            "think": {"type": "string", "maxLength": 300},
            "action": {
                "type": "object",
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "maxLength": 200},
                    "rewrite": {"type": "string", "maxLength": 200},
                    "language": {"type": "string", "enum": [language]},
                },
                "required": ["pattern", "rewrite", "language"],
                "additionalProperties": False,
            },
            "state_update": {
                "type": "object",
                "properties": {
                    "decisions": {"type": "array", "items": short, "maxItems": 3},
                    "next_focus": short,
                },
                "additionalProperties": False,
            },
        },
        "required": ["think", "action", "state_update"],
        "additionalProperties": False,
    }


def _parse_step(answer: str) -> Step:
    if len(answer) > MAX_ANSWER_CHARS:
        raise StepFormatError(
            "too_long", f"answer has {len(answer)} chars, limit is {MAX_ANSWER_CHARS}"
        )
    think, action_body, update_body = (_extract(answer, tag) for tag in TAGS)
    action = parse_action(action_body)
    try:
        update = parse_state_update(_strip_fence(update_body))
    except StateUpdateInvalid as exc:
        raise StepFormatError("bad_state_update", str(exc)) from None
    return Step(
        think=think.strip(),
        action=action,
        state_update=update,
    )


def action_text(action: PatternAction | RuleAction) -> str:
    """The canonical text of an action (for an expert action given as a model, not text)."""
    if isinstance(action, RuleAction):
        return action.yaml_text.strip()
    return json.dumps(
        {"pattern": action.pattern, "rewrite": action.rewrite, "language": action.language},
        ensure_ascii=False,
    )
