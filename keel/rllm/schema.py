"""The JSON Schema subset that ``.rllm`` apps may use, and validation against it.

Apps declare ``input_schema`` and ``output_schema`` in a small subset of JSON Schema
(docs/rllm-spec.md, "Schema subset"). The subset is kept small on purpose: every keyword
in it means the same in every draft and every validator, a small model can follow it when
it is pasted into a prompt, and the composition checker in :mod:`keel.rllm.deps` can
compare two schemas of it statically. Anything else (``pattern``, ``format``, ``$ref``,
``oneOf``...) is refused when the file is loaded instead of being silently ignored.

Validation itself is delegated to ``jsonschema`` (Draft 2020-12); this module only turns
its errors into short, deterministic :class:`ValidationIssue` messages that can be quoted
back to a model in a recovery prompt.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jsonschema
from pydantic import BaseModel, ConfigDict

SUPPORTED_KEYWORDS = frozenset(
    {
        "type",
        "properties",
        "required",
        "items",
        "enum",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "additionalProperties",
        "description",
        "default",
    }
)

JSON_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")

#: How every "unexpected property" issue starts (callers recognise it by this prefix).
NOT_ALLOWED = "property is not allowed"

# Which types a keyword constrains; a keyword next to a ``type`` it cannot apply to is a
# mistake (``maxLength`` on an integer does nothing in JSON Schema, silently).
_KEYWORD_TYPES: dict[str, frozenset[str]] = {
    "properties": frozenset({"object"}),
    "required": frozenset({"object"}),
    "additionalProperties": frozenset({"object"}),
    "items": frozenset({"array"}),
    "minItems": frozenset({"array"}),
    "maxItems": frozenset({"array"}),
    "minLength": frozenset({"string"}),
    "maxLength": frozenset({"string"}),
    "minimum": frozenset({"number", "integer"}),
    "maximum": frozenset({"number", "integer"}),
}

_PREVIEW_CHARS = 60

_COUNT: dict[str, Any] = {"type": "integer", "minimum": 0}
_TYPE_NAME: dict[str, Any] = {"enum": list(JSON_TYPES)}

#: A JSON Schema describing the schemas of the subset (the ``expected_schema`` of errors
#: about an app's ``input_schema`` or ``output_schema``).
SUBSET_META_SCHEMA: dict[str, Any] = {
    "$defs": {
        "schema": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "type": {
                    "anyOf": [
                        _TYPE_NAME,
                        {"type": "array", "items": _TYPE_NAME, "minItems": 1, "uniqueItems": True},
                    ]
                },
                "properties": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/$defs/schema"},
                },
                "required": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                "items": {"$ref": "#/$defs/schema"},
                "enum": {"type": "array", "minItems": 1},
                "minimum": {"type": "number"},
                "maximum": {"type": "number"},
                "minLength": _COUNT,
                "maxLength": _COUNT,
                "minItems": _COUNT,
                "maxItems": _COUNT,
                "additionalProperties": {
                    "anyOf": [{"type": "boolean"}, {"$ref": "#/$defs/schema"}]
                },
                "description": {"type": "string"},
                "default": {},
            },
        }
    },
    "$ref": "#/$defs/schema",
}


class ValidationIssue(BaseModel):
    """One problem found in a value: where (``$.a[0].b``) and what, in plain words."""

    model_config = ConfigDict(frozen=True)

    path: str
    message: str

    def line(self) -> str:
        """``path: message``, the form quoted in error messages and recovery prompts."""
        return f"{self.path}: {self.message}"


def format_path(parts: Iterable[str | int]) -> str:
    """Render a path as ``$``, ``$.name``, ``$.items[2].name``."""
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _path_key(parts: Sequence[str | int]) -> tuple[tuple[int, int, str], ...]:
    # Array indexes sort numerically ([2] before [10]) and before names at the same depth.
    return tuple((0, p, "") if isinstance(p, int) else (1, 0, p) for p in parts)


def preview(value: Any, limit: int = _PREVIEW_CHARS) -> str:
    """A short JSON rendering of ``value`` for messages (long values are cut with '...')."""
    try:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_type_of(value: Any) -> str:
    """The JSON type name of a Python value (``integer`` for ints, ``number`` for floats)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def schema_types(schema: Mapping[str, Any]) -> frozenset[str]:
    """The types a schema admits: its ``type`` (one or a list), or those of its ``enum``."""
    t = schema.get("type")
    if isinstance(t, str):
        return frozenset({t})
    if isinstance(t, list):
        return frozenset(x for x in t if isinstance(x, str))
    if "enum" in schema and isinstance(schema["enum"], list):
        return frozenset(json_type_of(v) for v in schema["enum"])
    return frozenset(JSON_TYPES)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_schema(schema: Any, *, where: str = "schema") -> list[ValidationIssue]:
    """Check that ``schema`` stays inside the supported subset and is self-consistent.

    Returns the problems sorted by path (empty when the schema is acceptable). Paths are
    dotted frontmatter keys starting at ``where``, e.g.
    ``input_schema.properties.text.pattern``.
    """
    issues: list[ValidationIssue] = []
    _check(schema, where, issues)
    return sorted(issues, key=lambda i: (i.path, i.message))


