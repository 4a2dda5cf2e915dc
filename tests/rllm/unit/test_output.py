import pytest

from keel.rllm.errors import OutputSchemaError, RetryExhaustedError
from keel.rllm.output import (
    check_output,
    extract_json,
    parse_output,
    retry_exhausted,
    validate_output,
)

SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["summary", "sentences"],
    "properties": {
        "summary": {"type": "string", "minLength": 1},
        "sentences": {"type": "integer", "minimum": 1},
    },
}
GOOD = {"summary": "Cats sit.", "sentences": 1}


@pytest.mark.parametrize(
    "answer",
    [
        '{"summary": "Cats sit.", "sentences": 1}',
        '  \n{"summary": "Cats sit.", "sentences": 1}\n',
        '```json\n{"summary": "Cats sit.", "sentences": 1}\n```',
        'Here you go:\n```\n{"summary": "Cats sit.", "sentences": 1}\n```\nAnything else?',
        'Sure! {"summary": "Cats sit.", "sentences": 1} Hope it helps {not json}',
        'Note {draft} then {"summary": "Cats sit.", "sentences": 1}',
    ],
)
def test_finds_the_object(answer):
    assert parse_output(answer, SCHEMA) == GOOD


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ("", "the answer is empty"),
        ("The summary is: cats.", "no JSON object found: the answer contains no '{'"),
        ("[1, 2]", "expected a JSON object, got array"),
        ('{"summary": "x", "sentences": 1,}', "no complete JSON object found"),
        ('{"summary": NaN}', "no complete JSON object found"),
    ],
)
def test_no_object(answer, message):
    value, issues = extract_json(answer)
    assert value is None
    assert len(issues) == 1 and issues[0].path == "$"
    assert issues[0].message.startswith(message)


def test_schema_mismatch_raises_with_all_issues_and_the_raw_answer():
    raw = '{"summary": "", "sentences": "1", "extra": true}'
    with pytest.raises(OutputSchemaError) as info:
        parse_output(raw, SCHEMA)
    err = info.value
    assert [i["path"] for i in err.details["issues"]] == ["$.extra", "$.sentences", "$.summary"]
    assert err.details["parsed"] == {"summary": "", "sentences": "1", "extra": True}
    assert err.received_payload == raw
    assert err.expected_schema == SCHEMA
    assert "(and 2 more)" in err.message


def test_check_output_does_not_raise():
    ok = check_output('{"summary": "Cats sit.", "sentences": 1}', SCHEMA)
    assert ok.ok and ok.value == GOOD and ok.issues == []
    bad = check_output('{"summary": "Cats sit."}', SCHEMA)
    assert not bad.ok and bad.value == {"summary": "Cats sit."}
    assert bad.issues[0].line() == "$.sentences: required property is missing"


def test_validate_output_for_built_values():
    assert validate_output(GOOD, SCHEMA) == GOOD
    with pytest.raises(OutputSchemaError) as info:
        validate_output({"summary": "x", "sentences": 0}, SCHEMA)
    assert info.value.received_payload == {"summary": "x", "sentences": 0}
    assert "final output" in info.value.message


def test_retry_exhausted_keeps_every_attempt():
    attempts = [check_output("no", SCHEMA), check_output('{"summary": "x"}', SCHEMA)]
    err = retry_exhausted(attempts, SCHEMA, max_retries=1)
    assert isinstance(err, RetryExhaustedError)
    assert [a["attempt"] for a in err.details["attempts"]] == [1, 2]
    assert err.details["attempts"][1]["output"] == '{"summary": "x"}'
    assert err.received_payload == '{"summary": "x"}'
    assert "after 2 attempts" in err.message
