"""dotprompt's Picoschema shorthand, compiled to JSON Schema.

An ``input_schema`` or ``output_schema`` in the frontmatter is JSON Schema when its top
level has a JSON Schema keyword (:data:`JSON_SCHEMA_MARKERS`: ``type``, ``properties``,
``$schema``, ``$ref``, ``anyOf``...); otherwise it is Picoschema, where each key is a
field::

    title: string, The title
    subtitle?: string                      # optional: not required, and may be null
    tags(array, Labels): string            # an array of strings, with a description
    kind(enum): [A, B]                     # one of the listed values
    address(object):                       # a nested object (also written without (object))
      city: string
    extra(object):
      (*): any                             # any other key, any value

Scalar types are ``string number integer boolean null any``. Objects do not allow keys
they do not declare unless they have a ``(*)`` wildcard, as in dotprompt. The compiled
schema is what the program keeps, validates with and shows to the model.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from keel.rllm.schema import ValidationIssue, json_type_of

SCALAR_TYPES = ("string", "number", "integer", "boolean", "null", "any")

#: A top-level key that marks a frontmatter schema as JSON Schema rather than Picoschema.
JSON_SCHEMA_MARKERS = frozenset(
    {
        "$schema",
        "$id",
        "$ref",
        "$defs",
        "definitions",
        "type",
        "properties",
        "additionalProperties",
        "required",
        "allOf",
        "anyOf",
        "oneOf",
        "enum",
        "const",
    }
)

WILDCARD = "(*)"

_FIELD = re.compile(
    r"^(?P<name>[^?(]+?)(?P<opt>\?)?(?:\((?P<kind>[^,)]+)(?:,\s*(?P<desc>.*))?\))?$"
)


class PicoschemaError(ValueError):
    """A Picoschema that cannot be compiled; ``issue`` says where (dotted key path) and why."""

    def __init__(self, issue: ValidationIssue) -> None:
        super().__init__(issue.line())
        self.issue = issue


def is_json_schema(schema: Mapping[str, Any]) -> bool:
    """Whether a frontmatter schema is JSON Schema (else it is read as Picoschema)."""
    return any(k in JSON_SCHEMA_MARKERS for k in schema)


def compile_picoschema(schema: Mapping[str, Any], *, where: str = "schema") -> dict[str, Any]:
    """The JSON Schema of a Picoschema object (the top level is always an object).

    Raises:
        PicoschemaError: an unknown type, a malformed field key, or a value of the wrong
            kind; the issue's path is the dotted frontmatter key, e.g.
            ``output_schema.tags(array)``.
    """
    return _object(schema, where)


def _fail(path: str, message: str) -> PicoschemaError:
    return PicoschemaError(ValidationIssue(path=path, message=message))


def _scalar(text: str, path: str) -> dict[str, Any]:
    type_name, _, desc = text.partition(",")
    type_name, desc = type_name.strip(), desc.strip()
    if type_name not in SCALAR_TYPES:
        raise _fail(
            path, f"unknown type {type_name!r}; Picoschema types: {', '.join(SCALAR_TYPES)}"
        )
    out: dict[str, Any] = {} if type_name == "any" else {"type": type_name}
    if desc:
        out["description"] = desc
    return out


def _value(value: Any, path: str) -> dict[str, Any]:
    """The schema of a field's value: a scalar type string or a nested object."""
    if isinstance(value, str):
        return _scalar(value, path)
    if isinstance(value, Mapping):
        return _object(value, path)
    if value is None:  # YAML reads a bare 'null' (or nothing) as no value
        raise _fail(path, "expected a type name, got no value; write 'null' in quotes for null")
    raise _fail(path, f"expected a type name or a mapping of fields, got {json_type_of(value)}")


def _object(fields: Mapping[str, Any], path: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    required: list[str] = []
    out: dict[str, Any] = {"type": "object", "properties": props}
    for key, value in fields.items():
        here = f"{path}.{key}"
        if not isinstance(key, str):
            raise _fail(here, "field names must be strings")
        if key == WILDCARD:
            out["additionalProperties"] = _value(value, here)
            continue
        m = _FIELD.match(key.strip())
        if m is None:
            raise _fail(
                here, "a field is 'name', 'name?', 'name(kind)' or 'name(kind, description)'"
            )
        name, optional, kind, desc = m["name"].strip(), bool(m["opt"]), m["kind"], m["desc"]
        kind = kind.strip() if kind else None
        if kind is None:
            sub = _value(value, here)
        elif kind == "array":
            sub = {"type": "array", "items": _value(value, here)}
        elif kind == "object":
            if not isinstance(value, Mapping):
                raise _fail(here, "an (object) field takes a mapping of fields")
            sub = _object(value, here)
        elif kind == "enum":
            if not isinstance(value, list) or not value:
                raise _fail(here, "an (enum) field takes a non-empty list of values")
            sub = {"enum": list(value)}
        else:
            raise _fail(here, f"unknown kind {kind!r}; use array, object or enum")
        if desc and desc.strip():
            sub["description"] = desc.strip()
        if optional:
            sub = _nullable(sub)
        else:
            required.append(name)
        props[name] = sub
    if required:
        out["required"] = required
    out.setdefault("additionalProperties", False)
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    # dotprompt lets an optional field be null as well as absent.
    if "enum" in schema:
        if None not in schema["enum"]:
            schema["enum"] = [*schema["enum"], None]
    elif "type" in schema and schema["type"] != "null":
        schema["type"] = [schema["type"], "null"]
    return schema
