"""Operator schema checks take a fast path (``jsonschema_rs``) on valid values of schemas
whose keywords both libraries read alike; ``jsonschema`` still decides every value the
fast path does not pass, and reports the problems. The fast path must never pass a value
``jsonschema`` fails: checked here on every shipped and test operator's schemas and on
hand-made ones, against odd values."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from keel.mrp import registry
from keel.mrp.registry import SchemaValidator

ROOT = Path(__file__).resolve().parents[3]

VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2**63, 10**30, -(10**30), 0.0, -0.0, 1.0, 1.5, 1e300,
    -1e-300, "", "a", "ü✓", "x" * 300, "12", [], [1], ["a", "b"], [1, "a", None],
    [[1]], {}, {"text": "hi"}, {"text": 1}, {"id": 1, "text": "t"}, {"id": True, "text": "t"},
    {"amount": "1.5"}, {"amount": 1.5}, {"amount": None}, {"a": {"b": [1, 2]}},
    {"count": 3, "words": {"a": 1}}, {"words": {"a": -1}}, {"label": "positive"},
    {"label": "maybe"}, {"x": 1.0}, {"x": 1}, {"items": 2, "chars": 3},
]  # fmt: skip

HAND: list[dict[str, Any]] = [
    {"type": "integer"},
    {"type": "integer", "minimum": 0},
    {"type": "number", "exclusiveMaximum": 1.5},
    {"type": "string", "minLength": 2, "maxLength": 3},
    {"type": "array", "items": {"type": "integer"}, "minItems": 1, "uniqueItems": True},
    {"type": "object", "required": ["text"], "additionalProperties": False,
     "properties": {"text": {"type": "string"}, "id": {"type": "integer"}}},
    {"anyOf": [{"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}}]},
    {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    {"not": {"type": "null"}},
    {"enum": ["positive", "negative", 1, None]},
    {"const": {"a": 1}},
    {"type": ["object", "null"], "minProperties": 1, "maxProperties": 2},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
    {"prefixItems": [{"type": "integer"}, {"type": "string"}]},
]  # fmt: skip


def operator_schemas() -> list[dict[str, Any]]:
    found = []
    for path in sorted(ROOT.glob("operators/*/operator.yaml")) + sorted(
        ROOT.glob("tests/**/operator.yaml")
    ):
        spec = yaml.safe_load(path.read_text())
        for which in ("input_schema", "output_schema", "params_schema"):
            if spec.get(which):
                found.append(spec[which])
    assert len(found) > 10
    return found


@pytest.mark.parametrize("schema", operator_schemas() + HAND)
def test_the_fast_path_never_passes_a_value_jsonschema_fails(schema: dict[str, Any]) -> None:
    fast = registry._fast_validator(schema)
    slow = SchemaValidator(schema)
    for value in VALUES:
        expected = not list(slow.iter_errors(value))
        if fast is not None:
            assert fast.is_valid(value) == expected, (schema, value)


def test_hand_made_schemas_take_the_fast_path_and_patterns_do_not() -> None:
    assert all(registry._fast_validator(s) is not None for s in HAND)
    assert registry._fast_validator({"type": "string", "pattern": "^a"}) is None
    assert registry._fast_validator({"properties": {"a": {"format": "date"}}}) is None
    assert registry._fast_validator({"$ref": "#/$defs/x", "$defs": {"x": {}}}) is None


def test_problems_are_still_jsonschemas() -> None:
    spec = registry.OperatorSpec(
        name="t",
        version="1.0.0",
        kind="map",  # type: ignore[arg-type]
        entrypoint="m:f",
        code_digest="blake3:" + "0" * 64,
        input_schema={"type": "object", "required": ["text"],
                      "properties": {"text": {"type": "string"}}},
    )  # fmt: skip
    assert spec.schema_errors("input", {"text": "ok"}) == []
    problems = spec.schema_errors("input", {"text": 1})
    assert [(p.path, p.message) for p in problems] == [(("text",), "1 is not of type 'string'")]
    for a, b in itertools.pairwise(VALUES):  # and never raises on odd values
        spec.schema_errors("input", [a, b])
        spec.schema_errors("input", {"text": a, "other": b})
