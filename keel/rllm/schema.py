"""JSON Schema for ``.rllm`` apps: the load-time check, and validation with short messages.

Apps declare ``input_schema`` and ``output_schema`` in JSON Schema Draft 2020-12 (a
``$schema`` naming draft 4, 6, 7 or 2019-09 selects that draft instead), or in dotprompt's
Picoschema shorthand, compiled by :mod:`keel.rllm.picoschema`. Any keyword of the draft is
accepted. :func:`check_schema` refuses at load what cannot work or is almost certainly a
mistake: a schema the draft's meta-schema rejects, a ``$ref`` that leaves the file (it
would have to be fetched, and a run must not depend on the network), a local ``$ref``
that points nowhere, an empty ``enum``, a lower bound above its upper bound, a default
that fails its own schema, a keyword next to a ``type`` it cannot constrain, and an
unknown keyword that is one typo away from a real one (unknown keywords are annotations
in JSON Schema, so ``minLenght`` would otherwise be silently ignored).

Validation itself is delegated to ``jsonschema``; this module only turns its errors into
short, deterministic :class:`ValidationIssue` messages that can be quoted back to a model
in a recovery prompt.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeGuard

import jsonschema
import referencing
import referencing.exceptions
import referencing.jsonschema
from pydantic import BaseModel, ConfigDict

JSON_TYPES = ("string", "number", "integer", "boolean", "array", "object", "null")

#: How every "unexpected property" issue starts (callers recognise it by this prefix).
NOT_ALLOWED = "property is not allowed"

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"

#: The ``expected_schema`` of errors about an app's ``input_schema`` or ``output_schema``.
SCHEMA_META_SCHEMA: dict[str, Any] = {
    "$schema": DRAFT_2020_12,
    "$ref": DRAFT_2020_12,
    "description": "A JSON Schema (Draft 2020-12 unless $schema names another draft) "
    "whose $ref values are local ('#...'), or Picoschema (docs/rllm-spec.md).",
}

# Keywords whose value is one schema, a list of schemas, or a mapping of name to schema.
_ONE_SCHEMA = (
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
)
_SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_MAP = ("$defs", "definitions", "dependentSchemas", "patternProperties", "properties")

#: Every keyword of the drafts ``jsonschema`` knows; an unknown key close to one is a typo.
KNOWN_KEYWORDS = frozenset(
    {
        *_ONE_SCHEMA,
        *_SCHEMA_LIST,
        *_SCHEMA_MAP,
        "$anchor",
        "$comment",
        "$dynamicAnchor",
        "$dynamicRef",
        "$id",
        "$recursiveAnchor",
        "$recursiveRef",
        "$ref",
        "$schema",
        "$vocabulary",
        "const",
        "contentEncoding",
        "contentMediaType",
        "default",
        "dependencies",
        "dependentRequired",
        "deprecated",
        "description",
        "enum",
        "examples",
        "exclusiveMaximum",
        "exclusiveMinimum",
        "format",
        "items",
        "maxContains",
        "maxItems",
        "maxLength",
        "maxProperties",
        "maximum",
        "minContains",
        "minItems",
        "minLength",
        "minProperties",
        "minimum",
        "multipleOf",
        "pattern",
        "readOnly",
        "required",
        "title",
        "type",
        "uniqueItems",
        "writeOnly",
    }
)

# Which types a keyword constrains; a keyword next to a ``type`` it cannot apply to is a
# mistake (``maxLength`` on an integer does nothing in JSON Schema, silently).
_KEYWORD_TYPES: dict[str, frozenset[str]] = {
    **dict.fromkeys(
        (
            "properties",
            "required",
            "additionalProperties",
            "patternProperties",
            "minProperties",
            "maxProperties",
            "propertyNames",
            "dependentRequired",
        ),
        frozenset({"object"}),
    ),
    **dict.fromkeys(
        ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"),
        frozenset({"array"}),
    ),
    **dict.fromkeys(("minLength", "maxLength", "pattern"), frozenset({"string"})),
    **dict.fromkeys(
        ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
        frozenset({"number", "integer"}),
    ),
}

_BOUNDS = (
    ("minimum", "maximum"),
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minProperties", "maxProperties"),
    ("minContains", "maxContains"),
)

_PREVIEW_CHARS = 60

# Schemas with these keywords are left to run-time validation by the composition check.
_NOT_STATIC = ("$ref", "$dynamicRef", "anyOf", "oneOf", "allOf", "not", "if")


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


def _is_number(v: Any) -> TypeGuard[float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def validator_class(schema: Any) -> type[jsonschema.protocols.Validator]:
    """The ``jsonschema`` validator for the draft ``schema`` declares (2020-12 by default)."""
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)


def _validator(schema: Any) -> jsonschema.protocols.Validator:
    # An empty registry: a $ref that leaves the schema fails instead of being fetched.
    cls = validator_class(schema)
    return cls(schema, registry=referencing.Registry(), format_checker=cls.FORMAT_CHECKER)


def _dotted(where: str, parts: Iterable[str | int]) -> str:
    return ".".join([where, *(str(p) for p in parts)])


def check_schema(schema: Any, *, where: str = "schema") -> list[ValidationIssue]:
    """Check that ``schema`` is a valid JSON Schema that can be used offline, and sane.

    Returns the problems sorted by path (empty when the schema is acceptable). Paths are
    dotted frontmatter keys starting at ``where``, e.g.
    ``input_schema.properties.text.minLength``.
    """
    if not isinstance(schema, dict | bool):
        return [
            ValidationIssue(
                path=where, message=f"a schema must be a mapping, got {json_type_of(schema)}"
            )
        ]
    if isinstance(schema, dict) and "$schema" in schema:
        declared = schema["$schema"]
        # An unknown URI would silently fall back to 2020-12; draft 3 is too unlike it.
        cls = validator_class({"$schema": declared}) if isinstance(declared, str) else None
        if (
            cls is None
            or cls is jsonschema.Draft3Validator
            or (cls is jsonschema.Draft202012Validator and declared.rstrip("#") != DRAFT_2020_12)
        ):
            return [
                ValidationIssue(
                    path=f"{where}.$schema",
                    message=f"unsupported $schema {preview(declared)}; use {DRAFT_2020_12!r} "
                    "(or draft 4, 6, 7, 2019-09)",
                )
            ]
    cls = validator_class(schema)
    issues: set[tuple[str, str]] = set()
    meta = cls(cls.META_SCHEMA, format_checker=cls.FORMAT_CHECKER)
    for err in meta.iter_errors(schema):
        issues.add((_dotted(where, err.absolute_path), _meta_message(err)))
    if not issues:
        _check_refs(schema, where, issues)
    if not issues:
        root = _validator(schema)
        for path, sub in _subschemas(schema, []):
            _check_one(root, sub, _dotted(where, path), issues)
    return [ValidationIssue(path=p, message=m) for p, m in sorted(issues)]


def _meta_message(err: jsonschema.ValidationError) -> str:
    # The meta-schema's own wording, with anything long cut: the schema is the user's.
    if list(err.absolute_path)[-1:] == ["type"]:
        return f"unknown type {preview(err.instance)}; use one of {', '.join(JSON_TYPES)}"
    if err.validator == "format" and err.validator_value == "regex":
        return f"{preview(err.instance)} is not a valid regular expression"
    if err.validator == "type":
        want = err.validator_value
        names = want if isinstance(want, list) else [want]
        return f"must be {' or '.join(names)}, got {json_type_of(err.instance)}"
    return preview(err.message, 200).strip('"')


def _subschemas(schema: Any, path: list[str | int]) -> Iterator[tuple[list[str | int], Any]]:
    """Every schema inside ``schema`` (itself first) with its key path."""
    yield path, schema
    if not isinstance(schema, dict):
        return
    for key in _ONE_SCHEMA:
        if key in schema:
            yield from _subschemas(schema[key], [*path, key])
    for key in _SCHEMA_LIST:
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                yield from _subschemas(sub, [*path, key, i])
    for key in _SCHEMA_MAP:
        if isinstance(schema.get(key), dict):
            for name in sorted(schema[key]):
                yield from _subschemas(schema[key][name], [*path, key, name])
    items = schema.get("items")
    if isinstance(items, list):  # the tuple form of drafts before 2020-12
        for i, sub in enumerate(items):
            yield from _subschemas(sub, [*path, "items", i])
    elif items is not None:
        yield from _subschemas(items, [*path, "items"])
    deps = schema.get("dependencies")
    if isinstance(deps, dict):
        for name in sorted(deps):
            if isinstance(deps[name], dict | bool):
                yield from _subschemas(deps[name], [*path, "dependencies", name])


def _check_refs(schema: Any, where: str, issues: set[tuple[str, str]]) -> None:
    subs = list(_subschemas(schema, []))
    nested_ids = any(isinstance(s, dict) and "$id" in s for p, s in subs if p)
    spec = referencing.jsonschema.specification_with(
        str(schema.get("$schema", DRAFT_2020_12)) if isinstance(schema, dict) else DRAFT_2020_12,
        default=referencing.jsonschema.DRAFT202012,
    )
    base = "urn:keel:schema"
    resolver = (
        referencing.Registry()
        .with_resource(base, spec.create_resource(schema))
        .resolver(base_uri=base)
    )
    for path, sub in subs:
        if not isinstance(sub, dict):
            continue
        for key in ("$ref", "$dynamicRef", "$recursiveRef"):
            ref = sub.get(key)
            if not isinstance(ref, str):
                continue
            at = _dotted(where, [*path, key])
            if not ref.startswith("#"):
                issues.add(
                    (
                        at,
                        f"{ref!r} is not a local reference; only '#...' references into this "
                        "schema (such as '#/$defs/Name') are allowed, nothing is fetched",
                    )
                )
            elif not nested_ids:
                try:
                    resolver.lookup(ref)
                except referencing.exceptions.Unresolvable:
                    issues.add((at, f"{ref!r} points to nothing in this schema"))


#: Records one problem of a schema: the keyword (``None``: the schema itself), the message.
_Bad = Callable[[str | None, str], None]


def _check_keywords(schema: dict[str, Any], bad: _Bad) -> None:
    """Misspelt keywords, and keywords that have no effect on the declared type."""
    for key in sorted(set(schema) - KNOWN_KEYWORDS):
        close = difflib.get_close_matches(key, sorted(KNOWN_KEYWORDS), n=1, cutoff=0.75)
        lower = [k for k in KNOWN_KEYWORDS if k.lower() == key.lower()]
        if lower or close:
            bad(key, f"unknown keyword {key!r} (did you mean {(lower or close)[0]!r}?)")
    t = schema.get("type")
    if t is not None:
        declared = frozenset([t] if isinstance(t, str) else t)
        # An integer is a number, so 'minimum' on integer and 'number' on 'integer' fit.
        for key, applies_to in _KEYWORD_TYPES.items():
            if key in schema and not declared & applies_to:
                bad(key, f"{key!r} has no effect on type {preview(t)}")
        if isinstance(t, list) and len(set(t)) != len(t):
            bad("type", "types are listed twice")


def _check_values(schema: dict[str, Any], bad: _Bad) -> None:
    """Bounds that leave nothing between them, and an empty or repeating ``enum``."""
    for lo, hi in _BOUNDS:
        a, b = schema.get(lo), schema.get(hi)
        if _is_number(a) and _is_number(b) and a > b:
            bad(lo, f"{lo} ({_num(a)}) is greater than {hi} ({_num(b)})")
    a, b = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if _is_number(a) and _is_number(b) and a >= b:
        bad(
            "exclusiveMinimum",
            f"exclusiveMinimum ({_num(a)}) leaves nothing below exclusiveMaximum ({_num(b)})",
        )
    enum = schema.get("enum")
    if isinstance(enum, list):
        if not enum:
            bad("enum", "must be a non-empty list (an empty enum accepts no value)")
        else:
            seen = [json.dumps(v, sort_keys=True) for v in enum]
            if len(set(seen)) != len(seen):
                bad("enum", "values are listed twice")


def _check_required(schema: dict[str, Any], bad: _Bad) -> None:
    """A required name missing from ``properties`` (a typo, or none allowed at all)."""
    props = schema.get("properties")
    req = schema.get("required")
    if not (isinstance(props, dict) and isinstance(req, list)):
        return
    for name in req:
        if not isinstance(name, str) or name in props or "patternProperties" in schema:
            continue
        close = difflib.get_close_matches(name, sorted(props), n=1)
        if schema.get("additionalProperties") is False:
            bad(
                "required",
                f"{name!r} is required but not in properties, and no other "
                "property is allowed" + (f" (did you mean {close[0]!r}?)" if close else ""),
            )
        elif close:
            bad(
                "required",
                f"{name!r} is required but not in properties (did you mean {close[0]!r}?)",
            )


def _check_one(
    root: jsonschema.protocols.Validator, schema: Any, where: str, issues: set[tuple[str, str]]
) -> None:
    def bad(key: str | None, message: str) -> None:
        issues.add((where if key is None else f"{where}.{key}", message))

    if not isinstance(schema, dict):
        return
    _check_keywords(schema, bad)
    _check_values(schema, bad)
    _check_required(schema, bad)
    if "default" in schema:
        sub = root.evolve(schema=schema)
        problems = _issues(sub.iter_errors(schema["default"]))
        for p in problems:
            bad("default", f"default does not match the schema: {p.line()}")


def _num(v: float) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def _plural(n: float, word: str) -> str:
    return f"{_num(n)} {word}" + ("" if n == 1 else "s")


def _branch_misses(err: jsonschema.ValidationError, path: list[str | int]) -> bool:
    """Whether ``err`` shows that its ``anyOf``/``oneOf`` branch is not the one meant.

    A branch for another type (``null`` in an optional field), or one whose
    discriminator property (``const`` one level down) differs, says nothing useful
    about the value; the errors of the remaining branch do.
    """
    here = list(err.absolute_path)
    if err.validator == "type" and here == path:
        return True
    return err.validator == "const" and len(here) == len(path) + 1 and here[:-1] == path


def _is_false_branch(err: jsonschema.ValidationError) -> bool:
    """Whether ``err`` is the error of a ``false`` subschema (it has no keyword)."""
    return err.schema is False


def _expected(names: list[Any], got: Any) -> str:
    return f"expected {' or '.join(names)}, got {json_type_of(got)} {preview(got)}"


#: The message of a keyword whose error needs only its value (``want``) and the instance.
_KEYWORD_MESSAGES: dict[str, Callable[[Any, Any], str]] = {
    "enum": lambda want, got: f"must be one of {preview(want, 200)}, got {preview(got)}",
    "const": lambda want, got: f"must be {preview(want)}, got {preview(got)}",
    "minimum": lambda want, got: f"must be >= {want}, got {preview(got)}",
    "maximum": lambda want, got: f"must be <= {want}, got {preview(got)}",
    "exclusiveMinimum": lambda want, got: f"must be > {want}, got {preview(got)}",
    "exclusiveMaximum": lambda want, got: f"must be < {want}, got {preview(got)}",
    "multipleOf": lambda want, got: f"must be a multiple of {want}, got {preview(got)}",
    "minLength": lambda want, got: (
        f"must have at least {_plural(want, 'character')}, got {len(got)}"
    ),
    "maxLength": lambda want, got: (
        f"must have at most {_plural(want, 'character')}, got {len(got)}"
    ),
    "minItems": lambda want, got: f"must have at least {_plural(want, 'item')}, got {len(got)}",
    "maxItems": lambda want, got: f"must have at most {_plural(want, 'item')}, got {len(got)}",
    "minProperties": lambda want, got: (
        f"must have at least {_plural(want, 'property')}, got {len(got)}"
    ),
    "maxProperties": lambda want, got: (
        f"must have at most {_plural(want, 'property')}, got {len(got)}"
    ),
    "uniqueItems": lambda want, got: "items must be unique",
    "pattern": lambda want, got: f"must match the pattern {want!r}, got {preview(got)}",
    "format": lambda want, got: f"must be a valid {want}, got {preview(got)}",
    "not": lambda want, got: f"must not match {preview(want)}, got {preview(got)}",
}


def _composition_message(
    err: jsonschema.ValidationError, path: list[str | int]
) -> list[tuple[list[str | int], str]]:
    """An ``anyOf``/``oneOf`` miss: the errors of the one branch the value meant, else the
    types that fit (every branch is of another type), else that no form matches."""
    kw, want, got = err.validator, err.validator_value, err.instance
    branches: dict[Any, list[jsonschema.ValidationError]] = {}
    for n, e in enumerate(err.context or []):
        # A ``false`` branch's error carries no schema path (jsonschema yields it
        # before the path is set): it is a branch of its own, one error long.
        key = e.relative_schema_path[0] if e.relative_schema_path else ("false", n)
        branches.setdefault(key, []).append(e)
    # A ``false`` branch admits nothing, so it is never the form the value meant.
    meant = [
        es
        for es in branches.values()
        if not any(_branch_misses(e, path) or _is_false_branch(e) for e in es)
    ]
    if len(meant) == 1:
        return [m for e in meant[0] for m in _message(e)]
    types: list[str] = []
    for es in branches.values():
        for e in es:
            if e.validator == "type" and list(e.absolute_path) == path:
                want_t = e.validator_value
                types += want_t if isinstance(want_t, list) else [want_t]
    real = [es for es in branches.values() if not any(_is_false_branch(e) for e in es)]
    if not meant and real and len(types) >= len(real):
        # Every form is of another type (an optional field): say which types fit.
        return [(path, _expected(list(dict.fromkeys(types)), got))]
    return [(path, f"matches none of the {len(want)} allowed forms ({kw}), got {preview(got)}")]


def _message(err: jsonschema.ValidationError) -> list[tuple[list[str | int], str]]:
    """Turn one jsonschema error into (path, message) pairs in our wording."""
    path: list[str | int] = list(err.absolute_path)
    kw, want, got = err.validator, err.validator_value, err.instance
    if kw == "type":
        return [(path, _expected(want if isinstance(want, list) else [want], got))]
    if kw == "required":
        missing = [n for n in want if isinstance(got, dict) and n not in got]
        return [([*path, n], "required property is missing") for n in missing]
    if kw == "dependentRequired":
        return [
            ([*path, n], f"required property is missing (because {k!r} is present)")
            for k, names in sorted(want.items())
            if isinstance(got, dict) and k in got
            for n in names
            if n not in got
        ]
    if kw == "additionalProperties":
        allowed = sorted((err.schema or {}).get("properties", {}))
        extra = sorted(k for k in got if k not in allowed) if isinstance(got, dict) else []
        known = f"; allowed: {', '.join(allowed)}" if allowed else ""
        return [([*path, k], f"{NOT_ALLOWED}{known}") for k in extra]
    if kw in ("anyOf", "oneOf") and err.context:
        return _composition_message(err, path)
    if kw == "oneOf":
        return [(path, f"matches more than one of the allowed forms (oneOf), got {preview(got)}")]
    if kw in _KEYWORD_MESSAGES:
        return [(path, _KEYWORD_MESSAGES[kw](want, got))]
    if kw == "items" and want is False:  # no items beyond prefixItems
        n = len((err.schema or {}).get("prefixItems", []))
        return [(path, f"must have at most {_plural(n, 'item')}, got {len(got)}")]
    if kw is None:  # the schema 'false', e.g. a property declared as 'false'
        return [(path, f"no value is allowed here, got {preview(got)}")]
    # Rare keywords (unevaluatedProperties, contains, propertyNames...): jsonschema's own
    # wording, cut to a length a prompt can carry.
    return [(path, preview(err.message, 200).strip('"'))]


def _issues(errors: Iterable[jsonschema.ValidationError]) -> list[ValidationIssue]:
    found: set[tuple[tuple[tuple[int, int, str], ...], str, str]] = set()
    for err in errors:
        for parts, msg in _message(err):
            found.add((_path_key(parts), format_path(parts), msg))
    return [ValidationIssue(path=p, message=m) for _, p, m in sorted(found)]


def validate_instance(schema: Mapping[str, Any], value: Any) -> list[ValidationIssue]:
    """Validate ``value`` against ``schema``; the issues, sorted by path then message.

    An empty list means the value is valid. The order does not depend on dict order or on
    jsonschema's traversal, so the same bad value always yields the same list (and the
    same recovery prompt). ``format`` is asserted for the formats ``jsonschema`` checks
    without extra packages (date, email, ipv4, ipv6, regex, uuid...).
    """
    return _issues(_validator(schema).iter_errors(value))


def resolve_local(root: Mapping[str, Any], schema: Any) -> Any:
    """``schema`` with a local ``$ref`` followed (as far as 16 hops), else ``schema``.

    Used only where Keel reads a schema's shape (defaults, composition); validation
    resolves references itself. Keywords next to the ``$ref`` are kept over the target's.
    """
    for _ in range(16):
        if not isinstance(schema, dict):
            return schema
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#"):
            return schema
        target: Any = root
        for token in [t for t in ref[1:].split("/") if t]:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                return schema
        if not isinstance(target, dict):
            return schema
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def apply_defaults(schema: Mapping[str, Any], value: Any) -> Any:
    """A copy of ``value`` with each missing object property that has a ``default`` filled in.

    Recurses into nested objects and array items; values of the wrong type are left alone
    (validation reports them). The input is never modified.
    """
    value = copy.deepcopy(value)
    _fill(schema, schema, value)
    return value


def _fill(root: Mapping[str, Any], schema: Any, value: Any) -> None:
    schema = resolve_local(root, schema)
    if not isinstance(schema, dict):
        return
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                sub = resolve_local(root, sub)
                if not isinstance(sub, dict):
                    continue
                if name not in value and "default" in sub:
                    value[name] = copy.deepcopy(sub["default"])
                if name in value:
                    _fill(root, sub, value[name])
    elif isinstance(value, list):
        items = schema.get("items")
        if isinstance(items, dict):
            for v in value:
                _fill(root, items, v)


def compatibility_problems(
    source: Mapping[str, Any], target: Mapping[str, Any], *, path: str = "$"
) -> list[str]:
    """Why a value valid for ``source`` might be invalid for ``target`` (empty: it fits).

    The check is static and covers structure only: types (an integer fits a number),
    enums, required properties of objects, closed objects and array items. Range and
    length constraints are left to run-time validation, because a child app validates
    its input again anyway. So are schemas built with ``$ref``, ``anyOf``, ``oneOf``,
    ``allOf``, ``not`` or ``if``: their shape is not read statically.
    """
    problems: list[str] = []
    if any(k in s for s in (source, target) for k in _NOT_STATIC):
        return problems
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
