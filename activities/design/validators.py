"""Validators (§21.1 node 10) run on a generated repository.

ruff, mypy and pytest execute (or import) the repository's code, so they run inside the
nsjail sandbox with the repository as the jail's workspace. The other checks only read
files and run on the host in a temporary directory: an HCL parse and checkov on the
Terraform, actionlint on the workflows, hadolint on a Dockerfile, a CycloneDX SBOM of
``requirements.txt`` (checked, not made, here: :func:`add_sbom` puts it in the tree
before validation), a secret scan (detect-secrets) and the wiring check (the pieces
against each other: :mod:`keel.design.wiring`). Each result is a
:class:`~keel.design.validation.ValidatorResult`; a validator whose tool is missing, or
whose jail cannot start, is ``not_run`` with the reason, never ``passed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from temporalio import activity

from activities.design.codegen import check_paths
from activities.design.mypy_seed import SEED_MOUNT
from activities.design.mypy_seed import jail_code as seed_jail_code
from activities.design.mypy_seed import seed_dir as mypy_seed_dir
from activities.heartbeat import heartbeating
from keel.design.validation import ValidationReport, ValidatorResult
from keel.design.wiring import RULES as WIRING_RULES
from keel.design.wiring import check_wiring as wiring_findings
from sandbox.errors import SandboxError, SandboxUnavailable
from sandbox.jail import Bind, run_async
from sandbox.models import SandboxConfig, SandboxLimits, SandboxResult, default_config
from sandbox.python_block import python_runtime
from sandbox.tether import tethered

log = logging.getLogger(__name__)

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
#: Wall-clock limit of one host tool run.
HOST_TIMEOUT_S = 240.0
#: The checkov environment scripts/bootstrap.sh makes; KEEL_CHECKOV overrides it.
CHECKOV_ENV = "KEEL_CHECKOV"
_REPO_ROOT = Path(__file__).resolve().parents[2]
_OUTPUT_TAIL = 4000

# ------------------------------------------------------------------------ secret scan

#: The secret scanner: Yelp's detect-secrets, its default plugins (AWS, private keys,
#: GitHub, Slack, Stripe, JWT, basic-auth URLs, secret keywords, high-entropy strings...).
SECRET_SCANNER = "detect-secrets"


def _write_tree(files: Mapping[str, str], root: Path) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


def scan_secrets(files: Mapping[str, str]) -> ValidatorResult:
    """detect-secrets over every file; a finding names the file, line and secret type,
    never the value."""
    try:
        from importlib.metadata import version

        from detect_secrets import SecretsCollection
        from detect_secrets.settings import default_settings
    except ImportError:
        return ValidatorResult(
            name="secrets", status="not_run", summary="detect-secrets is not installed"
        )
    scanner = f"{SECRET_SCANNER} {version(SECRET_SCANNER)}"
    findings: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="keel-secrets-") as tmp:
        _write_tree(files, Path(tmp))
        found = SecretsCollection(root=tmp)
        with default_settings() as settings:
            plugins = sorted(settings.plugins)
            for path in sorted(files):
                found.scan_file(path)
        for path, secret in found:
            findings.append({"file": path, "line": secret.line_number, "rule": secret.type})
    findings.sort(key=lambda f: (f["file"], f["line"], f["rule"]))
    details: dict[str, Any] = {"scanner": scanner, "plugins": plugins}
    if findings:
        rules = sorted({f["rule"] for f in findings})
        return ValidatorResult(
            name="secrets",
            status="failed",
            summary=f"{len(findings)} possible secret(s): {', '.join(rules)}",
            details={**details, "findings": findings[:200]},
        )
    return ValidatorResult(
        name="secrets",
        status="passed",
        summary=f"{scanner}: no secrets found in {len(files)} files",
        details=details,
    )


# ------------------------------------------------------------------------------ jailed


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


async def _jailed(
    name: str,
    argv_tail: Sequence[str],
    files: Mapping[str, str],
    config: SandboxConfig,
    *,
    binary: str | None = None,
    extra_binds: Sequence[Bind] = (),
    limits: SandboxLimits = JAIL_LIMITS,
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
    binds = [*runtime.binds, *extra_binds]
    visible = {b.src for b in binds}
    site = _site_packages()
    for path in site:
        real = os.path.realpath(path)
        if not any(real == v or real.startswith(v.rstrip("/") + "/") for v in visible):
            binds.append(Bind(real, real))
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


async def run_mypy(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    """mypy in the jail, from the warm cache of :mod:`activities.design.mypy_seed` when
    there is one (``details["seeded"]``: the run was given the seed), else with no cache."""
    seed = None
    with contextlib.suppress(SandboxUnavailable):  # no jail: _jailed says so
        executable = python_runtime(config).executable
        seed = await asyncio.to_thread(
            mypy_seed_dir, config.jail.base_dir, executable, _import_paths()
        )
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


async def run_pytest(files: Mapping[str, str], config: SandboxConfig) -> ValidatorResult:
    run = await _jailed(
        "pytest", ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header"], files, config
    )
    return _from_jail("pytest", run, "pytest")


# -------------------------------------------------------------------------------- host


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
    dockerfiles = any(p.rsplit("/", 1)[-1] == "Dockerfile" for p in files)
    frameworks = ["terraform", "github_actions"] + (["dockerfile"] if dockerfiles else [])
    code, out, err = await _host(
        [
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
        ],
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
        return ValidatorResult(
            name="checkov",
            status="not_run",
            summary=f"checkov gave no JSON report (exit {code})",
            details={"stderr": err[-_OUTPUT_TAIL:]},
        )
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
        return ValidatorResult(
            name="actionlint",
            status="not_run",
            summary=f"unreadable actionlint output (exit {code})",
            details={"stderr": err[-_OUTPUT_TAIL:]},
        )
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
        return ValidatorResult(
            name="hadolint",
            status="not_run",
            summary=f"unreadable hadolint output (exit {code})",
            details={"stderr": err[-_OUTPUT_TAIL:]},
        )
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
SBOM_PATH = "reports/sbom.cdx.json"
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*==\s*([^\s;#]+)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


async def make_sbom(files: Mapping[str, str]) -> tuple[str | None, str]:
    """A CycloneDX SBOM of ``requirements.txt`` by ``cyclonedx-py`` (text, or None and why).

    It is made before validation and put in the tree (:func:`add_sbom`), so the SBOM that
    is checked is the one the archive ships.
    """
    if "requirements.txt" not in files:
        return None, "no requirements.txt"
    binary = _venv_bin("cyclonedx-py")
    if binary is None:
        return None, "cyclonedx-bom is not installed"
    with tempfile.TemporaryDirectory(prefix="keel-sbom-") as tmp:
        Path(tmp, "requirements.txt").write_text(files["requirements.txt"], encoding="utf-8")
        code, out, err = await _host(
            [
                binary,
                "requirements",
                "--of",
                "JSON",
                "--output-reproducible",
                # The sbom validator checks it against the schema (check_sbom); the tool's
                # own check was 2.2 of its 2.4 s of CPU, and the text is the same without.
                "--no-validate",
                "-o",
                "-",
                "requirements.txt",
            ],
            Path(tmp),
        )
    if code != 0:
        return None, f"cyclonedx-py requirements: exit {code}: {err.strip()[-300:]}"
    return (out if out.endswith("\n") else out + "\n"), ""


async def add_sbom(files: Mapping[str, str]) -> dict[str, str]:
    """``files`` with :data:`SBOM_PATH` made from ``requirements.txt`` when the tree has
    none; a tree that brings its own SBOM keeps it (and the sbom validator checks it)."""
    out = dict(files)
    if SBOM_PATH not in out:
        text, why = await make_sbom(out)
        if text is not None:
            out[SBOM_PATH] = text
        else:
            log.warning("no SBOM made: %s", why)
    return check_paths(out)


def _schema_errors(text: str, spec: str) -> str | None:
    """The CycloneDX JSON schema's verdict on ``text`` (None: valid or no validator)."""
    try:
        from cyclonedx.schema import SchemaVersion
        from cyclonedx.validation.json import JsonStrictValidator
    except ImportError:
        return None
    try:
        version = SchemaVersion.from_version(spec)
    except (ValueError, KeyError):
        return f"unknown CycloneDX specVersion {spec!r}"
    error = JsonStrictValidator(version).validate_str(text)
    if error is None:
        return None
    data = error.data
    where = "/".join(str(p) for p in getattr(data, "absolute_path", [])) or "(root)"
    rule = getattr(data, "validator", None)
    if rule is None:
        return str(data).splitlines()[0][:300]
    return f"{where}: fails {rule!s} {str(getattr(data, 'validator_value', ''))[:120]}"