def _check(schema: Any, where: str, issues: list[ValidationIssue]) -> None:
    def bad(path: str, message: str) -> None:
        issues.append(ValidationIssue(path=path, message=message))

    start = len(issues)

    if not isinstance(schema, dict):
        bad(where, f"a schema must be a mapping, got {json_type_of(schema)}")
        return
    for key in sorted(set(schema) - SUPPORTED_KEYWORDS):
        bad(
            f"{where}.{key}",
            f"keyword {key!r} is not in the supported subset "
            f"({', '.join(sorted(SUPPORTED_KEYWORDS))})",
        )

    t = schema.get("type")
    if t is None:
        if "enum" not in schema:
            bad(where, "'type' is required (or 'enum')")
    elif isinstance(t, str):
        if t not in JSON_TYPES:
            bad(f"{where}.type", f"unknown type {t!r}; use one of {', '.join(JSON_TYPES)}")
    elif isinstance(t, list) and t and all(isinstance(x, str) for x in t):
        unknown = [x for x in t if x not in JSON_TYPES]
        if unknown:
            bad(f"{where}.type", f"unknown types {unknown}; use {', '.join(JSON_TYPES)}")
        if len(set(t)) != len(t):
            bad(f"{where}.type", "types are listed twice")
    else:
        bad(f"{where}.type", "must be a type name or a non-empty list of type names")
    declared = schema_types(schema) if t is not None else frozenset(JSON_TYPES)

    for key, applies_to in _KEYWORD_TYPES.items():
        if key in schema and t is not None and not declared & applies_to:
            bad(f"{where}.{key}", f"{key!r} has no effect on type {preview(t)}")

    if "description" in schema and not isinstance(schema["description"], str):
        bad(f"{where}.description", "must be a string")

    for key in ("minimum", "maximum"):
        if key in schema and not _is_number(schema[key]):
            bad(f"{where}.{key}", "must be a finite number")
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        if key in schema and not _is_count(schema[key]):
            bad(f"{where}.{key}", "must be a non-negative integer")
    for lo, hi in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems")):
        a, b = schema.get(lo), schema.get(hi)
        if a is not None and b is not None and _is_number(a) and _is_number(b) and a > b:
            bad(f"{where}.{lo}", f"{lo} ({a}) is greater than {hi} ({b})")

    if "enum" in schema:
        enum = schema["enum"]
        if not isinstance(enum, list) or not enum:
            bad(f"{where}.enum", "must be a non-empty list")
        else:
            seen = [json.dumps(v, sort_keys=True) for v in enum]
            if len(set(seen)) != len(seen):
                bad(f"{where}.enum", "values are listed twice")

    props = schema.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            bad(f"{where}.properties", "must be a mapping of property name to schema")
        else:
            for name in sorted(props):
                _check(props[name], f"{where}.properties.{name}", issues)
    if "required" in schema:
        req = schema["required"]
        if not isinstance(req, list) or not all(isinstance(x, str) for x in req):
            bad(f"{where}.required", "must be a list of property names")
        else:
            if len(set(req)) != len(req):
                bad(f"{where}.required", "names are listed twice")
            known = props if isinstance(props, dict) else {}
            for name in req:
                if name not in known:
                    # A required name with no schema is almost always a typo of a property.
                    bad(f"{where}.required", f"{name!r} is required but not in properties")
    if "additionalProperties" in schema:
        ap = schema["additionalProperties"]
        if isinstance(ap, dict):
            _check(ap, f"{where}.additionalProperties", issues)
        elif not isinstance(ap, bool):
            bad(f"{where}.additionalProperties", "must be true, false or a schema")
    if "items" in schema:
        _check(schema["items"], f"{where}.items", issues)

    # Only a sound schema can judge its default (a broken one may make jsonschema raise).
    if "default" in schema and len(issues) == start:
        problems = validate_instance(schema, schema["default"])
        for p in problems:
            bad(f"{where}.default", f"default does not match the schema: {p.line()}")


