"""Help text is written for the terminal: every CLI's ``--help`` and the help of each of
its groups and commands shows plain words (or Typer's rich markup), never the docstring
markup of the source (````keel up````, ``:class:`X```, single backticks), which a terminal
prints raw.

The commands are found by walking each console script's Typer app, groups included
(``keel``, ``keel actors``, ``keel gates``, ``mrp operators``, ``srl data``...), so a
command added later is covered without touching this file. Each help page is rendered in
this process through the family's entry, as the console script runs it.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
import typer.main

from cli import design, keel, mrp, runllm, srl, toolkit

SCRIPTS: dict[str, tuple[typer.Typer, toolkit.Family]] = {
    "keel": (keel.app, keel.KEEL),
    "runllm": (runllm.app, runllm.RLLM),
    "mrp": (mrp.app, mrp.MRP),
    "srl": (srl.app, srl.SRL),
    "design": (design.app, design.DESIGN),
}
#: reST/Sphinx markup (``literal``, :role:`target`, ``.. directive::``) and Markdown's
#: `code`: neither is rendered by Typer, so both would show as typed.
MARKUP = re.compile(r"`|:[a-z]+(?::[a-z]+)?:`|^\s*\.\. \w+::", re.M)


def _pages(command: Any, path: list[str]) -> list[list[str]]:
    """The path of every help page under ``command``: itself, its groups and commands."""
    pages = [path]
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        pages += _pages(sub, [*path, name])
    return pages


PAGES = [
    (script, path)
    for script, (app, _) in SCRIPTS.items()
    for path in _pages(typer.main.get_command(app), [])
]
IDS = [" ".join([script, *path]) for script, path in PAGES]


def test_the_walk_finds_the_groups_and_the_commands() -> None:
    found = set(IDS)
    for expected in ("keel", "keel actors", "keel actors serve", "mrp operators", "srl data",
                     "design diff", "runllm run"):  # fmt: skip
        assert expected in found
    assert len(found) == len(IDS) >= 50


def test_the_markup_pattern_finds_what_it_is_for() -> None:
    for raw in ("a running ``keel up``", "a :class:`Family`", "as `mrp compile`", ".. note::"):
        assert MARKUP.search(raw), raw
    for plain in ("a running 'keel up'", "[default: 30.0]", "GET /gates", "a: b", "<name>.log"):
        assert not MARKUP.search(plain), plain


@pytest.mark.parametrize(("script", "path"), PAGES, ids=IDS)
def test_help_has_no_source_markup(
    script: str, path: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    # Wide enough that no line wraps inside what the pattern looks for.
    monkeypatch.setenv("COLUMNS", "240")
    app, family = SCRIPTS[script]
    code = family.run(app, [*path, "--help"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Usage:" in out, out
    raw = [line.strip() for line in out.splitlines() if MARKUP.search(line)]
    assert not raw, f"{' '.join([script, *path])} --help shows source markup: {raw}"