def check_sbom(files: Mapping[str, str]) -> ValidatorResult:
    """The tree's SBOM (:data:`SBOM_PATH`): present, CycloneDX JSON that its schema
    accepts, and naming every ``name==version`` pin of ``requirements.txt``."""
    if "requirements.txt" not in files:
        return ValidatorResult(name="sbom", status="not_run", summary="no requirements.txt")
    text = files.get(SBOM_PATH)
    if text is None:
        return ValidatorResult(
            name="sbom", status="failed", summary=f"no SBOM: {SBOM_PATH} is not in the tree"
        )
    try:
        bom = json.loads(text)
    except json.JSONDecodeError as exc:
        return ValidatorResult(
            name="sbom", status="failed", summary=f"the SBOM is not JSON: {exc.msg}"
        )
    if not isinstance(bom, dict) or bom.get("bomFormat") != "CycloneDX":
        return ValidatorResult(
            name="sbom", status="failed", summary="the SBOM is not a CycloneDX document"
        )
    spec = str(bom.get("specVersion", ""))
    invalid = _schema_errors(text, spec)
    if invalid is not None:
        return ValidatorResult(
            name="sbom",
            status="failed",
            summary=f"the SBOM does not match the CycloneDX {spec} schema: {invalid}",
        )
    components = {
        (_norm(str(c.get("name"))), str(c.get("version")))
        for c in bom.get("components", [])
        if isinstance(c, dict)
    }
    pins = [
        (_norm(m.group(1)), m.group(2))
        for m in map(_REQUIREMENT.match, files["requirements.txt"].splitlines())
        if m is not None
    ]
    missing = [f"{n}=={v}" for n, v in pins if (n, v) not in components]
    details = {
        "components": sorted(f"{n}=={v}" for n, v in components),
        "path": SBOM_PATH,
        "spec_version": spec,
    }
    if missing:
        return ValidatorResult(
            name="sbom",
            status="failed",
            summary=f"the SBOM misses {len(missing)} pinned requirement(s): "
            + ", ".join(missing[:10]),
            details={**details, "missing": missing},
        )
    return ValidatorResult(
        name="sbom",
        status="passed",
        summary=f"CycloneDX {spec} SBOM, {len(components)} components, "
        f"covers the {len(pins)} pins of requirements.txt",
        details=details,
    )


