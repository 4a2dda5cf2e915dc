"""Every command of every Keel CLI (issue 25): its ``--help`` works, and its failures come
out through the one envelope (``{"error": {...}}``; ``runllm``: its ``RllmErrorPayload``)
with the exit code the envelope names.

The commands are found by walking the Typer apps of the console scripts (``keel`` with
``keel gates`` and ``keel actors``, ``runllm``, ``mrp`` with ``mrp operators``, ``srl`` with
``srl data`` and ``srl state``, ``design``): a command added later is covered without
touching this file. Each runs in this process through its family's entry
(``toolkit.Family.run``, what the console script runs, less the ``os._exit``). The failing
calls fail fast, before anything starts: a bad command line, and every required
argument naming something that does not exist, with ``KEEL_*`` settings that do not
load, so no command gets as far as Temporal or a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main

from cli import design, keel, mrp, runllm, srl, toolkit

#: Each console script: its app, its family wrapper, the families its errors may carry.
SCRIPTS: dict[str, tuple[typer.Typer, toolkit.Family, set[str]]] = {
    "keel": (keel.app, keel.KEEL, {"keel", "gate"}),
    "runllm": (runllm.app, runllm.RLLM, {"rllm"}),
    "mrp": (mrp.app, mrp.MRP, {"mrp"}),
    "srl": (srl.app, srl.SRL, {"srl"}),
    "design": (design.app, design.DESIGN, {"design"}),
}


def _leaves(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        return [(path, command)]
    found: list[tuple[list[str], Any]] = []
    for name, sub in sorted(subcommands.items()):
        found += _leaves(sub, [*path, name])
    return found


#: The few commands that the missing arguments and the broken settings do not fail (they
#: need neither): what makes them fail instead. A new command that succeeds on that call
#: fails this test until it gets a line here.
FAILING_ARGS = {
    "mrp operators keygen": lambda tmp: [str(_existing(tmp / "taken.pem"))],  # never overwrites
    "srl synth": lambda tmp: ["--language", "cobol", "--out", str(tmp / "synth.jsonl")],
}


def _existing(path: Path) -> Path:
    path.write_text("a key already\n")
    return path


COMMANDS = [
    (script, path, command)
    for script, (app, _, _) in SCRIPTS.items()
    for path, command in _leaves(typer.main.get_command(app), [])
]
IDS = [" ".join([script, *path]) for script, path, _ in COMMANDS]


def test_the_walk_finds_every_family_and_the_mounted_apps() -> None:
    found = set(IDS)
    for expected in (
        "keel up",
        "keel gates approve",
        "keel actors serve",
        "runllm run",
        "mrp operators sign",
        "srl data ingest",
        "srl state dump",
        "design diff",
    ):
        assert expected in found
    assert len(found) == len(IDS) >= 40


def _run(script: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    app, family, _ = SCRIPTS[script]
    code = family.run(app, argv)
    out, err = capsys.readouterr()
    return code, out, err


def _assert_one_error_document(script: str, code: int, out: str, err: str) -> dict[str, Any]:
    """stdout is exactly one JSON document: the family's error, naming ``code``."""
    assert code not in (0, None), out + err
    doc = json.loads(out)  # the whole of stdout: one document, nothing else
    families = SCRIPTS[script][2]
    if script == "runllm":  # the .rllm spec's payload, its exit code the class's
        assert toolkit.EXIT_CODES["rllm"][doc["error_code"]] == code, doc
        assert doc["message"] and doc["error_type"], doc
    else:
        assert list(doc) == ["error"], doc
        error = doc["error"]
        assert error["family"] in families, error
        assert error["exit_code"] == code, error
        assert error["type"] == error["code"] and error["message"], error
        table = toolkit.EXIT_CODES[error["family"]]
        if error["type"] in table:
            assert table[error["type"]] == code, error
    assert any(line.startswith("error: ") for line in err.splitlines()), err  # and for people
    return doc


@pytest.mark.parametrize(("script", "path", "command"), COMMANDS, ids=IDS)
def test_help(
    script: str, path: list[str], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(script, [*path, "--help"], capsys)
    assert code == 0, err
    assert "Usage:" in out and " ".join(path) in out, out
    assert "--json" in out, f"{script} {' '.join(path)} has no --json/--text option"


@pytest.mark.parametrize(("script", "path", "command"), COMMANDS, ids=IDS)
def test_a_bad_command_line_is_the_envelope(
    script: str, path: list[str], command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _run(script, [*path, "--json", "--no-such-option"], capsys)
    doc = _assert_one_error_document(script, code, out, err)
    assert code == 2, doc
    assert "no-such-option" in out


@pytest.mark.parametrize(("script", "path", "command"), COMMANDS, ids=IDS)
def test_a_failing_call_is_the_envelope(
    script: str,
    path: list[str],
    command: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every required argument names a file or an id that does not exist, and the
    settings do not load: whichever the command meets first fails it."""
    from keel.settings import get_settings

    monkeypatch.chdir(tmp_path)  # whatever a command writes by default lands here
    monkeypatch.setenv("KEEL_DATA_DIR", str(tmp_path / "keel"))
    monkeypatch.setenv("KEEL_API_TOKENS", "not json")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no vllm: `keel actors serve` starts nothing
    get_settings.cache_clear()
    name = " ".join([script, *path])
    args: list[str] = FAILING_ARGS[name](tmp_path) if name in FAILING_ARGS else []
    for param in [] if name in FAILING_ARGS else command.params:
        if param.required and not param.name.startswith("json"):
            value = str(tmp_path / f"no-such-{param.name}")
            if param.param_type_name == "option":
                args += [param.opts[0], value]
            else:
                args.append(value)
    try:
        code, out, err = _run(script, [*path, *args, "--json"], capsys)
    finally:
        get_settings.cache_clear()
    _assert_one_error_document(script, code, out, err)
    assert not (tmp_path / "keel" / "run" / "up.json").exists()  # nothing was started
