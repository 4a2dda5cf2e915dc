"""Parsing one model answer into a typed :class:`Step`.

An answer must hold ``<think>…</think><action>…</action><state_update>…</state_update>``.
The action is either JSON ``{"pattern", "rewrite", "language"}`` (an ``ast-grep run
--pattern … --rewrite …`` call) or an ast-grep YAML rule (``id``, ``language``, ``rule``,
optional ``fix`` …). :func:`parse_step` never lets an exception other than
:class:`StepFormatError` escape, whatever the text: the episode records a malformed
answer as a step with reward -1 instead of crashing.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

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
    """One parsed answer. ``action_text`` is the action body as written (fences and
    surrounding whitespace removed): the text the step-wise reward compares."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    think: str
    action: Action
    action_text: str
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
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    return f"{loc}: {first['msg']}"


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


def parse_step(answer: str) -> Step:
    """Parse a whole answer. Raises only :class:`StepFormatError`.

    Text outside the three tags is ignored (models often add a preamble); each tag must
    appear exactly once.
    """
    try:
        return _parse_step(answer)
    except StepFormatError:
        raise
    except Exception as exc:  # the contract: never an unhandled exception
        raise StepFormatError("bad_action", f"unparseable answer: {type(exc).__name__}") from None


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
        action_text=_strip_fence(action_body),
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
