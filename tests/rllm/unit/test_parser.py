from pathlib import Path
from typing import Any

import pytest
import yaml

from keel.digest import digest_bytes
from keel.rllm import (
    LLMParamValidationError,
    LLMSpec,
    MetadataValidationError,
    ParseError,
    RllmProgram,
    parse_text,
)
from keel.rllm.parser import (
    MAX_FRONTMATTER_BYTES,
    MAX_FRONTMATTER_DEPTH,
    MAX_FRONTMATTER_NODES,
    MAX_TEMPLATE_REFS,
    MAX_USES,
)
from store.files import load_rllm

EXAMPLES = Path(__file__).parents[3] / "examples"
BASE = (Path(__file__).parent / "rllm_golden" / "tiny_base.rllm").read_text()


def with_(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


def test_summary_example():
    p = load_rllm(EXAMPLES / "summary.rllm")
    assert p.name == "summary"
    assert p.version == "0.1.0"
    assert p.llm == LLMSpec(provider="keel", model="local")
    assert p.llm.is_config_name
    assert p.llm_params == {"temperature": 0, "max_tokens": 200, "seed": 7}
    assert p.max_tokens == 200
    assert p.recommended_models == [LLMSpec(provider="ollama", model="smollm2:135m")]
    assert p.ollama_models() == ["smollm2:135m"]
    assert p.metadata == {"example": True}
    assert p.output_format == "json"
    assert p.prompt_template.startswith("Summarise the text in at most {{ max_sentences }}")
    assert p.prompt_template.endswith("JSON:\n")
    assert p.recovery_template is not None and "{{ rllm.errors }}" in p.recovery_template
    assert p.python_blocks == []
    assert p.needs_llm and p.llm_output_schema() == p.output_schema
    raw = (EXAMPLES / "summary.rllm").read_bytes()
    assert p.source_digest == digest_bytes(raw)
    assert p.source_path == str(EXAMPLES / "summary.rllm")


def test_python_blocks_are_parsed_in_order():
    p = load_rllm(EXAMPLES / "extract_keywords.rllm")
    pre, post = p.python_blocks
    assert (pre.name, pre.stage, pre.inputs, pre.outputs) == (
        "squash_whitespace",
        "pre",
        ["text"],
        ["clean_text"],
    )
    assert pre.code.startswith("# Runs in the sandbox")
    assert pre.code.endswith('clean_text = " ".join(text.split())\n')
    assert (post.name, post.stage, post.inputs, post.outputs) == (
        "dedupe",
        "post",
        ["keywords", "max_keywords"],
        ["keywords"],
    )
    text = (EXAMPLES / "extract_keywords.rllm").read_text().splitlines()
    assert text[pre.line - 1].startswith("=== python name=squash_whitespace")
    assert p.pre_blocks == [pre] and p.post_blocks == [post]
    assert "{{ clean_text }}" in p.prompt_template


def test_composition_example_makes_no_llm_call():
    p = load_rllm(EXAMPLES / "compose_summary_keywords.rllm")
    assert not p.needs_llm
    assert p.prompt_template == ""
    assert [u.alias for u in p.uses] == ["summarised", "keywords_of"]
    assert p.output_map == {"summary": "summarised.summary", "keywords": "keywords_of.keywords"}


def test_program_round_trips_through_json():
    for name in ("summary", "extract_keywords", "compose_summary_keywords"):
        p = load_rllm(EXAMPLES / f"{name}.rllm")
        assert RllmProgram.model_validate_json(p.model_dump_json()) == p


def test_text_digest_matches_file_digest_and_line_endings_do_not_matter():
    raw = (EXAMPLES / "summary.rllm").read_bytes()
    text = raw.decode()
    assert parse_text(text).source_digest == digest_bytes(raw)
    crlf = parse_text(text.replace("\n", "\r\n"))
    bom = parse_text("\ufeff" + text)
    plain = parse_text(text)
    for other in (crlf, bom):
        assert other.model_dump(exclude={"source_digest"}) == plain.model_dump(
            exclude={"source_digest"}
        )
        assert other.source_digest != plain.source_digest


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ParseError, match="cannot read the file"):
        load_rllm(tmp_path / "nope.rllm")
    bad = tmp_path / "latin1.rllm"
    bad.write_bytes(BASE.encode().replace(b"author: tests", "author: t\xe9sts".encode("latin-1")))
    with pytest.raises(ParseError, match="not UTF-8") as info:
        load_rllm(bad)
    assert info.value.details["line"] == 5


