import pytest

from keel.rllm.schema import (
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


def test_person_schema_is_accepted():
    assert check_schema(PERSON) == []


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "string"},
        {"type": "string", "pattern": "^[a-z]+$", "format": "email"},
        {"const": 3},
        {"anyOf": [{"type": "string"}, {"type": "null"}]},
        {"oneOf": [{"type": "integer"}, {"type": "string", "minLength": 2.0}]},
        {"$defs": {"A": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/A"}},
        {"description": "no type at all"},
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": False},
        {"type": "object", "patternProperties": {"^x-": {}}, "unevaluatedProperties": False},
        {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.5, "title": "t"},
        {"type": "object", "x-vendor": 1},  # an unknown keyword far from any is an annotation
        True,
    ],
)
def test_standard_schemas_are_accepted(schema):
    assert check_schema(schema, where="s") == []


@pytest.mark.parametrize(
    ("schema", "path", "words"),
    [
        ({"type": "string", "minLenght": 2}, "s.minLenght", "did you mean 'minLength'?"),
        ({"type": "string", "maxlength": 2}, "s.maxlength", "did you mean 'maxLength'?"),
        ({"properties": {"a": {"tpye": "string"}}}, "s.properties.a.tpye", "'type'?"),
        ({"$ref": "https://example.com/s.json"}, "s.$ref", "not a local reference"),
        ({"items": {"$ref": "other.json#/x"}}, "s.items.$ref", "nothing is fetched"),
        ({"$ref": "#/$defs/Missing"}, "s.$ref", "points to nothing"),
        ({"$schema": "http://example.com/my-draft"}, "s.$schema", "unsupported $schema"),
        ({"$schema": "http://json-schema.org/draft-03/schema#"}, "s.$schema", "unsupported"),
        ({"$schema": {"a": 1}}, "s.$schema", "unsupported $schema"),
        ({"type": "text"}, "s.type", 'unknown type "text"'),
        ({"type": "string", "pattern": "("}, "s.pattern", "not a valid regular expression"),
        ({"type": "integer", "maxLength": 3}, "s.maxLength", "has no effect on type"),
        ({"type": "integer", "pattern": "x"}, "s.pattern", "has no effect on type"),
        ({"type": "integer", "minimum": 5, "maximum": 1}, "s.minimum", "greater than maximum"),
        ({"type": "string", "minLength": 5, "maxLength": 2.0}, "s.minLength", "(5) is greater"),
        ({"type": "array", "minItems": 3, "maxItems": 1}, "s.minItems", "greater than maxItems"),
        ({"minProperties": 3, "maxProperties": 1}, "s.minProperties", "greater than maxP"),
        ({"exclusiveMinimum": 3, "exclusiveMaximum": 3}, "s.exclusiveMinimum", "leaves nothing"),
        ({"type": "string", "minLength": -1}, "s.minLength", "less than the minimum of 0"),
        ({"type": "string", "minLength": 1.5}, "s.minLength", "must be integer"),
        ({"type": "string", "enum": []}, "s.enum", "non-empty list"),
        ({"enum": [1, 1]}, "s.enum", "listed twice"),
        (
            {"type": "object", "required": ["nmae"], "properties": {"name": {}}},
            "s.required",
            "did you mean 'name'?",
        ),
        (
            {"required": ["x"], "properties": {}, "additionalProperties": False},
            "s.required",
            "no other property is allowed",
        ),
        ({"type": "integer", "default": "x"}, "s.default", "default does not match"),
        (
            {
                "$defs": {"A": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                "properties": {"a": {"$ref": "#/$defs/A", "default": {"n": "one"}}},
            },
            "s.properties.a.default",
            'default does not match the schema: $.n: expected integer, got string "one"',
        ),
        ({"type": "array", "items": {"type": "strin"}}, "s.items.type", "unknown type"),
        ({"type": "object", "additionalProperties": 3}, "s.additionalProperties", "got integer"),
        ([1], "s", "a schema must be a mapping"),
    ],
)
def test_mistakes_are_refused_with_their_path(schema, path, words):
    issues = check_schema(schema, where="s")
    assert any(i.path == path and words in i.message for i in issues), issues


def test_required_name_missing_from_an_open_object_is_allowed():
    # JSON Schema allows it (the property may come without a schema); only a near-miss
    # of a declared name, or a closed object, makes it a mistake.
    assert check_schema({"required": ["zzz"], "properties": {"name": {}}}) == []


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


@pytest.mark.parametrize(
    ("schema", "value", "lines"),
    [
        ({"type": "string", "pattern": "^a"}, "b", ["$: must match the pattern '^a', got \"b\""]),
        ({"const": 3}, 4, ["$: must be 3, got 4"]),
        ({"type": "integer", "exclusiveMinimum": 0}, 0, ["$: must be > 0, got 0"]),
        ({"type": "string", "minLength": 2.0}, "a", ["$: must have at least 2 characters, got 1"]),
        ({"type": "array", "uniqueItems": True}, [1, 1], ["$: items must be unique"]),
        ({"type": "array", "items": False}, [1], ["$: must have at most 0 items, got 1"]),
        ({"not": {"type": "null"}}, None, ['$: must not match {"type": "null"}, got null']),
        (
            {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "x",
            ['$: expected integer or null, got string "x"'],
        ),
        (
            {"oneOf": [{"type": "integer"}, {"type": "number"}]},
            1,
            ["$: matches more than one of the allowed forms (oneOf), got 1"],
        ),
        (
            # A discriminated union: the branch whose 'kind' matches gives the issues.
            {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "a"}, "n": {"type": "integer"}},
                    },
                    {
                        "type": "object",
                        "properties": {"kind": {"const": "b"}, "s": {"type": "string"}},
                    },
                ]
            },
            {"kind": "b", "s": 1},
            ["$.s: expected string, got integer 1"],
        ),
        (
            {"$defs": {"P": {"type": "object", "required": ["x"]}}, "items": {"$ref": "#/$defs/P"}},
            [{}],
            ["$[0].x: required property is missing"],
        ),
    ],
)
def test_messages_for_the_wider_keywords(schema, value, lines):
    assert [i.line() for i in validate_instance(schema, value)] == lines


