"""The validators that only read files, on the host in a temporary directory: the HCL
parse, checkov, actionlint and hadolint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from activities.design.validators.jailed import _OUTPUT_TAIL, _venv_bin
from keel.design.validation import ValidatorResult
from sandbox.tether import tethered

#: Wall-clock limit of one host tool run.
HOST_TIMEOUT_S = 240.0
#: The checkov environment scripts/bootstrap.sh makes; KEEL_CHECKOV overrides it.
CHECKOV_ENV = "KEEL_CHECKOV"
_REPO_ROOT = Path(__file__).resolve().parents[3]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


async def _host(
    argv: Sequence[str],
    cwd: Path,
    timeout_s: float = HOST_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
) -> tuple[int | None, str, str]:
    """Run a read-only tool over ``cwd``; (exit code or None on timeout, stdout, stderr)."""
    # Its own session (a timeout kills its group), and tethered: it dies with the worker.
    proc = await asyncio.create_subprocess_exec(
        *tethered(argv),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        _kill_group(proc.pid)
        await proc.wait()
        return None, "", f"timed out after {timeout_s:g} s"
    except asyncio.CancelledError:
        _kill_group(proc.pid)
        raise
    return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def run_hcl(files: Mapping[str, str]) -> ValidatorResult:
    """Parse every ``.tf`` file with python-hcl2."""
    tf = sorted(p for p in files if p.endswith(".tf"))
    if not tf:
        return ValidatorResult(name="hcl", status="not_run", summary="no Terraform files")
    try:
        import hcl2
    except ImportError:
        return ValidatorResult(name="hcl", status="not_run", summary="python-hcl2 is not installed")
    errors: dict[str, str] = {}
    resources: dict[str, int] = {}
    for path in tf:
        try:
            doc = hcl2.loads(files[path])
        except Exception as exc:  # the parser raises lark errors of several classes
            errors[path] = f"{type(exc).__name__}: {str(exc)[:500]}"
            continue
        resources[path] = sum(len(block) for block in doc.get("resource", []))
    if errors:
        return ValidatorResult(
            name="hcl",
            status="failed",
            summary=f"{len(errors)} of {len(tf)} Terraform files do not parse",
            details={"errors": errors},
        )
    return ValidatorResult(
        name="hcl",
        status="passed",
        summary=f"{len(tf)} Terraform files parse, {sum(resources.values())} resources",
        details={"resources": resources},
    )


def _checkov_binary() -> str | None:
    explicit = os.environ.get(CHECKOV_ENV)
    for candidate in (explicit, str(_REPO_ROOT / ".tools" / "checkov" / "bin" / "checkov")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return _venv_bin("checkov")


def _unreadable(name: str, code: int, err: str) -> ValidatorResult:
    """A host tool whose JSON report does not parse did not run as a check: ``not_run``,
    with its exit code and the tail of its stderr."""
    return ValidatorResult(
        name=name,
        status="not_run",
        summary=f"unreadable {name} output (exit {code})",
        details={"stderr": err[-_OUTPUT_TAIL:]},
    )


def _checkov_argv(binary: str, files: Mapping[str, str]) -> list[str]:
    """checkov over the tree: Terraform, the workflows and, where there are any, the
    Dockerfiles; JSON on stdout, never failing the process on a finding."""
    dockerfiles = any(p.rsplit("/", 1)[-1] == "Dockerfile" for p in files)
    frameworks = ["terraform", "github_actions"] + (["dockerfile"] if dockerfiles else [])
    return [
        binary,
        "-d",
        ".",
        "--framework",
        *frameworks,
        "-o",
        "json",
        "--quiet",
        "--compact",
        "--skip-download",
        "--soft-fail",
    ]


def _checkov_verdict(data: Any) -> ValidatorResult:
    """checkov's JSON report (one framework's, or a list of them) as a result: failed
    on any failed check or parse error."""
    reports = data if isinstance(data, list) else [data]
    summary: dict[str, Any] = {}
    failed: list[dict[str, Any]] = []
    for report in reports:
        if not isinstance(report, dict) or "check_type" not in report:
            continue
        summary[report["check_type"]] = report.get("summary", {})
        for check in report.get("results", {}).get("failed_checks", []):
            failed.append(
                {
                    "check_id": check.get("check_id"),
                    "check_name": check.get("check_name"),
                    "file": str(check.get("file_path", "")).lstrip("/"),
                    "resource": check.get("resource"),
                }
            )
    parse_errors = sum(int(s.get("parsing_errors", 0)) for s in summary.values())
    passed = sum(int(s.get("passed", 0)) for s in summary.values())
    details = {"summary": summary, "failed_checks": failed}
    if failed or parse_errors:
        ids = sorted({str(f["check_id"]) for f in failed})
        return ValidatorResult(
            name="checkov",
            status="failed",
            summary=f"{len(failed)} failed checks ({', '.join(ids[:10])}), {parse_errors} parse errors",
            details=details,
        )
    return ValidatorResult(
        name="checkov", status="passed", summary=f"{passed} checks passed", details=details
    )


async def run_checkov(files: Mapping[str, str], root: Path) -> ValidatorResult:
    if not any(p.endswith(".tf") for p in files):
        return ValidatorResult(name="checkov", status="not_run", summary="no Terraform files")
    binary = _checkov_binary()
    if binary is None:
        return ValidatorResult(
            name="checkov",
            status="not_run",
            summary="checkov is not installed (scripts/bootstrap.sh puts it in .tools/checkov)",
        )
    code, out, err = await _host(
        _checkov_argv(binary, files),
        root,
        # One process: on the 2-core machine checkov's forked runners saved no wall time
        # and cost about 0.9 s more of CPU a run (rag tree, two runs each way: 6.7-7.3 s
        # of CPU forked, 5.9-6.9 s not; wall 5.8-7.1 s either way).
        env={"CHECKOV_PARALLELIZATION_TYPE": "none"},
    )
    if code is None:
        return ValidatorResult(name="checkov", status="not_run", summary=f"checkov {err}")
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        return _unreadable("checkov", code, err)
    return _checkov_verdict(data)


async def run_actionlint(files: Mapping[str, str], root: Path) -> ValidatorResult:
    workflows = sorted(
        p for p in files if p.startswith(".github/workflows/") and p.endswith((".yml", ".yaml"))
    )
    if not workflows:
        return ValidatorResult(name="actionlint", status="not_run", summary="no workflows")
    binary = _venv_bin("actionlint")
    if binary is None:
        return ValidatorResult(
            name="actionlint", status="not_run", summary="actionlint is not installed"
        )
    code, out, err = await _host(
        [binary, "-no-color", "-format", "{{json .}}", "-shellcheck=", "-pyflakes=", *workflows],
        root,
    )
    if code is None:
        return ValidatorResult(name="actionlint", status="not_run", summary=f"actionlint {err}")
    try:
        findings = json.loads(out or "[]")
    except json.JSONDecodeError:
        return _unreadable("actionlint", code, err)
    if code not in (0, 1):
        return ValidatorResult(
            name="actionlint",
            status="not_run",
            summary=f"actionlint failed to run (exit {code})",
            details={"stderr": err[-_OUTPUT_TAIL:]},
        )
    items = [
        {
            "file": f.get("filepath"),
            "line": f.get("line"),
            "kind": f.get("kind"),
            "message": f.get("message"),
        }
        for f in findings
    ]
    if items:
        return ValidatorResult(
            name="actionlint",
            status="failed",
            summary=f"{len(items)} findings in {len(workflows)} workflows",
            details={"findings": items},
        )
    return ValidatorResult(
        name="actionlint",
        status="passed",
        summary=f"{len(workflows)} workflows clean",
        details={"workflows": workflows},
    )


async def run_hadolint(files: Mapping[str, str], root: Path) -> ValidatorResult:
    dockerfiles = sorted(p for p in files if p.rsplit("/", 1)[-1] == "Dockerfile")
    if not dockerfiles:
        return ValidatorResult(
            name="hadolint", status="not_run", summary="no Dockerfile in the repository"
        )
    binary = _venv_bin("hadolint")
    if binary is None:
        return ValidatorResult(
            name="hadolint", status="not_run", summary="hadolint is not installed"
        )
    code, out, err = await _host(
        [binary, "--no-color", "-f", "json", "--failure-threshold", "warning", *dockerfiles], root
    )
    if code is None:
        return ValidatorResult(name="hadolint", status="not_run", summary=f"hadolint {err}")
    try:
        findings = json.loads(out or "[]")
    except json.JSONDecodeError:
        return _unreadable("hadolint", code, err)
    serious = [f for f in findings if f.get("level") in ("error", "warning")]
    details = {"findings": findings, "dockerfiles": dockerfiles}
    if serious or code != 0:
        return ValidatorResult(
            name="hadolint",
            status="failed",
            summary=f"{len(serious)} warnings or errors: "
            + ", ".join(sorted({str(f.get("code")) for f in serious})),
            details=details,
        )
    return ValidatorResult(
        name="hadolint",
        status="passed",
        summary=f"{len(dockerfiles)} Dockerfile(s) clean ({len(findings)} info/style notes)",
        details=details,
    )


#: Where the tree carries its CycloneDX SBOM.