def test_escaped_braces_and_json_examples_are_fine():
    p = parse_text(with_("{{ text }}", "\\{{ not a var }} and {{ text }}"))
    assert "\\{{ not a var }}" in p.prompt_template


def test_max_completion_tokens_is_accepted():
    p = parse_text(with_("max_tokens: 64", "max_completion_tokens: 64"))
    assert p.max_tokens == 64


@pytest.mark.parametrize(
    ("text", "cls", "key_or_words"),
    [
        (
            with_("llm: {provider: keel, model: local}", "llm: {provider: keel, modle: local}"),
            MetadataValidationError,
            "llm.modle",
        ),
        (with_("name: tiny", "name: tiny app"), MetadataValidationError, "name"),
        (
            with_("name: tiny", 'name: tiny\nformat_version: "0.2"'),
            MetadataValidationError,
            "format_version",
        ),
        (with_("name: tiny", "name: tiny\ntags: [a, a]"), MetadataValidationError, "tags"),
        (
            with_("name: tiny", "name: tiny\nrecommended_models: [smollm2]"),
            MetadataValidationError,
            "recommended_models[0]",
        ),
        (
            with_("name: tiny", "name: tiny\noutput_format: yaml"),
            MetadataValidationError,
            "output_format",
        ),
        (
            with_(
                "text: {type: string, minLength: 1}",
                "text: {type: string}\n    rllm: {type: string}",
            ),
            MetadataValidationError,
            "input_schema.properties.rllm",
        ),
        (
            with_(
                "text: {type: string, minLength: 1}",
                "text: {type: string}\n    my-field: {type: string}",
            ),
            MetadataValidationError,
            "input_schema.properties.my-field",
        ),
        (with_("max_tokens: 64", "max_tokens: 600"), LLMParamValidationError, "leaves no room"),
        (with_("max_tokens: 64", "max_tokens: 64, n: 2"), LLMParamValidationError, "llm_params.n"),
        (
            with_("temperature: 0", "stop: [a, b, c, d, e]"),
            LLMParamValidationError,
            "llm_params.stop",
        ),
        (with_("---\nReply", "not yaml: [\n---\nReply"), ParseError, "invalid YAML"),
    ],
)
def test_frontmatter_problems(text, cls, key_or_words):
    with pytest.raises(cls) as info:
        parse_text(text, path="t.rllm")
    err = info.value
    assert err.details.get("key", "") == key_or_words or key_or_words in err.message
    assert err.message.startswith("t.rllm:")


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ("=== python name=a stage=pre outputs=x ===\n", "has no code"),
        ("=== python name=a stage=during outputs=x ===\nx = 1\n", "stage must be 'pre' or 'post'"),
        ("=== python name=a stage=pre ===\nx = 1\n", "outputs=... is required"),
        ("=== python name=a stage=pre outputs=x timeout=3 ===\nx = 1\n", "'timeout=3'"),
        ("=== python name=a stage=pre outputs=x,x ===\nx = 1\n", "repeated in outputs"),
        ("=== python name=a stage=pre outputs=__x ===\nx = 1\n", "not a usable variable name"),
        (
            "=== python name=a stage=pre outputs=x ===\nx = 1\n"
            "=== python name=a stage=pre outputs=y ===\ny = 1\n",
            "used twice",
        ),
        (
            "=== python name=a stage=post inputs=answer outputs=other ===\nother = 1\n",
            "not a property of output_schema",
        ),
        (
            "=== python name=a stage=post inputs=nothing outputs=answer ===\nanswer = 1\n",
            "reads 'nothing'",
        ),
        ("=== recovery ===\nFix {{ rllm.oops }}\n", "'rllm' has the fields"),
        ("=== recovery ===\nA\n=== recovery ===\nB\n", "a second '=== recovery ==='"),
        ("=== recovery ===\nFix {{ txt }}\n", "unknown variable 'txt'"),
    ],
)
def test_section_problems(section, words):
    with pytest.raises(ParseError) as info:
        parse_text(BASE + section, path="t.rllm")
    assert words in info.value.message


