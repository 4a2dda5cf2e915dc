import pytest

from keel.rllm.render import (
    DEFAULT_RECOVERY_TEMPLATE,
    TemplateRef,
    TemplateSyntaxError,
    parse_template,
    render,
    render_recovery,
    static_text,
    template_refs,
)
from keel.rllm.schema import ValidationIssue


def test_variables_strings_verbatim_others_as_sorted_json():
    out = render(
        "{{ s }}|{{n}}|{{ b }}|{{ z }}|{{ obj }}|{{ lst }}|{{ u }}",
        {
            "s": 'say "hi"\n',
            "n": 2.5,
            "b": True,
            "z": None,
            "obj": {"b": 1, "a": "é"},
            "lst": [1, "x"],
            "u": "ünï",
        },
    )
    assert out == 'say "hi"\n|2.5|true|null|{"a": "é", "b": 1}|[1, "x"]|ünï'


def test_dotted_paths_and_indexes():
    v = {"doc": {"title": "T", "pages": [{"n": 1}, {"n": 2}]}}
    assert render("{{ doc.title }} {{ doc.pages.1.n }}", v) == "T 2"


def test_missing_values_render_empty():
    assert render("[{{ opt }}][{{ doc.nope }}][{{ lst.5 }}]", {"doc": {}, "lst": []}) == "[][][]"


def test_escape_and_brace_runs():
    assert render(r"\{{ x }}", {"x": 1}) == "{{ x }}"
    # A JSON example around a reference needs no escaping.
    assert render('{"a": {{{ x }}}}', {"x": 1}) == '{"a": {1}}'
    assert render('{"a": "{{ x }}"}', {"x": "v"}) == '{"a": "v"}'
    assert render("}} alone", {}) == "}} alone"


def test_rendering_is_deterministic_across_dict_order():
    a = render("{{ d }}", {"d": {"x": 1, "y": 2}})
    b = render("{{ d }}", {"d": {"y": 2, "x": 1}})
    assert a == b == '{"x": 1, "y": 2}'


@pytest.mark.parametrize(
    ("template", "line", "column", "words"),
    [
        ("hello {{ name | upper }}", 1, 7, "is not a variable reference"),
        ("a\nb {{ x + 1 }}", 2, 3, "is not a variable reference"),
        ("{% if x %}{{ x }}", None, None, None),
        ("text {{ never closed\n}}", 1, 6, "never closed"),
        ("{{ }}", 1, 1, "is not a variable reference"),
        ("{{ a..b }}", 1, 1, "is not a variable reference"),
    ],
)
def test_syntax_errors_have_positions(template, line, column, words):
    if words is None:
        # Jinja statements are plain text here: nothing in them executes.
        assert render(template, {"x": 1}) == "{% if x %}1"
        return
    with pytest.raises(TemplateSyntaxError) as info:
        parse_template(template, first_line=1)
    assert (info.value.line, info.value.column) == (line, column)
    assert words in info.value.message


def test_refs_carry_file_positions():
    refs = template_refs("x\n  {{ a.b }} {{c}}", first_line=10)
    assert refs == [
        TemplateRef(parts=("a", "b"), line=11, column=3),
        TemplateRef(parts=("c",), line=11, column=13),
    ]
    assert refs[0].name == "a.b"


def test_static_text_drops_references():
    assert static_text("Hi {{ name }}, bye") == "Hi , bye"


ISSUES = [
    ValidationIssue(path="$.sentences", message='expected integer, got string "two"'),
    ValidationIssue(path="$.summary", message="required property is missing"),
]
SCHEMA = {
    "type": "object",
    "required": ["summary", "sentences"],
    "properties": {"summary": {"type": "string"}, "sentences": {"type": "integer"}},
}


def test_default_recovery_quotes_errors_output_and_schema_exactly():
    bad = 'Here: {"sentences": "two"}  '
    out = render_recovery(None, ISSUES, bad, SCHEMA, prompt="Summarise: cats.")
    assert out.startswith("Summarise: cats.\n")
    assert f"It was:\n{bad}\n" in out
    assert (
        '- $.sentences: expected integer, got string "two"\n'
        "- $.summary: required property is missing\n"
    ) in out
    assert '"required": [\n    "summary",\n    "sentences"\n  ]' in out
    assert out == render_recovery(
        DEFAULT_RECOVERY_TEMPLATE, ISSUES, bad, SCHEMA, prompt="Summarise: cats."
    )


def test_custom_recovery_sees_app_variables_and_rllm_namespace():
    template = "Text: {{ text }}\nWrong:\n{{ rllm.errors }}\nWas: {{ rllm.bad_output }}"
    out = render_recovery(template, ISSUES[:1], "{}", SCHEMA, variables={"text": "cats"})
    assert out == 'Text: cats\nWrong:\n- $.sentences: expected integer, got string "two"\nWas: {}'


def test_app_variable_named_rllm_cannot_shadow_the_recovery_fields():
    out = render_recovery("{{ rllm.bad_output }}", [], "raw", SCHEMA, variables={"rllm": "x"})
    assert out == "raw"