# ------------------------------------------------------------------------------ wiring


def check_wiring(files: Mapping[str, str]) -> ValidatorResult:
    """The pieces checked against each other (:mod:`keel.design.wiring`): commands and
    module inputs against the variables declared, Lambda handlers and packages, images
    against the CI that pushes them, environment variables against the runtimes that run
    the code, alarms against what emits their metrics, job scripts against the tree. Each
    finding names its rule, the file and what is wrong."""
    if not any(p.endswith(".tf") for p in files):
        return ValidatorResult(name="wiring", status="not_run", summary="no Terraform files")
    findings = wiring_findings(files)
    details: dict[str, Any] = {
        "rules": list(WIRING_RULES),
        "findings": [f.as_dict() for f in findings[:200]],
    }
    if findings:
        counts = {r: n for r in WIRING_RULES if (n := sum(f.rule == r for f in findings))}
        return ValidatorResult(
            name="wiring",
            status="failed",
            summary=f"{len(findings)} wiring finding(s): "
            + ", ".join(f"{r} {n}" for r, n in counts.items()),
            details=details,
        )
    return ValidatorResult(
        name="wiring",
        status="passed",
        summary=f"the pieces fit: {', '.join(WIRING_RULES)} checked",
        details=details,
    )


# --------------------------------------------------------------------------- the report


#: Seconds between heartbeats while one validator runs (a jailed mypy can take minutes).
HEARTBEAT_EVERY_S = 10.0


def _heartbeat(detail: str) -> None:
    if activity.in_activity():
        activity.heartbeat(detail)


