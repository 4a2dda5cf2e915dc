import pytest

from keel.rllm.schema import (
    SUPPORTED_KEYWORDS,
    apply_defaults,
    check_schema,
    compatibility_problems,
    format_path,
    validate_instance,
)

PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "tags"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 5},
        "age": {"type": "integer", "minimum": 0, "maximum": 150, "default": 30},
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
        "kind": {"enum": ["a", "b"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "default": "Paris"}},
        },
    },
}


def test_supported_keywords_are_exactly_the_documented_subset():
    assert {
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
    } == SUPPORTED_KEYWORDS
    assert check_schema(PERSON) == []


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"type": "string", "pattern": "^a"}, "s.pattern", "not in the supported subset"),
        ({"type": "string", "format": "email"}, "s.format", "not in the supported subset"),
        ({"oneOf": [{"type": "string"}]}, "s", "'type' is required"),
        ({"$ref": "#/x", "type": "object"}, "s.$ref", "not in the supported subset"),
        ({"type": "text"}, "s.type", "unknown type 'text'"),
        ({"type": "integer", "maxLength": 3}, "s.maxLength", "has no effect on type"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "s.minimum", "greater than maximum"),
        ({"type": "string", "minLength": -1}, "s.minLength", "non-negative integer"),
        ({"type": "string", "enum": []}, "s.enum", "non-empty list"),
        ({"type": "object", "required": ["x"], "properties": {}}, "s.required", "'x' is required"),
        ({"type": "integer", "default": "x"}, "s.default", "default does not match"),
        (
            {"type": "object", "properties": {"a": {"type": "string", "uniqueItems": True}}},
            "s.properties.a.uniqueItems",
            "not in the supported subset",
        ),
        ({"type": "array", "items": {"type": "strin"}}, "s.items.type", "unknown type"),
        ({"type": "object", "additionalProperties": 3}, "s.additionalProperties", "true, false"),
    ],
)
def test_subset_refuses(schema, path, words):
    issues = check_schema(schema, where="s")
    assert any(i.path == path and words in i.message for i in issues), issues


def test_validate_instance_messages_are_plain_and_sorted():
    value = {
        "name": "toolongname",
        "age": "old",
        "tags": [],
        "kind": "c",
        "extra": 1,
        "address": {"city": 5},
    }
    got = [(i.path, i.message) for i in validate_instance(PERSON, value)]
    assert got == [
        ("$.address.city", "expected string, got integer 5"),
        ("$.age", 'expected integer, got string "old"'),
        ("$.extra", "property is not allowed; allowed: address, age, kind, name, tags"),
        ("$.kind", 'must be one of ["a", "b"], got "c"'),
        ("$.name", "must have at most 5 characters, got 11"),
        ("$.tags", "must have at least 1 item, got 0"),
    ]


def test_validate_instance_is_deterministic_and_orders_indexes_numerically():
    schema = {"type": "array", "items": {"type": "integer"}}
    value = ["x"] * 12
    a = validate_instance(schema, value)
    assert a == validate_instance(schema, list(value))
    assert [i.path for i in a][:3] == ["$[0]", "$[1]", "$[2]"]
    assert a[-1].path == "$[11]"


def test_missing_required_points_at_the_property():
    issues = validate_instance(PERSON, {})
    assert [(i.path, i.message) for i in issues] == [
        ("$.name", "required property is missing"),
        ("$.tags", "required property is missing"),
    ]


def test_booleans_are_not_numbers():
    assert validate_instance({"type": "integer"}, True)[0].message == (
        "expected integer, got boolean true"
    )


def test_long_values_are_cut_in_messages():
    msg = validate_instance({"type": "integer"}, "x" * 500)[0].message
    assert msg == 'expected integer, got string "' + "x" * 56 + "..."


def test_apply_defaults_fills_nested_and_copies():
    value = {"name": "a", "tags": ["t"], "address": {}}
    filled = apply_defaults(PERSON, value)
    assert filled == {"name": "a", "tags": ["t"], "age": 30, "address": {"city": "Paris"}}
    assert value == {"name": "a", "tags": ["t"], "address": {}}


def test_format_path():
    assert format_path([]) == "$"
    assert format_path(["a", 0, "b"]) == "$.a[0].b"


@pytest.mark.parametrize(
    ("source", "target", "fits"),
    [
        ({"type": "integer"}, {"type": "number"}, True),
        ({"type": "number"}, {"type": "integer"}, False),
        ({"type": "string"}, {"type": ["string", "null"]}, True),
        ({"type": ["string", "null"]}, {"type": "string"}, False),
        ({"enum": ["a"]}, {"type": "string", "enum": ["a", "b"]}, True),
        ({"type": "string"}, {"type": "string", "enum": ["a"]}, False),
        (
            {"type": "array", "items": {"type": "string"}},
            {"type": "array", "items": {"type": "string"}},
            True,
        ),
        (
            {"type": "array", "items": {"type": "integer"}},
            {"type": "array", "items": {"type": "string"}},
            False,
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            True,
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}},
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
            False,
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
            {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "additionalProperties": False,
            },
            False,
        ),
        # Ranges are checked at run time, not statically.
        ({"type": "string"}, {"type": "string", "minLength": 3}, True),
    ],
)
def test_compatibility(source, target, fits):
    assert (compatibility_problems(source, target) == []) is fits
