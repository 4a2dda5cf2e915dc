from pathlib import Path

import pytest

from keel.rllm import (
    EXIT_CODES,
    ContextWindowExceededError,
    InputSchemaError,
    OutputSchemaError,
    PythonBlockExecutionError,
    apply_block_outputs,
    block_failed,
    block_inputs,
    check_context_window,
    check_output,
    child_input,
    coerce_input,
    exposed_output,
    merge_output,
    ollama_model_missing,
    render_prompt,
    render_recovery,
    template_variables,
    validate_input,
    validate_output,
)
from store.files import load_rllm

EXAMPLES = Path(__file__).parents[3] / "examples"


@pytest.fixture(scope="module")
def summary():
    return load_rllm(EXAMPLES / "summary.rllm")


@pytest.fixture(scope="module")
def keywords():
    return load_rllm(EXAMPLES / "extract_keywords.rllm")


@pytest.fixture(scope="module")
def compose():
    return load_rllm(EXAMPLES / "compose_summary_keywords.rllm")


def test_bare_string_becomes_the_single_required_string_input(summary):
    assert coerce_input(summary, "Cats sit.") == {"text": "Cats sit."}
    assert coerce_input(summary, {"text": "x"}) == {"text": "x"}
    # Numbers in strings are not converted: the schema check must see what was given.
    assert coerce_input(summary, 5) == 5


def test_valid_input_gets_defaults(summary):
    assert validate_input(summary, {"text": "Cats sit."}) == {
        "text": "Cats sit.",
        "max_sentences": 2,
    }


@pytest.mark.parametrize(
    ("value", "paths"),
    [
        ({}, ["$.text"]),
        ({"text": 3}, ["$.text"]),
        ({"text": "x", "max_sentences": 0}, ["$.max_sentences"]),
        ({"text": "x", "max_sentences": 2.5}, ["$.max_sentences"]),
        ({"text": "x", "language": "fr"}, ["$.language"]),
        ({"text": "x" * 6001}, ["$.text"]),
        ("just a string", ["$"]),
        ([{"text": "x"}], ["$"]),
    ],
)
def test_invalid_input(summary, value, paths):
    with pytest.raises(InputSchemaError) as info:
        validate_input(summary, value)
    err = info.value
    assert [i["path"] for i in err.details["issues"]] == paths
    assert err.expected_schema == summary.input_schema
    assert err.received_payload == value


def test_summary_prompt_renders_exactly(summary):
    inputs = validate_input(summary, {"text": "The cat sat.\nIt purred."})
    prompt = render_prompt(summary, template_variables(summary, inputs))
    assert prompt == (
        "Summarise the text in at most 2 sentences.\n"
        "Reply with only a JSON object in this form:\n"
        '{"summary": "...", "sentences": 1}\n'
        "\n"
        "Text:\n"
        "The cat sat.\nIt purred.\n"
        "\n"
        "JSON:\n"
    )
    assert check_context_window(prompt, summary.max_context_window, summary.max_tokens) < 100


def test_long_input_is_stopped_before_the_call(summary):
    inputs = validate_input(summary, {"text": "word " * 1199})
    prompt = render_prompt(summary, template_variables(summary, inputs))
    # 6000 bytes of text (1500 tokens) fit the 2048 window with 200 answer tokens...
    check_context_window(prompt, summary.max_context_window, summary.max_tokens)
    # ...but not a window the app declares smaller.
    with pytest.raises(ContextWindowExceededError):
        check_context_window(prompt, 1500, summary.max_tokens)


def test_recovery_prompt_for_the_summary_app(summary):
    inputs = validate_input(summary, {"text": "Cats sit."})
    variables = template_variables(summary, inputs)
    bad = check_output('{"summary": "Cats sit.", "sentences": "one"}', summary.llm_output_schema())
    out = render_recovery(
        summary.recovery_template,
        bad.issues,
        bad.raw,
        summary.llm_output_schema(),
        prompt=render_prompt(summary, variables),
        variables=variables,
    )
    assert 'Your last reply was not valid:\n{"summary": "Cats sit.", "sentences": "one"}\n' in out
    assert 'Problems:\n- $.sentences: expected integer, got string "one"\n' in out
    assert out.startswith("Summarise the text in at most 2 sentences.\n\nText:\nCats sit.\n")


