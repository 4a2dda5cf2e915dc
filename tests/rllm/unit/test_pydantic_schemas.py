"""``.rllm`` apps whose schemas come from pydantic's ``model_json_schema()``."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from keel.rllm import check_output, validate_input
from keel.rllm.errors import DependencyResolutionError, InputSchemaError, ParseError
from keel.rllm.parser import parse_text
from keel.rllm.render import render_recovery
from store.files import load_rllm_app
from tests.support.pydantic_schemas import TicketIn, TicketOut, ticket_app

GOOD_INPUT = {
    "text": "My parcel never came.",
    "customer": {"name": "Ada", "email": "ada@example.org", "address": {"city": "Lyon"}},
}
GOOD_ANSWER = {
    "priority": "high",
    "summary": "Parcel lost",
    "actions": [{"kind": "refund", "amount": 12.5}, {"kind": "reply"}],
}


@pytest.fixture(scope="module")
def program():
    return parse_text(ticket_app())


def test_pydantic_schemas_load_as_they_are(program):
    assert "$defs" in program.input_schema and "$defs" in program.output_schema
    assert program.output_schema == TicketOut.model_json_schema()


def test_valid_input_gets_defaults_through_refs_and_fits_the_model(program):
    filled = validate_input(program, GOOD_INPUT)
    assert filled["channel"] == "mail"
    # Defaults of a nested model reached through $ref are filled too.
    assert filled["customer"]["address"] == {"city": "Lyon", "postcode": None}
    assert filled["customer"]["billing"] is None
    TicketIn.model_validate(filled)


@pytest.mark.parametrize(
    ("change", "lines"),
    [
        (
            {"customer": {"name": "Ada", "email": "ada@example.org", "address": {"city": "L"}}},
            ["$.customer.address.city: must have at least 2 characters, got 1"],
        ),
        (
            {"customer": {"name": "Ada", "email": "not-an-email", "address": {"city": "Lyon"}}},
            ['$.customer.email: must be a valid email, got "not-an-email"'],
        ),
        (
            {
                "customer": {
                    "name": "Ada",
                    "email": "ada@example.org",
                    "address": {"city": "Lyon"},
                    "billing": {"postcode": 69001},
                }
            },
            [
                "$.customer.billing.city: required property is missing",
                "$.customer.billing.postcode: expected string or null, got integer 69001",
            ],
        ),
        ({"channel": "fax"}, ['$.channel: must be one of ["mail", "chat"], got "fax"']),
        ({"customer": None}, ["$.customer: expected object, got null null"]),
    ],
)
def test_invalid_input_names_the_path(program, change, lines):
    with pytest.raises(InputSchemaError) as info:
        validate_input(program, {**GOOD_INPUT, **change})
    issues = info.value.details["issues"]
    assert [f"{i['path']}: {i['message']}" for i in issues] == lines


def test_valid_answer_fits_the_model(program):
    check = check_output(json.dumps(GOOD_ANSWER), program.llm_output_schema())
    assert check.ok and check.value is not None
    TicketOut.model_validate(check.value)


def test_bad_answer_issues_and_recovery_prompt_name_the_paths(program):
    bad = json.dumps(
        {
            "priority": "urgent",
            "summary": "x" * 90,
            "actions": [{"kind": "refund", "amount": -3}, {"kind": "call"}],
            "follow_up": {"city": 7},
        }
    )
    check = check_output(bad, program.llm_output_schema())
    lines = [i.line() for i in check.issues]
    assert lines == [
        "$.actions[0].amount: must be >= 0, got -3",
        '$.actions[1].kind: must be one of ["refund", "reply", "escalate"], got "call"',
        "$.follow_up.city: expected string, got integer 7",
        '$.priority: must be one of ["low", "high"], got "urgent"',
        "$.summary: must have at most 80 characters, got 90",
    ]
    prompt = render_recovery(None, check.issues, bad, program.llm_output_schema())
    for line in lines:
        assert f"- {line}" in prompt


def test_template_fields_are_checked_through_refs():
    # Address forbids extra keys, so a misspelt field behind two $refs is caught at load.
    parse_text(ticket_app(prompt="{{ text }} from {{ customer.address.city }}\n"))
    with pytest.raises(ParseError) as info:
        parse_text(ticket_app(prompt="{{ text }} from {{ customer.address.town }}\n"))
    assert "'customer.address' has no property 'town'" in info.value.message


CITY_APP = """---
name: city
description: Says something about a city.
version: 1.0.0
author: tests
max_context_window: 1024
input_schema:
  city: {type}
output_schema:
  answer: string
llm: {{provider: keel, model: local}}
llm_params: {{temperature: 0, max_tokens: 64}}
---
About {{{{ city }}}}.
"""

USES_CITY = (
    "uses:\n  - path: city.rllm\n    alias: geo\n"
    "    input_map: {city: customer.address.city}\n    exposes: [answer]\n"
)


@pytest.mark.parametrize(("child_type", "fits"), [("string", True), ("integer", False)])
def test_composition_reads_parent_fields_through_refs(tmp_path, child_type, fits):
    (tmp_path / "city.rllm").write_text(CITY_APP.format(type=child_type))
    (tmp_path / "ticket.rllm").write_text(ticket_app(extra=USES_CITY))
    if fits:
        assert load_rllm_app(tmp_path / "ticket.rllm").graph.edges[0].alias == "geo"
        return
    with pytest.raises(DependencyResolutionError) as info:
        load_rllm_app(tmp_path / "ticket.rllm")
    assert "city: may be string but integer is expected" in info.value.message


class Node(BaseModel):
    name: str
    children: list[Node] = []


def test_recursive_model_with_a_top_level_ref_is_inlined_at_the_top():
    schema = Node.model_json_schema()
    assert set(schema) == {"$defs", "$ref"}  # what pydantic exports for a recursive model
    text = ticket_app().replace(
        f"output_schema: {json.dumps(TicketOut.model_json_schema())}",
        f"output_schema: {json.dumps(schema)}",
    )
    program = parse_text(text)
    assert "$ref" not in program.output_schema
    assert program.output_schema["required"] == ["name"]
    bad = '{"name": "root", "children": [{"name": "a", "children": [{"children": []}]}]}'
    check = check_output(bad, program.llm_output_schema())
    assert [i.line() for i in check.issues] == [
        "$.children[0].children[0].name: required property is missing"
    ]
