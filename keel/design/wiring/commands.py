"""Shell commands (README blocks and CI steps) and the Terraform commands among them."""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterable
from dataclasses import dataclass

from keel.design.wiring.model import _ENV_NAME
from keel.design.wiring.terraform import _join


@dataclass(frozen=True)
class TfCommand:
    """A ``terraform`` command in a README or CI step, with what it passes."""

    file: str
    cwd: str
    subcommand: str
    variables: tuple[str, ...]
    var_files: tuple[str, ...]
    env_vars: tuple[str, ...]
    #: ``terraform apply PLANFILE``: a saved plan, which carries the variables it was
    #: planned with (None: no plan file).
    plan_file: str | None = None


#: Terraform flags that take a value as the next argument when not written ``-flag=value``.
_VALUE_FLAGS = frozenset(
    {"-target", "-out", "-replace", "-state", "-state-out", "-backup", "-lock-timeout",
     "-parallelism"}
)  # fmt: skip


def _split_commands(line: str) -> list[list[str]]:
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        tokens = list(lexer)
    except ValueError:
        return []
    commands: list[list[str]] = [[]]
    for tok in tokens:
        if tok and set(tok) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(tok)
    return [c for c in commands if c]


def logical_lines(script: str) -> list[str]:
    """The lines of a shell script or Dockerfile, each ``\\``-continued line joined."""
    out: list[str] = []
    buf = ""
    for raw in script.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    if buf:
        out.append(buf)
    return out


def shell_commands(
    script: str, cwd: str, env: Iterable[str] = ()
) -> tuple[list[tuple[str, list[str], tuple[str, ...]]], str]:
    """The commands of a shell script as (cwd, argv, TF_VAR names set), following ``cd``
    and ``export``; and the cwd it ends in."""
    exported = [e for e in env if e.startswith("TF_VAR_")]
    out: list[tuple[str, list[str], tuple[str, ...]]] = []
    for line in logical_lines(script):
        for argv in _split_commands(line):
            assigned = []
            while argv and "=" in argv[0] and _ENV_NAME.match(argv[0].split("=", 1)[0]):
                assigned.append(argv.pop(0).split("=", 1)[0])
            if not argv:
                exported += [a for a in assigned if a.startswith("TF_VAR_")]
                continue
            if argv[0] == "export":
                exported += [
                    a.split("=", 1)[0] for a in argv[1:] if a.split("=", 1)[0].startswith("TF_VAR_")
                ]
                continue
            if argv[0] == "cd" and len(argv) > 1 and not argv[1].startswith(("$", "~", "/")):
                cwd = _join(cwd, argv[1])
                continue
            tf = tuple(
                dict.fromkeys([*exported, *(a for a in assigned if a.startswith("TF_VAR_"))])
            )
            out.append((cwd, argv, tf))
    return out, cwd


def terraform_command(
    file: str, cwd: str, argv: list[str], env: tuple[str, ...]
) -> TfCommand | None:
    """``argv`` as a :class:`TfCommand` (None: not terraform)."""
    if not argv or posixpath.basename(argv[0]) != "terraform":
        return None
    rest = argv[1:]
    while rest and rest[0].startswith("-chdir="):
        cwd = _join(cwd, rest.pop(0).split("=", 1)[1])
    sub = rest[0] if rest else ""
    variables: list[str] = []
    var_files: list[str] = []
    positional: list[str] = []
    i = 1
    while i < len(rest):
        tok = rest[i]
        if tok in ("-var", "--var") and i + 1 < len(rest):
            variables.append(rest[i + 1].split("=", 1)[0].strip())
            i += 2
            continue
        if tok.startswith(("-var=", "--var=")):
            variables.append(tok.split("=", 1)[1].split("=", 1)[0].strip())
        elif tok in ("-var-file", "--var-file") and i + 1 < len(rest):
            var_files.append(rest[i + 1])
            i += 2
            continue
        elif tok.startswith(("-var-file=", "--var-file=")):
            var_files.append(tok.split("=", 1)[1])
        elif tok in _VALUE_FLAGS or ("-" + tok.lstrip("-")) in _VALUE_FLAGS:
            i += 2
            continue
        elif not tok.startswith("-"):
            positional.append(tok)
        i += 1
    return TfCommand(
        file=file,
        cwd=cwd,
        subcommand=sub,
        variables=tuple(variables),
        var_files=tuple(var_files),
        env_vars=tuple(e.removeprefix("TF_VAR_") for e in env),
        plan_file=positional[0] if sub == "apply" and positional else None,
    )


_FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")


def readme_blocks(text: str) -> list[str]:
    """The shell blocks of a Markdown file (fences marked sh, bash, shell, console or
    nothing), each without its indentation."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2).lower()
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith("```"):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        if lang in ("", "sh", "bash", "shell", "console", "zsh"):
            blocks.append("\n".join(ln.removeprefix("$ ") for ln in body))
    return blocks