# -- boolean schemas: a valid schema never crashes validation ------------------------
BOOLEAN_FORMS = [
    {"anyOf": [False, False]},
    {"oneOf": [False, False, False]},
    {"anyOf": [False, {"type": "string"}]},
    {"oneOf": [False, {"type": "integer", "minimum": 5}]},
    {"anyOf": [{"anyOf": [False]}, False]},
    {"allOf": [False]},
    {"not": True},
    {"properties": {"a": False}},
    {"items": False},
    {"anyOf": [False, True]},
    {"oneOf": [True, True]},
]


@pytest.mark.parametrize("schema", BOOLEAN_FORMS)
@pytest.mark.parametrize("value", [1, "s", None, {"a": 1}, [1]])
def test_boolean_subschemas_refuse_or_accept_without_crashing(schema, value):
    check_schema(schema)
    issues = validate_instance(schema, value)
    assert all(i.message and i.path.startswith("$") for i in issues)


def test_boolean_branches_are_refused_in_plain_words():
    [issue] = validate_instance({"anyOf": [False, False]}, 1)
    assert issue.message == "matches none of the 2 allowed forms (anyOf), got 1"
    [issue] = validate_instance({"oneOf": [False, False, False]}, "x")
    assert "none of the 3 allowed forms (oneOf)" in issue.message
    # A 'false' branch is never the form meant: the other branch's wording is used.
    [issue] = validate_instance({"anyOf": [False, {"type": "string"}]}, 1)
    assert issue.message == "expected string, got integer 1"
    [issue] = validate_instance({"oneOf": [False, {"type": "integer", "minimum": 5}]}, 1)
    assert issue.message == "must be >= 5, got 1"
    assert validate_instance({"anyOf": [False, True]}, 1) == []
