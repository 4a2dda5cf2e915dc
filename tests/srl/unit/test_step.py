"""keel.srl.step: parsing answers into Steps, and nothing but StepFormatError otherwise."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.srl.errors import StepFormatError
from keel.srl.step import (
    FORMAT_ERROR_KINDS,
    PatternAction,
    RuleAction,
    Step,
    action_text,
    parse_step,
)

PATTERN = json.dumps({"pattern": "print($A)", "rewrite": "logger.info($A)", "language": "py"})
RULE = """id: no-print
language: Python
rule:
  pattern: print($A)
  not:
    inside:
      kind: function_definition
fix: logger.info($A)
"""


def answer(action: str, update: str = '{"decisions": ["use logger"]}') -> str:
    return (
        f"Sure.\n<think>print calls should log</think>\n<action>{action}</action>\n"
        f"<state_update>{update}</state_update>"
    )


def test_json_action() -> None:
    step = parse_step(answer(PATTERN))
    assert step.think == "print calls should log"
    assert step.action == PatternAction(
        pattern="print($A)", rewrite="logger.info($A)", language="python"
    )
    assert step.state_update.decisions == ["use logger"]


def test_yaml_rule_action_in_a_fence() -> None:
    step = parse_step(answer(f"```yaml\n{RULE}```"))
    assert isinstance(step.action, RuleAction)
    assert step.action.language == "python"
    assert step.action.rule["fix"] == "logger.info($A)"
    assert step.action.yaml_text.strip() == RULE.strip()


@pytest.mark.parametrize(
    ("text", "kind", "fragment"),
    [
        ("<think>x</think><state_update>{}</state_update>", "missing_tag", "<action>"),
        ("<think>x</think><action>{}", "missing_tag", "</action>"),
        (answer(PATTERN) + "<think>again</think>", "duplicate_tag", "<think>"),
        (answer("   "), "empty_action", "empty"),
        (answer('{"pattern": "a", '), "bad_json", "JSON"),
        (answer('{"pattern": "a", "rewrite": "b"}'), "bad_action", "language"),
        (
            answer('{"pattern": "a", "rewrite": "b", "language": "cobol"}'),
            "unknown_language",
            "cobol",
        ),
        (
            answer('{"pattern": "", "rewrite": "b", "language": "java"}'),
            "bad_action",
            "pattern",
        ),
        (answer("id: x\nlanguage: go\nrule: {pattern: a}"), "unknown_language", "go"),
        (answer("id: x\nlanguage: java\nrule: {patern: a}"), "bad_action", "patern"),
        (answer("id: x\nlanguage: java"), "bad_action", "rule"),
        (answer("key: [unclosed"), "bad_yaml", "YAML"),
        (answer("just some words"), "bad_action", "neither"),
        (answer(PATTERN, '{"goals": "one"}'), "bad_state_update", "goals"),
        (answer(PATTERN, "{not json"), "bad_state_update", "JSON"),
        ("x" * 300_000, "too_long", "limit"),
    ],
)
def test_malformed_answers(text: str, kind: str, fragment: str) -> None:
    with pytest.raises(StepFormatError) as err:
        parse_step(text)
    assert err.value.kind == kind
    assert kind in FORMAT_ERROR_KINDS
    assert fragment in err.value.detail


def test_typescript_and_java_aliases() -> None:
    ts = parse_step(answer('{"pattern": "a", "rewrite": "b", "language": "TS"}'))
    java = parse_step(answer("id: r\nlanguage: Java\nrule:\n  any: [{kind: a}, {pattern: b}]"))
    assert ts.action.language == "typescript"
    assert java.action.language == "java"


def test_action_text_of_a_model_action_matches_the_json_form() -> None:
    action = PatternAction(pattern="a", rewrite="b", language="java")
    assert json.loads(action_text(action)) == {"pattern": "a", "rewrite": "b", "language": "java"}


def _outcome(text: str) -> Step | StepFormatError:
    try:
        return parse_step(text)
    except StepFormatError as exc:
        return exc


@settings(max_examples=300)
@given(st.text(max_size=400))
def test_fuzz_any_string(text: str) -> None:
    assert isinstance(_outcome(text), Step | StepFormatError)


fragments = st.sampled_from(
    [
        "<think>",
        "</think>",
        "<action>",
        "</action>",
        "<state_update>",
        "</state_update>",
        "{",
        "}",
        "[",
        '"pattern"',
        '"language": "python"',
        ":",
        ",",
        "\n",
        "id: r",
        "rule:",
        "  pattern: a",
        "language: ts",
        "```",
        "&",
        "*a",
        "!!python/object:os.system",
        "[" * 200,
    ]
)


@settings(max_examples=400)
@given(st.lists(fragments | st.text(max_size=8), max_size=30).map("".join))
def test_fuzz_tag_shaped_strings(text: str) -> None:
    outcome = _outcome(text)
    assert isinstance(outcome, Step | StepFormatError)
    if isinstance(outcome, StepFormatError):
        assert outcome.kind in FORMAT_ERROR_KINDS
