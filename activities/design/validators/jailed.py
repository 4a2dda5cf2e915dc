"""The validators that run the repository's code (ruff, mypy, pytest, smoke), inside the
nsjail sandbox with the repository as the jail's workspace (no network: the jail's network
namespace has only loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from activities.design.mypy_seed import SEED_MOUNT, seed_path
from activities.design.mypy_seed import jail_code as seed_jail_code
from activities.design.mypy_seed import seed_dir as mypy_seed_dir
from keel.design.validation import ValidatorResult
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.jail import Bind, run_async
from sandbox.models import SandboxConfig, SandboxLimits, SandboxResult
from sandbox.python_block import python_runtime

#: Limits of one jailed tool run (mypy over FastAPI and pydantic needs room).
JAIL_LIMITS = SandboxLimits(
    wall_time_s=240,
    cpu_time_s=240,
    memory_mb=2048,
    max_processes=64,
    max_file_size_mb=16,
    max_open_files=1024,
    max_output_bytes=2_000_000,
    tmpfs_size_mb=64,
    workspace_size_mb=64,
)
#: How much of a tool's output a result keeps (its tail).
_OUTPUT_TAIL = 4000


def _venv_bin(name: str) -> str | None:
    """A tool installed next to this interpreter (the project's venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    from shutil import which

    return which(name)


@functools.cache
def _minor_version(executable: str) -> str | None:
    """``"3.11"`` for an interpreter (run on the host: it is the interpreter, not repo code)."""
    try:
        out = subprocess.run(
            [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _site_packages() -> list[str]:
    return [p for p in sys.path if p.endswith("site-packages") and os.path.isdir(p)]


def _import_paths() -> dict[str, str]:
    """The jailed interpreter's import paths: this venv's site-packages, no user site."""
    return {
        "PYTHONPATH": ":".join(os.path.realpath(p) for p in _site_packages()),
        "PYTHONNOUSERSITE": "1",
    }


def _with_site_packages(binds: list[Bind]) -> list[Bind]:
    """``binds`` and, read-only, each of this venv's site-packages the jail does not see
    through them yet."""
    visible = {b.src for b in binds}
    out = list(binds)
    for path in _site_packages():
        real = os.path.realpath(path)
        if not any(real == v or real.startswith(v.rstrip("/") + "/") for v in visible):
            out.append(Bind(real, real))
    return out


async def _jailed(
    name: str,
    argv_tail: Sequence[str],
    files: Mapping[str, str],
    config: SandboxConfig,
    *,
    binary: str | None = None,
    extra_binds: Sequence[Bind] = (),
    limits: SandboxLimits = JAIL_LIMITS,
    output_files: Sequence[str] = (),
) -> SandboxResult | ValidatorResult:
    """Run ``python -m <tool>`` (or ``binary``) in a jail holding the repository.

    The jail's interpreter may be a system one (this venv's base interpreter can sit
    where the jail cannot traverse); the venv's site-packages are then bound read-only
    and put on ``PYTHONPATH`` so the tools and the repository's dependencies import.
    """
    try:
        runtime = python_runtime(config)
    except SandboxUnavailable as exc:
        return ValidatorResult(name=name, status="not_run", summary=f"no jail: {exc}")
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if binary is None and _minor_version(runtime.executable) != here:
        # This venv's compiled packages only load in the same minor version.
        return ValidatorResult(
            name=name,
            status="not_run",
            summary=f"the jail's interpreter {runtime.executable} is not Python {here}; "
            "set python.interpreter in configs/sandbox.yaml",
        )
    binds = _with_site_packages([*runtime.binds, *extra_binds])
    env = {
        **_import_paths(),
        "PYTHONDONTWRITEBYTECODE": "1",
        # The repository's tests need none of this venv's pytest plugins, and some are
        # slow to import.
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "MYPY_FORCE_COLOR": "0",
    }
    if binary is not None:
        real = os.path.realpath(binary)
        binds.append(Bind(real, "/keel-tools/" + os.path.basename(real)))
        argv = ["/keel-tools/" + os.path.basename(real), *argv_tail]
    else:
        argv = [runtime.executable, "-B", *argv_tail]
    try:
        return await run_async(
            argv,
            limits=limits,
            workspace_files=dict(files),
            env=env,
            binds=binds,
            config=config,
            output_files=output_files,
        )
    except (SandboxUnavailable, SandboxError) as exc:
        return ValidatorResult(name=name, status="not_run", summary=f"the jail did not run: {exc}")


_LIMIT_WORDS = {
    "wall": "wall-clock limit (timed out)",
    "cpu": "CPU-time limit (timed out)",
    "memory": "memory limit",
    "output": "output limit",
}


def _from_jail(name: str, run: SandboxResult | ValidatorResult, what: str) -> ValidatorResult:
    if isinstance(run, ValidatorResult):
        return run
    output = (run.stdout + ("\n" + run.stderr if run.stderr.strip() else "")).strip()
    details = {
        "exit_code": run.exit_code,
        "duration_ms": run.duration_ms,
        "timed_out": run.timed_out,
        "output": output[-_OUTPUT_TAIL:],
        "sandbox": "nsjail",
    }
    if run.limit is not None:
        details["limit"] = run.limit
    if run.ok:
        return ValidatorResult(
            name=name, status="passed", summary=f"{what}: clean", details=details
        )
    if run.limit is not None or run.timed_out or run.killed_by_signal is not None:
        why = (
            f"stopped at the sandbox's {_LIMIT_WORDS[run.limit]}"
            if run.limit is not None
            else "timed out"
            if run.timed_out
            else f"killed by signal {run.killed_by_signal}"
        )
        return ValidatorResult(
            name=name, status="failed", summary=f"{what}: {why}", details=details
        )
    last = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "no output")
    return ValidatorResult(
        name=name,
        status="failed",
        summary=f"{what}: exit {run.exit_code}: {last[:300]}",
        details=details,
    )


async def run_ruff(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    binary = _venv_bin("ruff")
    if binary is None:
        return ValidatorResult(name="ruff", status="not_run", summary="ruff is not installed")
    run = await _jailed(
        "ruff",
        ["check", "--no-cache", "--output-format", "concise", "."],
        files,
        config,
        binary=binary,
    )
    return _from_jail("ruff", run, "ruff check")


def _seed_for(config: SandboxConfig) -> tuple[str | None, str, dict[str, str]]:
    """The seed's base folder, interpreter and import paths for ``config``'s jailed
    mypy (:func:`activities.design.mypy_seed.seed_dir`'s arguments)."""
    return config.jail.base_dir, python_runtime(config).executable, _import_paths()


async def run_mypy(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    """mypy in the jail, from the warm cache of :mod:`activities.design.mypy_seed` when
    there is one (``details["seeded"]``: the run was given the seed), else with no cache."""
    seed = None
    with contextlib.suppress(SandboxUnavailable):  # no jail: _jailed says so
        seed = await asyncio.to_thread(mypy_seed_dir, *_seed_for(config))
    if seed is None:
        run = await _jailed("mypy", ["-m", "mypy", "--cache-dir=/dev/null"], files, config)
    else:
        run = await _jailed(
            "mypy",
            ["-c", seed_jail_code()],
            files,
            config,
            extra_binds=[Bind(str(seed), SEED_MOUNT)],
            # Room in the jail's /tmp for the seed's copy (22 MB) and what mypy adds.
            limits=JAIL_LIMITS.model_copy(update={"tmpfs_size_mb": 192}),
        )
    result = _from_jail("mypy", run, "mypy")
    if isinstance(run, SandboxResult):
        result.details["seeded"] = seed is not None
    return result


def warm_mypy_seed(config: SandboxConfig, say: Callable[[str], None] | None = None) -> str:
    """Build the seed of :func:`run_mypy` now if this machine lacks it, for the jailed
    interpreter ``config`` picks; what was done, in words.

    ``scripts/bootstrap.sh`` calls it at setup (``python -m
    activities.design.seed_warmup``): the build is a minute of CPU once per
    machine (and per checkout: the key names the interpreter's path), which otherwise
    fell on the first design run's validators: the README's first command on a fresh
    machine, and the suite's first validator test (120.3 s against 19.4 s warm, in a
    clean clone with an empty cache).
    """
    try:
        where = _seed_for(config)
    except SandboxUnavailable as exc:
        return f"not built: no jailed Python ({exc}); the first mypy run builds it"
    if say is not None and not (seed_path(*where) / "ok").is_file():
        say("building it (once per machine and checkout: about a minute) ...")
    seed = mypy_seed_dir(*where)
    return f"ready at {seed}" if seed is not None else "not built (see the warning above)"


async def run_pytest(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    run = await _jailed(
        "pytest", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header"], files, config
    )
    return _from_jail("pytest", run, "pytest")


#: Where the jailed smoke writes its report (relative to the repository root).
SMOKE_REPORT = "smoke-out/report.json"
#: What the generated smoke imports beyond the repository's runtime requirements: moto
#: stands in for S3 there. Keel's environment (the jail's site-packages) must have it.
SMOKE_NEEDS = ("moto", "uvicorn", "boto3")


def _smoke_summary(report: Mapping[str, Any]) -> str:
    """One line: the entry points, the metrics, the drift verdict and the time."""
    metrics = report.get("metrics") or {}
    shown = ", ".join(
        f"{k} {v}" for k, v in sorted(metrics.items()) if k in ("auc", "accuracy", "rmse", "mae")
    )
    drift = report.get("drift") or {}
    drifted = drift.get("drifted")
    return (
        f"smoke: {len(report.get('steps') or [])} steps passed in {report.get('seconds')} s; "
        f"served through {', '.join(report.get('entry_points') or [])}"
        + (f"; {shown}" if shown else "")
        + (
            f"; drift over {drift.get('rows')} served rows: "
            f"{'drifted ' + ', '.join(drifted) if drifted else 'none'}"
            if drift
            else ""
        )
    )


def smoke_result(run: SandboxResult) -> ValidatorResult:
    """The smoke's verdict from a jailed run and the report it wrote.

    Passed only when the smoke exited 0 and its report says every step passed; a failed
    step fails the validator naming the step and its detail; a run that wrote no report
    fails with its exit status and last line (the repository's smoke is broken), or
    with the sandbox limit that stopped it.
    """
    base = _from_jail("smoke", run, "make smoke")
    details = dict(base.details)
    raw = run.files.get(SMOKE_REPORT)
    report: dict[str, Any] | None = None
    if raw is not None:
        try:
            loaded = json.loads(raw)
        except ValueError:
            loaded = None
        report = loaded if isinstance(loaded, dict) else None
    if report is None:
        why = run.refused_files.get(SMOKE_REPORT, "not written")
        summary = base.summary if base.status == "failed" else "make smoke: exit 0"
        return ValidatorResult(
            name="smoke",
            status="failed",
            summary=f"{summary}; no {SMOKE_REPORT} ({why})",
            details=details,
        )
    details["report"] = report
    steps = [s for s in report.get("steps") or [] if isinstance(s, dict)]
    failed = next((s for s in steps if not s.get("ok")), None)
    if failed is not None:
        finding: dict[str, Any] = {
            "message": f"smoke step {failed.get('name')} failed: {failed.get('detail')}"
        }
        if failed.get("file"):
            finding.update(file=failed["file"], line=failed.get("line"))
        details["findings"] = [finding]
        return ValidatorResult(
            name="smoke",
            status="failed",
            summary=f"smoke step {failed.get('name')} failed: {str(failed.get('detail'))[:300]}",
            details=details,
        )
    if base.status != "passed" or report.get("passed") is not True or not steps:
        return ValidatorResult(
            name="smoke",
            status="failed",
            summary=f"{base.summary}; the report says passed={report.get('passed')} "
            f"with {len(steps)} step(s)",
            details=details,
        )
    return ValidatorResult(
        name="smoke", status="passed", summary=_smoke_summary(report), details=details
    )


async def run_smoke(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    """``python -m services.smoke --out smoke-out`` in the jail (what ``make smoke``
    runs): the sample pipeline and a prediction through every serving entry point, with
    S3 in moto; the report it writes is kept in ``details["report"]``."""
    if "services/smoke.py" not in files:
        return ValidatorResult(
            name="smoke", status="not_run", summary="the repository has no services/smoke.py"
        )
    missing = [m for m in SMOKE_NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        return ValidatorResult(
            name="smoke",
            status="not_run",
            summary=f"Keel's environment lacks {', '.join(missing)}, which the smoke imports",
        )
    run = await _jailed(
        "smoke",
        ["-m", "services.smoke", "--out", SMOKE_REPORT.rsplit("/", 1)[0]],
        files,
        config,
        output_files=[SMOKE_REPORT],
    )
    if isinstance(run, ValidatorResult):
        return run
    return smoke_result(run)
