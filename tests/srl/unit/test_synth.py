"""keel.srl.synth: templates, their reference post-texts, refusals and determinism."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.srl.errors import TemplateNotApplicable
from keel.srl.synth import (
    TEMPLATES,
    SourceFile,
    c_like_identifiers,
    c_like_rename,
    py_add_guard,
    py_dict_get_default,
    py_none_comparison,
    py_rename,
    py_replace_api,
    py_swap_arguments,
    py_wrap_call,
    synthesise,
)

PY = '''import os
import time


def load(path, default=None):
    """load(path) reads a file."""
    start = time.time()
    if path == None:
        return default
    data = cache.get(path, None)
    log.flush()
    return pair(data, start), os.path.join(path, "x")


def main():
    value = load("a")  # load it
    print(f"{value}")
    return pair(value, 1)
'''


def src(text: str, language: str = "python", path: str = "m.py") -> SourceFile:
    return SourceFile(path=path, text=text, license="PSF-2.0", language=language, package="t")


def test_rename_touches_names_not_strings_or_comments() -> None:
    task = py_rename(src(PY), seed=0)
    assert task.gold_action.pattern in ("load", "main")
    if task.gold_action.pattern == "load":
        assert "def load_renamed(path" in task.post
        assert 'value = load_renamed("a")  # load it' in task.post
        assert '"""load(path) reads a file."""' in task.post
    assert task.pre == PY
    assert task.source_sha256 == hashlib.sha256(PY.encode()).hexdigest()
    assert task.license == "PSF-2.0" and task.file == "m.py"


def test_rename_refuses_a_name_inside_an_fstring() -> None:
    with pytest.raises(TemplateNotApplicable):
        py_rename(src('def value():\n    return 1\n\nprint(f"{value()}")\n'), seed=0)


def test_wrap_call() -> None:
    text = "x = f(a, b=2)\ny = g(f())\n"
    task = py_wrap_call(src(text), seed=0)
    name = task.gold_action.pattern.split("(")[0]
    expected = {
        "f": "x = traced(f(a, b=2))\ny = g(traced(f()))\n",
        "g": "x = f(a, b=2)\ny = traced(g(f()))\n",
    }[name]
    assert task.post == expected
    assert task.gold_action.rewrite == f"traced({name}($$$ARGS))"


@pytest.mark.parametrize(
    "text",
    ["x = f(a,\n      b)\n", "x = f(a, b,)\n", "x = f(f(a))\n", "x = f(i for i in y)\n"],
)
def test_wrap_call_refuses_what_ast_grep_would_reproduce_differently(text: str) -> None:
    with pytest.raises(TemplateNotApplicable):
        py_wrap_call(src(text), seed=0)


def test_add_guard_keeps_indentation() -> None:
    task = py_add_guard(src(PY), seed=0)
    assert task.gold_action.pattern == "log.flush()"
    assert "    if log is not None:\n        log.flush()\n" in task.post
    ast.parse(task.post)


def test_add_guard_refuses_a_call_also_used_as_a_value() -> None:
    with pytest.raises(TemplateNotApplicable):
        py_add_guard(src("log.flush()\nx = log.flush()\n"), seed=0)


def test_replace_api() -> None:
    task = py_replace_api(src(PY), seed=3)
    assert (task.gold_action.pattern, task.gold_action.rewrite) in {
        ("time.time($$$ARGS)", "time.monotonic($$$ARGS)"),
        ("os.path.join($$$ARGS)", "posixpath.join($$$ARGS)"),
    }
    assert task.post.count("time.monotonic()") + task.post.count('posixpath.join(path, "x")') == 1


def test_swap_arguments() -> None:
    task = py_swap_arguments(src(PY), seed=0)
    assert task.gold_action.pattern == "pair($A, $B)"
    assert "pair(start, data)" in task.post and "pair(1, value)" in task.post
    with pytest.raises(TemplateNotApplicable):
        py_swap_arguments(src("pair(a, b)\npair(a, k=b)\n"), seed=0)


def test_none_comparison_and_dict_get() -> None:
    none = py_none_comparison(src(PY), seed=0)
    assert "if path is None:" in none.post
    assert none.gold_action.pattern == "$X == None"
    get = py_dict_get_default(src(PY), seed=0)
    assert "data = cache.get(path)" in get.post
    with pytest.raises(TemplateNotApplicable):
        py_none_comparison(src("x = a==None\n"), seed=0)


def test_templates_refuse_files_that_do_not_parse() -> None:
    for template in TEMPLATES["python"].values():
        with pytest.raises(TemplateNotApplicable):
            template(src("def (:\n"), 0)


JS = """// rename me: compute
const re = /compute\\/x/g;
function compute(a, b) {
  return a / b / 2;
}
const s = 'compute';
const t = `plain compute`;
export default compute(1, 2) + other.value;
"""


def test_js_lexer_skips_strings_comments_regex_and_templates() -> None:
    names = [name for _, name in c_like_identifiers(JS, "javascript")]
    assert names.count("compute") == 2
    assert "x" not in names and "plain" not in names
    inner = c_like_identifiers("const t = `a ${compute({x: 1})} b` + y;", "javascript")
    assert [name for _, name in inner] == ["const", "t", "compute", "x", "y"]
    for broken in ("const t = `a ${b`;", "const s = 'abc;", "/* open", "f(x) }"):
        with pytest.raises(TemplateNotApplicable):
            c_like_identifiers(broken, "javascript")


def test_js_rename_of_an_arrow_function_inside_a_template_literal() -> None:
    text = "const fmt = (x) => `${x}!`;\nconsole.log(`value: ${fmt(1)}`);\n"
    task = c_like_rename(src(text, "javascript", "a.js"), seed=0)
    assert task.post == text.replace("fmt", "fmtRenamed")


def test_js_rename() -> None:
    task = c_like_rename(src(JS, "javascript", "a.js"), seed=0)
    assert task.gold_action.language == "javascript"
    assert task.post == JS.replace("function compute(", "function computeRenamed(").replace(
        "default compute(", "default computeRenamed("
    )


def test_js_rename_refuses_a_name_also_used_as_a_property() -> None:
    text = "function go(x) { return x; }\nconst o = { go: 1 };\ngo(o);\n"
    with pytest.raises(TemplateNotApplicable):
        c_like_rename(src(text, "typescript", "a.ts"), seed=0)


def test_java_rename() -> None:
    text = (
        "class A {\n  private int total(int x) { return x; }\n"
        '  String s = "total";\n  int y = total(2);\n}\n'
    )
    task = c_like_rename(src(text, "java", "A.java"), seed=0)
    assert task.post.count("totalRenamed") == 2
    assert '"total"' in task.post


STDLIB = ["json", "textwrap", "shlex", "csv", "fnmatch", "glob", "string", "contextlib"]


def test_synthesise_is_deterministic_and_records_provenance() -> None:
    sources = [src(inspect.getsource(importlib.import_module(m)), path=f"{m}.py") for m in STDLIB]
    first = synthesise(sources, seeds=[7])
    again = synthesise(sources, seeds=[7])
    assert first == again
    assert len(first.tasks) >= 20
    # More seeds pick other targets in the same files: more tasks, never fewer.
    more = synthesise(sources, seeds=[7, 8, 9])
    assert {t.task_id for t in first.tasks} < {t.task_id for t in more.tasks}
    assert len({t.task_id for t in first.tasks}) == len(first.tasks)
    for task in first.tasks:
        ast.parse(task.post)
        assert task.post != task.pre
        assert task.source_sha256 == hashlib.sha256(task.pre.encode()).hexdigest()
        assert task.task_id.startswith(f"python-{task.template.replace('_', '-')}-")


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(STDLIB), st.integers(0, 10_000))
def test_every_python_post_text_reparses(module: str, seed: int) -> None:
    source = src(inspect.getsource(importlib.import_module(module)), path=f"{module}.py")
    for template in TEMPLATES["python"].values():
        try:
            task = template(source, seed)
        except TemplateNotApplicable:
            continue
        ast.parse(task.post)
        assert task.seed == seed