def test_pre_block_flow_of_extract_keywords(keywords):
    inputs = validate_input(keywords, {"text": "cats  and\n dogs"})
    pre = keywords.pre_blocks[0]
    assert block_inputs(pre, inputs) == {"text": "cats  and\n dogs"}
    # What the sandbox would return for the block's declared outputs.
    produced = {"clean_text": " ".join(inputs["text"].split())}
    scope = apply_block_outputs(pre, {}, produced)
    prompt = render_prompt(keywords, template_variables(keywords, inputs, pre_outputs=scope))
    assert "Text:\ncats and dogs\n" in prompt
    assert "List the 5 most important keywords" in prompt
    with pytest.raises(PythonBlockExecutionError) as info:
        apply_block_outputs(pre, {}, {})
    assert info.value.details["missing"] == ["clean_text"]


def test_post_block_result_is_validated_again(keywords):
    post = keywords.post_blocks[0]
    output = {"keywords": ["Cats", "cats", "dogs"]}
    variables = {**validate_input(keywords, {"text": "x"}), **output}
    assert block_inputs(post, variables) == {
        "keywords": ["Cats", "cats", "dogs"],
        "max_keywords": 5,
    }
    fixed = apply_block_outputs(post, output, {"keywords": ["Cats", "dogs"]})
    assert validate_output(fixed, keywords.output_schema) == {"keywords": ["Cats", "dogs"]}
    with pytest.raises(OutputSchemaError):
        validate_output(apply_block_outputs(post, output, {"keywords": []}), keywords.output_schema)


def test_composition_inputs_and_merged_output(compose):
    inputs = validate_input(compose, {"text": "Cats sit. Dogs run."})
    first, second = compose.uses
    assert child_input(first, inputs) == {"text": "Cats sit. Dogs run."}
    assert child_input(second, inputs) == {"text": "Cats sit. Dogs run."}
    children = {
        "summarised": {"summary": "Animals move.", "sentences": 1},
        "keywords_of": {"keywords": ["cats", "dogs"]},
    }
    assert exposed_output(first, children["summarised"]) == {"summary": "Animals move."}
    assert merge_output(compose, None, children) == {
        "summary": "Animals move.",
        "keywords": ["cats", "dogs"],
    }
    variables = template_variables(compose, inputs, child_outputs=children)
    # Only exposed fields are visible to the parent.
    assert variables["summarised"] == {"summary": "Animals move."}
    with pytest.raises(OutputSchemaError) as info:
        merge_output(compose, None, {"summarised": children["summarised"]})
    assert info.value.details["issues"] == [
        {"path": "$.keywords", "message": "required property is missing"}
    ]


def test_child_input_leaves_out_absent_optional_values(compose):
    use = compose.uses[0].model_copy(update={"input_map": {"text": "text", "max_sentences": "n"}})
    assert child_input(use, {"text": "x"}) == {"text": "x"}
    assert child_input(use, {"text": "x", "n": 3}) == {"text": "x", "max_sentences": 3}


def test_block_failure_payload(keywords):
    err = block_failed(
        keywords.pre_blocks[0],
        "NameError",
        "name 'txt' is not defined",
        traceback="Traceback...\n" + "x" * 5000,
        inputs={"text": "a"},
    )
    p = err.to_payload()
    assert p.error_code == "RLLM_PYTHON_BLOCK_FAILED"
    assert p.message == (
        "python block 'squash_whitespace' (pre) failed: NameError: name 'txt' is not defined"
    )
    assert p.details["block"] == "squash_whitespace" and p.details["stage"] == "pre"
    assert len(p.details["traceback"]) == 4000
    assert p.received_payload == {"text": "a"}


def test_ollama_missing_payload(summary):
    err = ollama_model_missing(summary.ollama_models()[0], app=summary.name)
    p = err.to_payload()
    assert p.details == {"model": "smollm2:135m", "app": "summary"}
    assert "ollama pull smollm2:135m" in p.recovery_hint
    assert EXIT_CODES[type(err)] == 19
