"""Python blocks (``.rllm`` pre/post transforms and similar) run inside the jail.

The host never executes the block: it writes the inputs as JSON and the block's source
into the jail's read-only /keel, and a small runner (``_block_runner.py``) inside the
jail executes the block with only those inputs bound, then writes the declared outputs
as JSON. Undeclared variables are ignored; a declared output that is missing or not
JSON-serialisable is a structured error, as is any exception the block raises.
"""

from __future__ import annotations

import asyncio
import json
import keyword
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from sandbox.errors import SandboxUnavailable
from sandbox.jail import Bind, _no_running_loop, run_async, unreachable_reason
from sandbox.models import SandboxConfig, SandboxLimits, SandboxResult, default_config

RESULT_FILE = ".keel_block_result.json"
#: Bounds on the result file the host parses. It is written inside the jail, so a block
#: can forge it: a result past these is an ``InvalidResult``, never a host exception.
MAX_RESULT_BYTES = 16 * 1024 * 1024
MAX_RESULT_DEPTH = 100
_RUNNER_SOURCE = (Path(__file__).with_name("_block_runner.py")).read_text(encoding="utf-8")


class PythonBlockError(BaseModel):
    """Why a block did not produce its outputs."""

    type: str
    message: str
    traceback: str = ""


class PythonBlockResult(BaseModel):
    """Outputs of a block (declared names only), or the error, plus what the jail saw."""

    ok: bool
    outputs: dict[str, Any] = Field(default_factory=dict)
    error: PythonBlockError | None = None
    stdout: str = ""
    stderr: str = ""
    run: SandboxResult


@dataclass(frozen=True)
class PythonRuntime:
    """An interpreter the jail can run, with the host paths it needs bound."""

    executable: str
    binds: list[Bind] = field(default_factory=list)


