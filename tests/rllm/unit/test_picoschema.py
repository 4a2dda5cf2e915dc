"""Picoschema shorthand compiled to JSON Schema, and how the frontmatter tells them apart."""

from __future__ import annotations

import pytest
import yaml

from keel.rllm.errors import MetadataValidationError
from keel.rllm.parser import parse_text
from keel.rllm.picoschema import PicoschemaError, compile_picoschema, is_json_schema
from keel.rllm.schema import check_schema, validate_instance
from store.files import load_rllm

PRODUCT = yaml.safe_load(
    """
id: string, Unique identifier
description?: string, Optional detailed description
price: number
stock: integer
active: boolean
nothing: "null"
anything: any, Whatever it is
category(enum, Main category): [ELECTRONICS, BOOKS]
tags(array, List of tags): string
primaryImage:
  url: string, URL of the image
attributes(object, Custom attributes):
  (*): any, Any attribute
variants?(array):
  id: string
"""
)


def test_compiles_the_dotprompt_reference_example():
    assert compile_picoschema(PRODUCT) == {
        "type": "object",
        "properties": {
            "id": {"type": "string", "description": "Unique identifier"},
            "description": {
                "type": ["string", "null"],
                "description": "Optional detailed description",
            },
            "price": {"type": "number"},
            "stock": {"type": "integer"},
            "active": {"type": "boolean"},
            "nothing": {"type": "null"},
            "anything": {"description": "Whatever it is"},
            "category": {"enum": ["ELECTRONICS", "BOOKS"], "description": "Main category"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "List of tags"},
            "primaryImage": {
                "type": "object",
                "properties": {"url": {"type": "string", "description": "URL of the image"}},
                "required": ["url"],
                "additionalProperties": False,
            },
            "attributes": {
                "type": "object",
                "properties": {},
                "additionalProperties": {"description": "Any attribute"},
                "description": "Custom attributes",
            },
            "variants": {
                "type": ["array", "null"],
                "items": {
                    "type": "object",
                    "properties": {"id": {"type": "string"}},
                    "required": ["id"],
                    "additionalProperties": False,
                },
            },
        },
        "required": [
            "id",
            "price",
            "stock",
            "active",
            "nothing",
            "anything",
            "category",
            "tags",
            "primaryImage",
            "attributes",
        ],
        "additionalProperties": False,
    }


def test_compiled_schema_is_sound_and_validates():
    schema = compile_picoschema(PRODUCT)
    assert check_schema(schema) == []
    good = {
        "id": "p1",
        "price": 9.5,
        "stock": 3,
        "active": True,
        "nothing": None,
        "anything": [1],
        "category": "BOOKS",
        "tags": ["a"],
        "primaryImage": {"url": "u"},
        "attributes": {"colour": "red", "size": 4},
        "description": None,
    }
    assert validate_instance(schema, good) == []
    bad = {**good, "category": "FOOD", "variants": [{"id": 1}], "extra": 1}
    assert [i.line() for i in validate_instance(schema, bad)] == [
        '$.category: must be one of ["ELECTRONICS", "BOOKS"], got "FOOD"',
        "$.extra: property is not allowed; allowed: active, anything, attributes, category, "
        "description, id, nothing, price, primaryImage, stock, tags, variants",
        "$.variants[0].id: expected string, got integer 1",
    ]


def test_optional_enum_accepts_null():
    schema = compile_picoschema({"mood?(enum)": ["happy", "sad"]})
    assert schema["properties"]["mood"] == {"enum": ["happy", "sad", None]}
    assert "required" not in schema


@pytest.mark.parametrize(
    ("pico", "path", "words"),
    [
        ({"a": "text"}, "s.a", "unknown type 'text'"),
        ({"a(list)": "string"}, "s.a(list)", "unknown kind 'list'"),
        ({"a(enum)": []}, "s.a(enum)", "non-empty list"),
        ({"a(object)": "string"}, "s.a(object)", "takes a mapping"),
        ({"a": 3}, "s.a", "expected a type name or a mapping of fields, got integer"),
        ({"a": None}, "s.a", "write 'null' in quotes"),
        ({"b": {"c(array)": "strin, x"}}, "s.b.c(array)", "unknown type 'strin'"),
    ],
)
def test_picoschema_errors_name_the_key(pico, path, words):
    with pytest.raises(PicoschemaError) as info:
        compile_picoschema(pico, where="s")
    assert info.value.issue.path == path and words in info.value.issue.message


@pytest.mark.parametrize(
    ("schema", "json_schema"),
    [
        ({"type": "object", "properties": {}}, True),
        ({"properties": {"a": {}}}, True),
        ({"$schema": "https://json-schema.org/draft/2020-12/schema"}, True),
        ({"$ref": "#/$defs/A", "$defs": {}}, True),
        ({"text": "string"}, False),
        ({"text?": "string", "n(array)": "integer"}, False),
    ],
)
def test_json_schema_is_told_from_picoschema_by_its_top_level_keys(schema, json_schema):
    assert is_json_schema(schema) is json_schema


APP = """---
name: pico
description: Picoschema app.
version: 1.0.0
author: tests
max_context_window: 512
input_schema:
  text: string, The text
  lang?(enum): [en, fr]
output_schema:
  answer: string
  labels(array): string
llm: {provider: keel, model: local}
llm_params: {temperature: 0, max_tokens: 64}
---
Label {{ text }} ({{ lang }}).
"""


def test_app_with_picoschema_keeps_the_compiled_schema():
    program = parse_text(APP)
    assert program.input_schema["required"] == ["text"]
    assert program.input_schema["properties"]["lang"] == {"enum": ["en", "fr", None]}
    assert program.output_schema["properties"]["labels"] == {
        "type": "array",
        "items": {"type": "string"},
    }


def test_app_with_bad_picoschema_points_at_the_key(tmp_path):
    path = tmp_path / "bad.rllm"
    path.write_text(APP.replace("labels(array): string", "labels(array): strng"))
    with pytest.raises(MetadataValidationError) as info:
        load_rllm(path)
    err = info.value
    assert err.details["key"] == "output_schema.labels(array)"
    assert err.details["line"] == 12
    assert "unknown type 'strng'" in err.message