def report_files(report: ValidationReport) -> dict[str, str]:
    """``reports/<validator>.json`` for each result: the validation report, kept beside the
    validated tree (never added to it, so the archive is the tree that was validated)."""
    return {
        f"reports/{r.name}.json": json.dumps(r.model_dump(mode="json"), indent=2, sort_keys=True)
        + "\n"
        for r in report.results
    }


#: The validators, in the order every report lists them.
VALIDATOR_ORDER = (
    "secrets",
    "ruff",
    "mypy",
    "pytest",
    "hcl",
    "checkov",
    "actionlint",
    "hadolint",
    "sbom",
    "wiring",
)


async def validate_repo(
    files: dict[str, str], *, sandbox_config: SandboxConfig | None = None
) -> ValidationReport:
    """Run every validator on ``files``, exactly as given: nothing is added to the tree
    here (see :func:`add_sbom`); the report's ``files`` hold ``reports/<validator>.json``,
    which travel beside the tree, not in it.

    Three lanes run side by side: the jailed tools (ruff, mypy, pytest, one after the
    other: each jail takes its share of memory), the host's tools (checkov, actionlint,
    hadolint) and the host's pure-Python checks (secrets, hcl, sbom, wiring, in threads). The report lists them in :data:`VALIDATOR_ORDER`
    whatever order they finished in. Inside an activity it heartbeats with the running
    validators' names at each step and every :data:`HEARTBEAT_EVERY_S` seconds.
    """
    files = check_paths(files)
    config = sandbox_config or default_config()
    done: dict[str, ValidatorResult] = {}
    timings: dict[str, float] = {}
    running: list[str] = []
    last = ["start"]  # the last beat, repeated while no validator runs (between two)

    async def timed(name: str, step: Callable[[], Awaitable[ValidatorResult]]) -> None:
        running.append(name)
        last[0] = ", ".join(running)
        _heartbeat(last[0])
        started = time.monotonic()
        try:
            done[name] = await step()
        finally:
            running.remove(name)
        timings[name] = round(time.monotonic() - started, 3)

    async def jailed_lane() -> None:
        await timed("ruff", lambda: run_ruff(files, config))
        await timed("mypy", lambda: run_mypy(files, config))
        await timed("pytest", lambda: run_pytest(files, config))

    async def host_tools(root: Path) -> None:
        await timed("checkov", lambda: run_checkov(files, root))
        await timed("actionlint", lambda: run_actionlint(files, root))
        await timed("hadolint", lambda: run_hadolint(files, root))

    async def host_checks() -> None:
        # In threads: the secret scan, the HCL parse and the SBOM's schema check are pure
        # Python and take seconds on a large tree; on the event loop they would stall the
        # worker's heartbeats. They run while the host tools' processes do: one after the
        # other they made the host lane the longest (batch_training: secrets 2.9 s, hcl
        # 0.7 s, checkov 6.5 s, sbom 2.4 s; 12.6 s for the whole report, the jailed lane
        # 7.9 s).
        await timed("secrets", lambda: asyncio.to_thread(scan_secrets, files))
        await timed("hcl", lambda: asyncio.to_thread(run_hcl, files))
        await timed("sbom", lambda: asyncio.to_thread(check_sbom, files))
        await timed("wiring", lambda: asyncio.to_thread(check_wiring, files))

    async def run_all() -> None:
        with tempfile.TemporaryDirectory(prefix="keel-validate-") as tmp:
            root = Path(tmp)
            _write_tree(files, root)
            await asyncio.gather(jailed_lane(), host_tools(root), host_checks())

    await heartbeating(
        run_all(), every_s=HEARTBEAT_EVERY_S, details=lambda: ", ".join(running) or last[0]
    )
    results = [
        done[name].model_copy(
            update={"details": {**done[name].details, "seconds": timings.get(name)}}
        )
        for name in VALIDATOR_ORDER
    ]
    report = ValidationReport(results=results)
    log.info(
        "validated %d files: %s", len(files), ", ".join(f"{r.name}={r.status}" for r in results)
    )
    return report.model_copy(update={"files": report_files(report)})


__all__ = [
    "JAIL_LIMITS",
    "SBOM_PATH",
    "add_sbom",
    "check_sbom",
    "check_wiring",
    "make_sbom",
    "report_files",
    "run_hcl",
    "scan_secrets",
    "validate_repo",
]