def test_pre_block_outputs_become_variables_and_shadow_inputs():
    text = with_("{{ text }}", "{{ text }} {{ words }}") + (
        "=== python name=count stage=pre inputs=text outputs=text,words ===\n"
        "words = len(text.split())\ntext = text.strip()\n"
    )
    p = parse_text(text)
    assert p.pre_blocks[0].outputs == ["text", "words"]


def test_recovery_section_positions_point_into_the_file():
    text = BASE + "=== recovery ===\n\nFix it: {{ rllm.errors }}\nAlso {{ nope }}\n"
    with pytest.raises(ParseError) as info:
        parse_text(text, path="t.rllm")
    n = text.splitlines().index("Also {{ nope }}") + 1
    assert (info.value.details["line"], info.value.details["column"]) == (n, 6)


def test_uses_scope_checks():
    uses = (
        "uses:\n"
        "  - path: a.rllm\n    alias: first\n    exposes: [answer]\n    input_map: {text: text}\n"
        "  - path: b.rllm\n    alias: second\n    exposes: [answer]\n"
        "    input_map: {text: first.answer}\n"
    )
    ok = parse_text(
        with_("author: tests", "author: tests\n" + uses).replace(
            "{{ text }}", "{{ text }} {{ second.answer }} {{ first }}"
        )
    )
    assert [u.input_map for u in ok.uses] == [{"text": "text"}, {"text": "first.answer"}]

    later = uses.replace("{text: text}", "{text: second.answer}")
    with pytest.raises(MetadataValidationError, match="unknown variable 'second'"):
        parse_text(with_("author: tests", "author: tests\n" + later))
    not_exposed = with_("author: tests", "author: tests\n" + uses).replace(
        "{{ text }}", "{{ first.score }}"
    )
    with pytest.raises(ParseError, match="'first' exposes only answer, not 'score'"):
        parse_text(not_exposed)
    clash = uses.replace("alias: second", "alias: text")
    with pytest.raises(MetadataValidationError, match="already an input"):
        parse_text(with_("author: tests", "author: tests\n" + clash))


def test_output_map_splits_the_output_schema():
    text = (
        with_(
            "author: tests",
            "author: tests\n"
            "uses:\n  - path: a.rllm\n    alias: kid\n    exposes: [answer]\n"
            "    input_map: {text: text}\n"
            "output_map: {answer: kid.answer}\n",
        )
        .replace(
            "    answer: {type: string}\n",
            "    answer: {type: string}\n    comment: {type: string}\n",
        )
        .replace("required: [answer]", "required: [answer, comment]")
    )
    p = parse_text(text)
    assert p.needs_llm
    assert p.llm_output_properties == ["comment"]
    assert p.llm_output_schema() == {
        "type": "object",
        "required": ["comment"],
        "properties": {"comment": {"type": "string"}},
    }
    with pytest.raises(MetadataValidationError, match="not a property of output_schema"):
        parse_text(text.replace("output_map: {answer: kid.answer}", "output_map: {x: kid.answer}"))
    with pytest.raises(MetadataValidationError, match="exposes only answer"):
        parse_text(text.replace("output_map: {answer: kid.answer}", "output_map: {answer: kid.x}"))


def test_pure_composition_may_not_have_a_prompt():
    text = with_(
        "author: tests",
        "author: tests\n"
        "uses:\n  - path: a.rllm\n    alias: kid\n    exposes: [answer]\n"
        "    input_map: {text: text}\n"
        "output_map: {answer: kid.answer}\n",
    )
    with pytest.raises(ParseError, match="makes no LLM call"):
        parse_text(text)
    p = parse_text(text.split("---\nReply")[0] + "---\n")
    assert not p.needs_llm