def _validator(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(schema)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _message(err: jsonschema.ValidationError) -> list[tuple[list[str | int], str]]:
    """Turn one jsonschema error into (path, message) pairs in our wording."""
    path: list[str | int] = list(err.absolute_path)
    kw, want, got = err.validator, err.validator_value, err.instance
    if kw == "type":
        names = want if isinstance(want, list) else [want]
        return [(path, f"expected {' or '.join(names)}, got {json_type_of(got)} {preview(got)}")]
    if kw == "required":
        missing = [n for n in want if isinstance(got, dict) and n not in got]
        return [([*path, n], "required property is missing") for n in missing]
    if kw == "additionalProperties":
        allowed = sorted((err.schema or {}).get("properties", {}))
        extra = sorted(k for k in got if k not in allowed) if isinstance(got, dict) else []
        known = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return [([*path, k], f"{NOT_ALLOWED}{known}") for k in extra]
    if kw == "enum":
        return [(path, f"must be one of {preview(want, 200)}, got {preview(got)}")]
    if kw == "minimum":
        return [(path, f"must be >= {want}, got {preview(got)}")]
    if kw == "maximum":
        return [(path, f"must be <= {want}, got {preview(got)}")]
    if kw == "minLength":
        return [(path, f"must have at least {_plural(want, 'character')}, got {len(got)}")]
    if kw == "maxLength":
        return [(path, f"must have at most {_plural(want, 'character')}, got {len(got)}")]
    if kw == "minItems":
        return [(path, f"must have at least {_plural(want, 'item')}, got {len(got)}")]
    if kw == "maxItems":
        return [(path, f"must have at most {_plural(want, 'item')}, got {len(got)}")]
    if kw == "pattern":
        return [(path, f"must match the pattern {want!r}, got {preview(got)}")]
    if kw == "const":
        return [(path, f"must be {preview(want)}, got {preview(got)}")]
    # Keywords outside the app subset only occur in Keel's own schemas (the frontmatter
    # schema); jsonschema's own wording is good enough there.
    return [(path, err.message)]


def validate_instance(schema: Mapping[str, Any], value: Any) -> list[ValidationIssue]:
    """Validate ``value`` against ``schema``; the issues, sorted by path then message.

    An empty list means the value is valid. The order does not depend on dict order or on
    jsonschema's traversal, so the same bad value always yields the same list (and the
    same recovery prompt).
    """
    found: set[tuple[tuple[tuple[int, int, str], ...], str, str]] = set()
    for err in _validator(schema).iter_errors(value):
        for parts, msg in _message(err):
            found.add((_path_key(parts), format_path(parts), msg))
    return [ValidationIssue(path=p, message=m) for _, p, m in sorted(found)]


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of ``value`` with each missing object property that has a ``default`` filled in.

    Recurses into nested objects and array items; values of the wrong type are left alone
    (validation reports them). The input is never modified.
    """
    value = copy.deepcopy(value)
    _fill(schema, value)
    return value


def _fill(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                if not isinstance(sub, dict):
                    continue
                if name not in value and "default" in sub:
                    value[name] = copy.deepcopy(sub["default"])
                if name in value:
                    _fill(sub, value[name])
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for v in value:
                _fill(items, v)


def compatibility_problems(
    source: Mapping[str, Any], target: Mapping[str, Any], *, path: str = "$"
) -> list[str]:
    """Why a value valid for ``source`` might be invalid for ``target`` (empty: it fits).

    The check is static and covers structure only: types (an integer fits a number),
    enums, required properties of objects, closed objects and array items. Range and
    length constraints are left to run-time validation, because a child app validates
    its input again anyway.
    """
    problems: list[str] = []
    src_t, dst_t = schema_types(source), schema_types(target)
    # An integer fits where a number is wanted; a number does not fit an integer.
    bad = sorted(t for t in src_t if t not in dst_t and not (t == "integer" and "number" in dst_t))
    if bad:
        problems.append(f"{path}: may be {'/'.join(bad)} but {'/'.join(sorted(dst_t))} is expected")
        return problems
    if "enum" in target:
        allowed = {json.dumps(v, sort_keys=True) for v in target["enum"]}
        if "enum" not in source:
            problems.append(f"{path}: any value may come, but only {preview(target['enum'])}")
        else:
            stray = [v for v in source["enum"] if json.dumps(v, sort_keys=True) not in allowed]
            if stray:
                problems.append(
                    f"{path}: {preview(stray)} not accepted by {preview(target['enum'])}"
                )
    if "object" in dst_t and "object" in src_t:
        s_props = source.get("properties") or {}
        t_props = target.get("properties") or {}
        s_req = set(source.get("required") or [])
        for name in sorted(target.get("required") or []):
            sub = t_props.get(name, {})
            if name not in s_props:
                problems.append(f"{path}.{name}: required but never given")
            elif name not in s_req and "default" not in s_props[name] and "default" not in sub:
                problems.append(f"{path}.{name}: required but optional where it comes from")
        if target.get("additionalProperties") is False:
            for name in sorted(set(s_props) - set(t_props)):
                problems.append(f"{path}.{name}: not allowed by the receiving schema")
        for name in sorted(set(s_props) & set(t_props)):
            if isinstance(s_props[name], dict) and isinstance(t_props[name], dict):
                problems += compatibility_problems(
                    s_props[name], t_props[name], path=f"{path}.{name}"
                )
    if "array" in dst_t and "array" in src_t:
        s_items, t_items = source.get("items"), target.get("items")
        if isinstance(t_items, dict):
            if isinstance(s_items, dict):
                problems += compatibility_problems(s_items, t_items, path=f"{path}[]")
            else:
                problems.append(f"{path}[]: items of any type may come")
    return problems
