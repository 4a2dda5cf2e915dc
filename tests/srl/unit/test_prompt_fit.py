"""keel.srl.fit with a fake token counter (one token a word): the whole file when it fits,
else whole top-level statements around the code to change, else whole lines, else a
shorter instruction; each cut marked by a comment in the task's language."""

from __future__ import annotations

import itertools

import pytest

from keel.srl.fit import (
    comment_marker,
    cut_marker,
    fit_prompt,
    focus_line,
    top_level_chunks,
)

Messages = list[dict[str, str]]


def render(code: str, instruction: str) -> Messages:
    return [
        {"role": "system", "content": "answer with one rewrite"},
        {"role": "user", "content": f"Task: {instruction}\nCode:\n{code}"},
    ]


def words(messages: Messages) -> int:
    return sum(len(m["content"].split()) for m in messages)


def lines(messages: Messages) -> int:
    """One token a line: a cut marker costs one, as a short line does."""
    return sum(m["content"].count("\n") + 1 for m in messages)


PY = """import os
import sys


def first(a):
    return a + 1


@decorator
# about second
def second(b):
    if b:
        return 1
    else:
        return 2


class Third:
    def method(self):
        return old_call(1, 2)


def fourth():
    return 4
"""

JS = """const a = 1;
function one() {
  return a;
}
function two(x) {
  return oldCall(x, 2);
}
function three() {
  return 3;
}
"""


@pytest.mark.parametrize(
    ("language", "marker"),
    [
        ("python", "#"),
        ("py", "#"),
        ("javascript", "//"),
        ("typescript", "//"),
        ("java", "//"),
        ("go", "//"),
        ("rust", "//"),
        ("ruby", "#"),
        ("lua", "--"),
        ("unknown-language", "#"),
    ],
)
def test_comment_marker_per_language(language: str, marker: str) -> None:
    assert comment_marker(language) == marker
    line = cut_marker(language, 3, "above")
    assert line == f"{marker} [3 lines above cut to fit the model's context]\n"


def test_cut_marker_closes_block_comments_and_counts_one_line() -> None:
    assert (
        cut_marker("html", 1, "below") == "<!-- [1 line below cut to fit the model's context] -->\n"
    )


def test_top_level_chunks_keep_decorators_comments_and_continuations() -> None:
    lines = PY.splitlines(keepends=True)
    starts = [lines[a].rstrip() for a, _ in top_level_chunks(lines, "python")]
    assert starts == [
        "import os",
        "import sys",
        "def first(a):",
        "@decorator",  # the comment and the def below belong to it; `else:` is inside
        "class Third:",
        "def fourth():",
    ]
    chunks = top_level_chunks(lines, "python")
    assert chunks[0][0] == 0 and chunks[-1][1] == len(lines)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chunks))
    js = JS.splitlines(keepends=True)
    assert [js[a].rstrip() for a, _ in top_level_chunks(js, "javascript")] == [
        "const a = 1;",
        "function one() {",
        "function two(x) {",
        "function three() {",
    ]


def test_focus_line_is_the_first_changed_line() -> None:
    assert focus_line("a\nb\nc\n", "a\nB\nc\n") == 1
    assert focus_line("a\nb\n", "a\nb\n") == 0
    assert focus_line("a\n", "a\nb\n") == 1


def test_a_prompt_that_fits_is_sent_whole() -> None:
    fit = fit_prompt(
        render, code=PY, instruction="rename", language="python", count=lines, budget=1000
    )
    assert fit.fits and not fit.cut
    assert fit.messages == render(PY, "rename")
    assert fit.prompt_tokens == lines(fit.messages) and fit.lines_total == len(PY.splitlines())


def test_whole_statements_around_the_change_with_python_markers() -> None:
    post = PY.replace("old_call(1, 2)", "new_call(2, 1)")
    focus = focus_line(PY, post)
    whole = lines(render(PY, "swap"))
    fit = fit_prompt(
        render,
        code=PY,
        instruction="swap",
        language="python",
        count=lines,
        budget=whole - 12,
        focus=focus,
    )
    assert fit.fits and fit.cut and fit.prompt_tokens <= whole - 12
    user = fit.messages[1]["content"]
    assert "return old_call(1, 2)" in user and "class Third:" in user
    assert fit.lines_cut_above > 0
    assert f"# [{fit.lines_cut_above} lines above cut to fit the model's context]" in user
    code = user.split("Code:\n", 1)[1]
    kept = [line for line in code.splitlines() if not line.startswith("# [")]
    # whole statements: the window starts at a column-0 line of the file
    assert kept[0] and not kept[0].startswith(" ")
    assert not fit.instruction_cut


def test_javascript_cuts_are_marked_with_slashes() -> None:
    focus = focus_line(JS, JS.replace("oldCall(x, 2)", "newCall(2, x)"))
    budget = lines(render(JS, "swap")) - 4
    fit = fit_prompt(
        render, code=JS, instruction="swap", language="javascript", count=lines, budget=budget,
        focus=focus,
    )  # fmt: skip
    user = fit.messages[1]["content"]
    assert fit.fits and "oldCall(x, 2)" in user and "// [" in user and "# [" not in user


def test_one_long_statement_is_cut_at_lines_around_the_change() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(200))
    code = "def big():\n" + body + "    return old_call(1)\n"
    focus = len(code.splitlines()) - 1
    fit = fit_prompt(
        render, code=code, instruction="i", language="python", count=lines, budget=80, focus=focus
    )
    user = fit.messages[1]["content"]
    assert fit.fits and fit.prompt_tokens <= 80
    assert "return old_call(1)" in user and "def big():" not in user
    assert fit.lines_cut_above > 0 and fit.lines_cut_below == 0


def test_the_instruction_is_shortened_when_no_code_fits() -> None:
    instruction = " ".join(f"word{i}" for i in range(100))
    base = words(render("", ""))
    fit = fit_prompt(
        render,
        code=PY,
        instruction=instruction,
        language="python",
        count=words,
        budget=base + 40,
    )
    assert fit.fits and fit.instruction_cut and fit.prompt_tokens <= base + 40
    task_line = fit.messages[1]["content"].splitlines()[0]
    assert task_line.endswith("…") and task_line.startswith("Task: word0 word1")


def test_a_system_text_over_the_budget_cannot_fit() -> None:
    fit = fit_prompt(render, code=PY, instruction="i", language="python", count=words, budget=3)
    assert not fit.fits


def test_every_budget_gives_a_prompt_within_it() -> None:
    post = PY.replace("return 4", "return 5")
    focus = focus_line(PY, post)
    for budget in range(8, lines(render(PY, "change fourth")) + 2):
        fit = fit_prompt(
            render,
            code=PY,
            instruction="change fourth",
            language="python",
            count=lines,
            budget=budget,
            focus=focus,
        )
        assert fit.fits and fit.prompt_tokens <= budget
        again = fit_prompt(
            render,
            code=PY,
            instruction="change fourth",
            language="python",
            count=lines,
            budget=budget,
            focus=focus,
        )
        assert again == fit  # deterministic