def test_deep_nesting_in_the_frontmatter_is_a_parse_error_with_its_line():
    deep = with_("author: tests", "author: tests\nmetadata: " + "[" * 50_000 + "]" * 50_000)
    with pytest.raises(ParseError) as info:
        parse_text(deep, path="deep.rllm")
    assert info.value.details["line"] == 6
    assert f"nesting deeper than {MAX_FRONTMATTER_DEPTH} levels" in info.value.message
    assert info.value.message.startswith("deep.rllm:6:")


def billion_laughs(levels: int) -> str:
    rows = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        rows.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(rows)


def test_alias_bomb_is_refused_before_anything_walks_it(monkeypatch: pytest.MonkeyPatch):
    text = "---\n" + billion_laughs(9) + '\nformat_version: "0.1"\nname: bomb\n---\nhi\n'
    # Count the work instead of timing it: every node PyYAML composes and every object it
    # constructs (the walk over the data that would visit 9**9 nodes).
    composed = constructed = 0
    compose_node = yaml.composer.Composer.compose_node
    construct_object = yaml.constructor.BaseConstructor.construct_object

    def counting_compose(self: Any, parent: Any, index: Any) -> Any:
        nonlocal composed
        composed += 1
        return compose_node(self, parent, index)

    def counting_construct(self: Any, node: Any, deep: bool = False) -> Any:
        nonlocal constructed
        constructed += 1
        return construct_object(self, node, deep)

    monkeypatch.setattr(yaml.composer.Composer, "compose_node", counting_compose)
    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_object", counting_construct)
    with pytest.raises(
        ParseError, match=f"more than {MAX_FRONTMATTER_NODES} nodes once aliases"
    ) as info:
        parse_text(text)
    # a0 is 9 scalars in a list (10 nodes), each a(i) a list of 9 aliases of a(i-1):
    # a3 stands for 1 + 9 * (1 + 9 * (1 + 9 * 10)) = 7381 nodes once expanded.
    assert "alias *a3 stands for 7381" in info.value.message
    # The file as written has 1 + 9 * 11 + 4 = 104 nodes (the mapping; a key, a list and 9
    # items per row; two more keys and values): the count stopped within them, and
    # nothing was constructed from the composed graph, let alone walked.
    assert 0 < composed <= 104
    assert constructed == 0


def test_alias_cycle_is_refused():
    with pytest.raises(ParseError, match=r"alias \*x is used inside the node it names"):
        parse_text(with_("author: tests", "author: tests\nmetadata: &x {a: *x}"))


def test_uses_count_and_frontmatter_size_are_bounded():
    entry = "  - {path: c.rllm, alias: a%d, exposes: [answer]}\n"
    uses = "uses:\n" + "".join(entry % i for i in range(MAX_USES + 1))
    with pytest.raises(ParseError, match=f"uses has {MAX_USES + 1} entries") as info:
        parse_text(with_("author: tests", "author: tests\n" + uses))
    assert info.value.details["line"] == 7 + MAX_USES
    big = with_(
        "author: tests", "author: tests\nmetadata: {x: '" + "y" * MAX_FRONTMATTER_BYTES + "'}"
    )
    with pytest.raises(ParseError, match="more than the limit of"):
        parse_text(big)


def test_template_reference_count_is_bounded():
    with pytest.raises(ParseError, match=f"more than {MAX_TEMPLATE_REFS}"):
        parse_text(BASE + "{{ text }}" * (MAX_TEMPLATE_REFS + 1))


@pytest.mark.parametrize(
    "code", ["x = 1\x00\n", "x = " + "-" * 100_000 + "1\n", "x = " + "1+" * 200_000 + "1\n"]
)
def test_python_blocks_the_compiler_cannot_hold_are_parse_errors(code):
    block = "\n=== python name=p stage=pre inputs=text outputs=x ===\n" + code
    with pytest.raises(ParseError, match="python block 'p'"):
        parse_text(BASE + block)


def test_an_empty_key_is_an_unknown_key_not_an_index_error():
    # Found by tests/core/unit/test_parser_fuzz.py: the JSON path '$.' named no key.
    with pytest.raises(MetadataValidationError, match="unknown key"):
        parse_text('---\n"": null\n---\nhi\n')
