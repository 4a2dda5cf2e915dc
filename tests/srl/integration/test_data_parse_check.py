"""The processing parse check: ast-grep's parser in the real jail, plus ``ast.parse``
for Python, which catches what no ast-grep ERROR rule sees."""

from __future__ import annotations

import asyncio

import pytest

from activities.srl.data import PARSE_BATCH, astgrep_parses, parses_in_jail

pytestmark = pytest.mark.timeout(120)

PY = {
    "ok": "x = 1\n",
    "unclosed_call": "x = foo(1\n",  # tree-sitter: an ERROR node
    "bad_params": "def f(:\n    pass\n",  # tree-sitter recovers without an ERROR node
}


def test_python_needs_ast_parse_beside_astgrep() -> None:
    assert asyncio.run(astgrep_parses(PY, "python")) == {
        "ok": True,
        "unclosed_call": False,
        "bad_params": True,
    }
    assert asyncio.run(parses_in_jail(PY, "python")) == {
        "ok": True,
        "unclosed_call": False,
        "bad_params": False,
    }


@pytest.mark.parametrize(
    ("language", "good", "bad"),
    [
        ("javascript", "const a = (1);\n", "let a = (1\n"),
        ("typescript", "const a: number = 1;\n", "const a: = ;\n"),
        ("java", "class A { int n; }\n", "class A { int n = ; }\n"),
    ],
)
def test_each_language_is_parsed_as_itself(language: str, good: str, bad: str) -> None:
    assert asyncio.run(parses_in_jail({"good": good, "bad": bad}, language)) == {
        "good": True,
        "bad": False,
    }


def test_more_texts_than_one_batch() -> None:
    texts = {f"t{i}": ("x = 1\n" if i % 7 else "x = (\n") for i in range(PARSE_BATCH + 5)}
    result = asyncio.run(parses_in_jail(texts, "python"))
    assert result == {k: bool(int(k[1:]) % 7) for k in texts}