def _under(path: str, roots: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def _prefixes_of(executable: str) -> list[str]:
    """Install prefixes an interpreter needs: where it is called from and where it lives.

    For a venv's ``bin/python`` (a symlink) that is the venv and the base install.
    """
    given = Path(os.path.abspath(executable)).parent.parent
    real = Path(os.path.realpath(executable)).parent.parent
    return [str(real), str(given)]


def python_runtime(config: SandboxConfig | None = None) -> PythonRuntime:
    """Pick the interpreter for jailed Python.

    1. ``python.interpreter`` from the config, if set (must be usable, no fall-back);
    2. this process's interpreter with its virtual environment (``include_venv``),
       both bound read-only, when the jail can reach them;
    3. this process's base interpreter without the venv, if the jail can reach it;
    4. the first of ``python.fallback_interpreters`` that is usable (stdlib only).

    "Reach": the jail's mount setup cannot traverse directories such as /root
    (mode 700), so an interpreter installed under one is skipped.
    """
    cfg = config or default_config()
    system = [os.path.realpath(d) for d in cfg.jail.system_mounts if os.path.exists(d)]

    def runtime_for(executable: str, prefixes: Sequence[str]) -> PythonRuntime | None:
        if not os.path.isfile(executable):
            return None
        binds = []
        for prefix in dict.fromkeys(os.path.realpath(p) for p in prefixes):
            if _under(prefix, system):
                continue  # already visible through the system mounts
            if unreachable_reason(prefix):
                return None
            binds.append(Bind(prefix, prefix))
        visible = [*system, *(b.src for b in binds)]
        if not _under(executable, visible) or not _under(os.path.dirname(executable), visible):
            return None
        return PythonRuntime(executable, binds)

    if cfg.python.interpreter:
        exe = cfg.python.interpreter
        rt = runtime_for(exe, _prefixes_of(exe))
        if rt is None:
            raise SandboxUnavailable(
                f"python.interpreter {exe!r} is missing or not reachable from the jail"
            )
        return rt
    candidates: list[tuple[str, list[str]]] = []
    if cfg.python.include_venv and sys.prefix != sys.base_prefix:
        candidates.append((sys.executable, [sys.base_prefix, sys.prefix]))
    base_exe = getattr(sys, "_base_executable", None) or os.path.realpath(sys.executable)
    candidates.append((base_exe, [sys.base_prefix]))
    candidates += [(exe, _prefixes_of(exe)) for exe in cfg.python.fallback_interpreters]
    for exe, prefixes in candidates:
        rt = runtime_for(exe, prefixes)
        if rt is not None:
            return rt
    raise SandboxUnavailable(
        f"no Python interpreter is reachable from the jail ({sys.executable} lives under "
        "a directory the jail cannot traverse, and no fallback exists); set "
        "python.interpreter in configs/sandbox.yaml"
    )


def _check_name(name: str, what: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise ValueError(f"{what} name {name!r} is not a Python identifier")
    if name.startswith("__"):
        raise ValueError(f"{what} name {name!r}: dunder names are reserved")


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether parsed JSON nests lists/dicts deeper than ``limit`` (iterative, no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _load_result(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_RESULT_BYTES:
        raise ValueError(f"larger than {MAX_RESULT_BYTES} bytes")
    try:
        data = json.loads(raw)
    except RecursionError:
        # The decoder's own guard (about 1,000 levels) fired first.
        raise ValueError(f"nested deeper than {MAX_RESULT_DEPTH} levels") from None
    if not isinstance(data, dict):
        raise ValueError("not an object")
    # Few brackets cannot nest deeply; only then is the walk needed.
    if raw.count(b"[") + raw.count(b"{") > MAX_RESULT_DEPTH and _nested_deeper_than(
        data, MAX_RESULT_DEPTH
    ):
        raise ValueError(f"nested deeper than {MAX_RESULT_DEPTH} levels")
    return data


def _interpret(run: SandboxResult, outputs: Sequence[str]) -> PythonBlockResult:
    base: dict[str, Any] = {"stdout": run.stdout, "stderr": run.stderr, "run": run}
    raw = run.files.get(RESULT_FILE)
    if raw is None:
        if run.timed_out:
            err = PythonBlockError(type="Timeout", message="the block ran out of time")
        elif run.output_truncated:
            err = PythonBlockError(
                type="OutputLimitExceeded", message="the block printed more than allowed"
            )
        elif run.killed_by_signal is not None and run.memory_limit_hit:
            err = PythonBlockError(
                type="MemoryLimitExceeded",
                message=f"the block was killed at the jail's memory limit ({run.killed_by_signal})",
            )
        elif run.killed_by_signal is not None:
            err = PythonBlockError(
                type="Killed", message=f"the block was killed by signal {run.killed_by_signal}"
            )
        else:
            err = PythonBlockError(
                type="NoResult",
                message=f"the block left no result (exit code {run.exit_code}): "
                + (run.refused_files.get(RESULT_FILE) or "missing"),
                traceback=run.stderr[-4000:],
            )
        return PythonBlockResult(ok=False, error=err, **base)
    # The result file was written inside the jail, so it is as untrusted as the block:
    # every way parsing it can fail (RecursionError and MemoryError included) becomes
    # the structured error, so the caller never sees a host-side exception.
    try:
        data = _load_result(raw)
        if data.get("ok") is True:
            produced = data.get("outputs")
            if not isinstance(produced, dict):
                raise ValueError("outputs is not an object")
            missing = [n for n in outputs if n not in produced]
            if missing:
                raise ValueError(f"declared outputs missing: {missing}")
            return PythonBlockResult(ok=True, outputs={n: produced[n] for n in outputs}, **base)
        error = PythonBlockError.model_validate(data.get("error"))
    except (ValueError, TypeError, RecursionError, MemoryError) as exc:
        error = PythonBlockError(
            type="InvalidResult", message=f"unreadable block result: {str(exc)[:500]}"
        )
    return PythonBlockResult(ok=False, error=error, **base)


async def run_python_block_async(
    code: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    outputs: Sequence[str] = (),
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> PythonBlockResult:
    """Run a Python block in the jail with ``inputs`` bound; return declared ``outputs``.

    ``inputs`` must be JSON-serialisable (``TypeError``/``ValueError`` otherwise) and
    both inputs' and outputs' names must be identifiers. The block may print; stdout
    and stderr come back capped. Raises ``SandboxUnavailable`` if no jail can start.
    """
    cfg = config or default_config()
    inputs = dict(inputs or {})
    for name in inputs:
        _check_name(name, "input")
    for name in outputs:
        _check_name(name, "output")
    if len(set(outputs)) != len(outputs):
        raise ValueError("output names repeat")
    spec = {
        "inputs": inputs,
        "outputs": list(outputs),
        "result_path": f"/work/{RESULT_FILE}",
    }
    try:
        spec_json = json.dumps(spec, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"block inputs are not JSON-serialisable: {exc}") from exc
    runtime = python_runtime(cfg)
    run = await run_async(
        # -I: ignore PYTHON* variables and user site; -B: no .pyc (mounts are read-only
        # anyway); -X utf8: the same text encoding whatever the jail's locale.
        [runtime.executable, "-I", "-B", "-X", "utf8", "/keel/runner.py"],
        limits=limits,
        readonly_files={"runner.py": _RUNNER_SOURCE, "block.py": code, "spec.json": spec_json},
        output_files=[RESULT_FILE],
        binds=runtime.binds,
        config=cfg,
    )
    return _interpret(run, outputs)


def run_python_block(
    code: str,
    *,
    inputs: Mapping[str, Any] | None = None,
    outputs: Sequence[str] = (),
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> PythonBlockResult:
    """Blocking form of ``run_python_block_async``."""
    _no_running_loop("run_python_block")
    return asyncio.run(
        run_python_block_async(code, inputs=inputs, outputs=outputs, limits=limits, config=config)
    )


__all__ = [
    "PythonBlockError",
    "PythonBlockResult",
    "PythonRuntime",
    "python_runtime",
    "run_python_block",
    "run_python_block_async",
]
