"""The job loader reads with libyaml's scanner and parser and PyYAML's own composer
(keel/mrp/dsl.py ``_CLineLoader``): the same data, lines, limits and messages as the
pure-Python loader, on the shipped examples, on hostile documents and on broken ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from keel.mrp import dsl
from keel.mrp.errors import DslError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "mrp"

BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9 if prev != '-' else ['x'] * 9)}]\n"
    for prev, name in zip("-abcde", "abcdef", strict=True)
)
DOCUMENTS = {
    "control character after non-ASCII lines": "a: é\nb: ü\n\n\nc: \x07x\n",
    "tab indent": "a:\n\tb: 1\n",
    "unclosed flow sequence": "a: [1, 2\nb: 3\n",
    "bad indent": "a:\n  b: 1\n c: 2\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "duplicate key": "a: 1\na: 2\n",
    "integer key": "1: a\n",
    "nesting past the limit": "a: " + "[" * 100 + "]" * 100,
    "50,000 open brackets": "a: " + "[" * 50_000,
    "alias bomb": BOMB,
    "alias cycle": "a: &a [*a]\n",
    "merge key": "a: &x {p: 1}\nb:\n  <<: *x\n  q: 2\n",
    "date stays text": "a: 2024-01-01\n",
    "byte order mark": "\ufeffa: 1\n",
    "empty": "",
    "items inline": 'inputs:\n  items: ["w0", {"k": 1}, 3, 2.5, null, true]\n',
}


def load(loader: type[Any], text: str) -> tuple[str, Any]:
    saved = dsl._LineLoader
    dsl._LineLoader = loader
    try:
        return "ok", dsl.load_yaml_with_lines(text, "t.yaml")
    except DslError as e:
        return "refused", [(i.line, i.message) for i in e.issues]
    finally:
        dsl._LineLoader = saved


def test_this_install_reads_jobs_with_libyaml() -> None:
    """PyYAML's wheels carry libyaml; without it jobs load four times slower (a
    100,000-item job: 2.88 s against 0.60 s), so a build without it fails here."""
    assert yaml.__with_libyaml__
    assert dsl._LineLoader is dsl._CLineLoader


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_same_answer_as_the_pure_python_loader(name: str) -> None:
    text = DOCUMENTS[name]
    assert load(dsl._CLineLoader, text) == load(dsl._PyLineLoader, text)


def test_limits_hold_under_libyaml() -> None:
    for name in ("alias bomb", "nesting past the limit", "50,000 open brackets"):
        kind, issues = load(dsl._CLineLoader, DOCUMENTS[name])
        assert kind == "refused" and "exceeds a limit" in issues[0][1], (name, issues)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load_the_same(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    got = load(dsl._CLineLoader, text)
    assert got[0] == "ok" and got == load(dsl._PyLineLoader, text)
