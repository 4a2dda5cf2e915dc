"""The JSON form of a step answer (what a schema-constrained server returns), thinking
models' reasoning around either form, and truncated answers."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.srl.errors import StepFormatError
from keel.srl.step import LANGUAGES, PatternAction, RuleAction, parse_step, step_schema

ACTION = {"pattern": "divide($A, $B)", "rewrite": "divide($B, $A)", "language": "python"}
ANSWER = {
    "think": "swap the arguments",
    "action": ACTION,
    "state_update": {"decisions": ["swap"], "next_focus": "done"},
}
TAGS = (
    "<think>swap the arguments</think>"
    f"<action>{json.dumps(ACTION)}</action>"
    '<state_update>{"decisions": ["swap"]}</state_update>'
)


def test_a_json_answer_is_a_step() -> None:
    step = parse_step(json.dumps(ANSWER))
    assert step.think == "swap the arguments"
    assert isinstance(step.action, PatternAction)
    assert (step.action.pattern, step.action.rewrite) == ("divide($A, $B)", "divide($B, $A)")
    assert step.state_update.decisions == ["swap"]
    assert step.action.language == "python"


def test_the_schema_accepts_exactly_what_the_parser_reads() -> None:
    schema = step_schema("python")
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(ANSWER, schema)
    # The schema holds the model to the task's language.
    wrong = {**ANSWER, "action": {**ACTION, "language": "java"}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(wrong, schema)
    for lang in LANGUAGES:
        assert step_schema(lang)["properties"]["action"]["properties"]["language"]["enum"] == [lang]


@given(
    think=st.text(max_size=50),
    pattern=st.text(min_size=1, max_size=40).filter(str.strip),
    rewrite=st.text(max_size=40),
    decisions=st.lists(st.text(min_size=1, max_size=20).filter(str.strip), max_size=3),
)
def test_every_schema_valid_answer_parses(
    think: str, pattern: str, rewrite: str, decisions: list[str]
) -> None:
    """In format by construction: whatever a constrained server returns, the parser takes."""
    answer = {
        "think": think,
        "action": {"pattern": pattern, "rewrite": rewrite, "language": "python"},
        "state_update": {"decisions": decisions},
    }
    jsonschema.validate(answer, step_schema("python"))
    step = parse_step(json.dumps(answer))
    assert isinstance(step.action, PatternAction) and step.action.pattern == pattern


def test_a_json_answer_may_carry_a_yaml_rule_as_its_action() -> None:
    rule = "id: swap\nlanguage: python\nrule:\n  pattern: divide($A, $B)\nfix: divide($B, $A)\n"
    step = parse_step(json.dumps({**ANSWER, "action": rule}))
    assert isinstance(step.action, RuleAction) and step.action.rule["fix"] == "divide($B, $A)"


@pytest.mark.parametrize(
    ("answer", "kind"),
    [
        ("{not json", "bad_json"),
        (json.dumps({"think": "x"}), "missing_tag"),
        (json.dumps({**ANSWER, "extra": 1}), "bad_action"),
        (json.dumps({**ANSWER, "action": 5}), "bad_action"),
        (json.dumps({**ANSWER, "action": {"pattern": "x"}}), "bad_action"),
        (json.dumps({**ANSWER, "state_update": {"nope": 1}}), "bad_state_update"),
        (json.dumps({**ANSWER, "think": 3}), "bad_action"),
        ("[1, 2]", "missing_tag"),
    ],
)
def test_a_bad_json_answer_is_a_format_error(answer: str, kind: str) -> None:
    with pytest.raises(StepFormatError) as info:
        parse_step(answer)
    assert info.value.kind == kind


def test_reasoning_before_a_json_answer_fills_an_empty_think() -> None:
    """Qwen3-style output: the reasoning block comes first, in the content or moved back
    from ``reasoning_content``; it must not make a good answer malformed."""
    answer = "<think>I should swap.</think>\n" + json.dumps({**ANSWER, "think": ""})
    assert parse_step(answer).think == "I should swap."
    own = "<think>long reasoning</think>" + json.dumps(ANSWER)
    assert parse_step(own).think == "swap the arguments"


def test_reasoning_before_a_tag_answer_is_not_a_duplicate_think() -> None:
    step = parse_step("<think>a long chain of thought</think>\n\n" + TAGS)
    assert step.think == "swap the arguments"
    # A tag answer alone, or with its think block only, parses as before.
    assert parse_step(TAGS).think == "swap the arguments"


def test_an_answer_cut_at_the_token_limit_is_truncated_not_malformed() -> None:
    cut = json.dumps(ANSWER)[:40]
    with pytest.raises(StepFormatError) as info:
        parse_step(cut, finish_reason="length")
    assert info.value.kind == "truncated"
    with pytest.raises(StepFormatError) as plain:
        parse_step(cut, finish_reason="stop")
    assert plain.value.kind == "bad_json"
    # A whole answer that happens to end at the limit is still a step.
    assert parse_step(json.dumps(ANSWER), finish_reason="length").think
