"""ast-grep rewrite actions (the SRL agent's actions) applied inside the jail.

The files are copied into a fresh workspace, ast-grep rewrites them in place inside
the jail, and the host reads them back (never following links) and diffs them. A bad
action (unknown language, broken rule) is a result with ``error`` set, not an
exception: in SRL it is the model's mistake and becomes part of the trajectory.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.jail import Bind, _no_running_loop, run_async
from sandbox.models import SandboxConfig, SandboxLimits, SandboxResult, default_config
from sandbox.workspace import validate_relpath

JAIL_BINARY = "/opt/keel/bin/ast-grep"


class AstGrepAction(BaseModel):
    """One rewrite: an inline pattern + rewrite + language, or a YAML rule with a ``fix``."""

    pattern: str | None = None
    rewrite: str | None = None
    language: str | None = None
    rule: str | None = Field(None, description="YAML rule text (id, language, rule, fix)")
    paths: list[str] | None = Field(
        None, description="files to apply it to; default: every file given"
    )

    @model_validator(mode="after")
    def _one_form(self) -> AstGrepAction:
        inline = (self.pattern, self.rewrite, self.language)
        if self.rule is not None:
            if any(v is not None for v in inline):
                raise ValueError("give either rule or pattern/rewrite/language, not both")
        elif any(v is None for v in inline):
            raise ValueError("an inline action needs pattern, rewrite and language")
        return self


class AstGrepResult(BaseModel):
    """Files whose text changed (new contents), their unified diff, and the raw run."""

    ok: bool
    changed_files: dict[str, str] = Field(default_factory=dict)
    diff: str = ""
    error: str | None = None
    run: SandboxResult


def astgrep_binary(config: SandboxConfig | None = None) -> str:
    """The ast-grep executable: config, else next to this interpreter, else PATH.

    Only the name ``ast-grep``: ``sg`` on PATH is often shadow-utils' switch-group.
    """
    cfg = config or default_config()
    if cfg.astgrep.binary:
        candidates = [cfg.astgrep.binary]
    else:
        candidates = [str(Path(sys.executable).parent / "ast-grep")]
        found = shutil.which("ast-grep")
        if found:
            candidates.append(found)
    for c in candidates:
        if os.path.isfile(c) and os.access(c, os.X_OK):
            return os.path.realpath(c)
    raise SandboxUnavailable(f"ast-grep not found (looked at {candidates}); install ast-grep-cli")


def unified_diff(before: Mapping[str, str], after: Mapping[str, str]) -> str:
    """A ``git diff``-style unified diff of the files whose text differs."""
    out: list[str] = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path, ""), after.get(path, "")
        if a == b:
            continue
        lines = difflib.unified_diff(_lines(a), _lines(b), fromfile=f"a/{path}", tofile=f"b/{path}")
        out.extend(lines)
    return "".join(out)


def _lines(text: str) -> list[str]:
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        # Same marker as diff(1), so a patch tool applies the diff exactly.
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def _action_argv(action: AstGrepAction) -> tuple[list[str], dict[str, str]]:
    """The jailed ast-grep command of ``action`` (``scan`` with its rule, or ``run`` with
    its pattern and rewrite), and the read-only files it reads (the rule)."""
    if action.rule is not None:
        return [JAIL_BINARY, "scan", "--rule", "/keel/rule.yml"], {"rule.yml": action.rule}
    assert action.pattern is not None and action.rewrite is not None
    assert action.language is not None
    argv = [JAIL_BINARY, "run", "--pattern", action.pattern, "--rewrite", action.rewrite]
    return [*argv, "--lang", action.language], {}


async def apply_astgrep_async(
    action: AstGrepAction,
    files: Mapping[str, str],
    *,
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> AstGrepResult:
    """Apply ``action`` to ``files`` (relative path -> text) inside the jail.

    Paths that escape the workspace raise ``SandboxError`` before anything runs.
    """
    cfg = config or default_config()
    clean = {validate_relpath(p).as_posix(): text for p, text in files.items()}
    targets = [validate_relpath(p).as_posix() for p in (action.paths or list(clean))]
    unknown = [p for p in targets if p not in clean]
    if unknown:
        raise SandboxError(f"action names files not in the workspace: {unknown}")
    threads = str(cfg.astgrep.threads)
    argv, readonly = _action_argv(action)
    # "./" keeps a file named like a flag from being read as one.
    argv += ["--update-all", "--threads", threads, *(f"./{p}" for p in targets)]
    run = await run_async(
        argv,
        limits=limits,
        workspace_files=clean,
        readonly_files=readonly,
        # Few malloc arenas: RLIMIT_AS counts their reserved address space.
        env={"MALLOC_ARENA_MAX": "2", "NO_COLOR": "1"},
        output_files=targets,
        binds=[Bind(astgrep_binary(cfg), JAIL_BINARY)],
        config=cfg,
    )
    error: str | None = None
    # ast-grep exits 1 when nothing matched; that is a valid, empty rewrite.
    if run.timed_out or run.killed_by_signal is not None or run.exit_code not in (0, 1):
        error = (
            f"ast-grep failed (exit {run.exit_code}, signal {run.killed_by_signal}, "
            f"timed out {run.timed_out}): {run.stderr.strip()[-2000:]}"
        )
    elif run.refused_files:
        error = f"could not read back rewritten files: {run.refused_files}"
    after: dict[str, str] = {}
    if error is None:
        for p in targets:
            after[p] = run.files[p].decode("utf-8", errors="replace")
    changed = {p: t for p, t in after.items() if t != clean[p]}
    return AstGrepResult(
        ok=error is None,
        changed_files=changed,
        diff=unified_diff({p: clean[p] for p in changed}, changed),
        error=error,
        run=run,
    )


async def _json_matches(
    argv: list[str],
    files: Mapping[str, str],
    readonly: Mapping[str, str],
    limits: SandboxLimits | None,
    cfg: SandboxConfig,
) -> tuple[SandboxResult, list[Any], str | None]:
    """Run ast-grep with ``--json`` in the jail over ``files``: the run, its matches, and
    why there are none to read (a failed run, or output that is not JSON) or None. Exit 1
    is not a failure: ``scan`` exits 1 when it found error-severity matches."""
    run = await run_async(
        argv,
        limits=limits,
        workspace_files=dict(files),
        readonly_files=dict(readonly),
        env={"MALLOC_ARENA_MAX": "2", "NO_COLOR": "1"},
        binds=[Bind(astgrep_binary(cfg), JAIL_BINARY)],
        config=cfg,
    )
    if run.timed_out or run.killed_by_signal is not None or run.exit_code not in (0, 1):
        error = (
            f"ast-grep failed (exit {run.exit_code}, signal {run.killed_by_signal}, "
            f"timed out {run.timed_out}): {run.stderr.strip()[-2000:]}"
        )
        return run, [], error
    try:
        matches = json.loads(run.stdout or "[]")
    except json.JSONDecodeError as e:
        return run, [], f"ast-grep printed no JSON: {e}"
    return run, matches if isinstance(matches, list) else [], None


class AstGrepSpans(BaseModel):
    """Per file: the regions a rewrite replaces, as UTF-8 byte offsets ``[start, end)``
    (ast-grep's ``replacementOffsets``: ``expandStart``/``expandEnd`` included)."""

    ok: bool
    spans: dict[str, list[tuple[int, int]]] = Field(default_factory=dict)
    error: str | None = None
    run: SandboxResult


async def astgrep_spans_async(
    action: AstGrepAction,
    files: Mapping[str, str],
    *,
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> AstGrepSpans:
    """The regions ``action`` would replace in ``files``, from ast-grep's JSON output inside
    the jail (nothing is rewritten): what tells a rewrite of the whole file from one of
    the code in it."""
    cfg = config or default_config()
    clean = {validate_relpath(p).as_posix(): text for p, text in files.items()}
    targets = [validate_relpath(p).as_posix() for p in (action.paths or list(clean))]
    argv, readonly = _action_argv(action)
    argv += ["--json=compact", "--threads", str(cfg.astgrep.threads)]
    argv += [f"./{p}" for p in targets]
    run, matches, error = await _json_matches(argv, clean, readonly, limits, cfg)
    if error is not None:
        return AstGrepSpans(ok=False, error=error, run=run)
    spans: dict[str, list[tuple[int, int]]] = {p: [] for p in targets}
    for m in matches:
        path = str(m.get("file", "")).removeprefix("./")
        where = m.get("replacementOffsets") or (m.get("range") or {}).get("byteOffset") or {}
        start, end = where.get("start"), where.get("end")
        if isinstance(start, int) and isinstance(end, int):
            spans.setdefault(path, []).append((start, end))
    return AstGrepSpans(ok=True, spans=spans, run=run)


def apply_astgrep(
    action: AstGrepAction,
    files: Mapping[str, str],
    *,
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> AstGrepResult:
    """Blocking form of ``apply_astgrep_async``."""
    _no_running_loop("apply_astgrep")
    return asyncio.run(apply_astgrep_async(action, files, limits=limits, config=config))


# An ast-grep rule matching tree-sitter's ERROR nodes: a file with none parses. (Tree-sitter
# also inserts zero-width MISSING nodes, e.g. an unclosed paren, which no rule can name;
# callers that need more, such as Python's ``ast.parse``, add their own check.)
_PARSE_ERROR_RULE = "id: parse-error\nlanguage: {language}\nseverity: error\nrule:\n  kind: ERROR\n"


class ParseCheck(BaseModel):
    """Per file: the texts of its parse errors (empty when the file parses)."""

    ok: bool
    errors: dict[str, list[str]] = Field(default_factory=dict)
    error: str | None = Field(None, description="the check itself failed (not the files)")
    run: SandboxResult


async def check_parses_async(
    files: Mapping[str, str],
    language: str,
    *,
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> ParseCheck:
    """Parse ``files`` as ``language`` with ast-grep inside the jail and list ERROR nodes."""
    cfg = config or default_config()
    clean = {validate_relpath(p).as_posix(): text for p, text in files.items()}
    argv = [JAIL_BINARY, "scan", "--rule", "/keel/rule.yml", "--json=compact"]
    argv += ["--threads", str(cfg.astgrep.threads), *(f"./{p}" for p in clean)]
    rule = {"rule.yml": _PARSE_ERROR_RULE.format(language=language)}
    run, matches, error = await _json_matches(argv, clean, rule, limits, cfg)
    if error is not None:
        return ParseCheck(ok=False, error=error, run=run)
    errors: dict[str, list[str]] = {p: [] for p in clean}
    for m in matches:
        path = str(m.get("file", "")).removeprefix("./")
        errors.setdefault(path, []).append(str(m.get("text", ""))[:200])
    return ParseCheck(ok=True, errors=errors, run=run)
