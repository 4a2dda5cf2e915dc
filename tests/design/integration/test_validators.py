"""Validators on the repositories generated for the five frozen constraint sets, and on
trees deliberately broken for each validator (each must fail, naming what is wrong).

ruff, mypy and pytest run inside nsjail; checkov, actionlint, hadolint, the SBOM check and
the secret scan (detect-secrets) on the host. Each case runs the whole ``validate_repo``
on the tree that ships (the generated files and the SBOM ``add_sbom`` puts in).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from activities.design.codegen import render_request
from activities.design.validators import (
    SBOM_PATH,
    add_sbom,
    check_sbom,
    run_actionlint,
    run_hadolint,
    run_pytest,
    run_ruff,
    scan_secrets,
    validate_repo,
)
from sandbox.models import default_config
from tests.design.codegen_cases import CASES, request_for

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("case", CASES)
def test_generated_repo_passes_every_validator(case: str) -> None:
    files = asyncio.run(add_sbom(render_request(request_for(case))))
    report = asyncio.run(validate_repo(files))
    statuses = {r.name: r.status for r in report.results}
    summaries = {r.name: r.summary for r in report.results}
    for name in ("secrets", "ruff", "mypy", "pytest", "hcl", "actionlint", "hadolint", "sbom"):
        assert statuses[name] == "passed", (name, summaries[name])
    # checkov comes from .tools/checkov (scripts/bootstrap.sh makes it).
    assert statuses["checkov"] == "passed", summaries["checkov"]
    assert report.passed and report.complete and report.not_run == []
    for name in statuses:
        written = json.loads(report.files[f"reports/{name}.json"])
        assert written["status"] == statuses[name]
    # The SBOM is in the tree that was validated; the report adds nothing to the tree.
    assert SBOM_PATH not in report.files
    sbom = json.loads(files[SBOM_PATH])
    assert {c["name"] for c in sbom["components"]} >= {"fastapi", "pydantic", "uvicorn"}
    assert "passed" in report.result("pytest").details["output"]  # type: ignore[union-attr]


def test_planted_secret_fails_the_scan() -> None:
    files = render_request(request_for("batch_training"))
    # Built at run time so this test file itself holds no key-shaped literal.
    key_id = "AKIA" + "IOSFODNN7" + "EXAMPLE"
    files["services/serve/settings.py"] = f'AWS_KEY_ID = "{key_id}"\n'
    files["deploy/id_rsa"] = "-----BEGIN RSA " + "PRIVATE KEY-----\nMIIE\n"
    result = scan_secrets(files)
    assert result.status == "failed"
    found = {(f["file"], f["rule"]) for f in result.details["findings"]}
    assert found == {
        ("services/serve/settings.py", "AWS Access Key"),
        ("deploy/id_rsa", "Private Key"),
    }
    assert key_id not in json.dumps(result.model_dump())
    assert scan_secrets(render_request(request_for("batch_training"))).status == "passed"


def test_secrets_the_old_regexes_missed_are_found() -> None:
    """detect-secrets replaced Keel's own nine patterns: it finds each kind they found and
    these, which they did not (a JWT, a Stripe key, credentials in a URL, a password)."""
    planted = {
        "jwt.py": 'TOKEN = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.'
        + 'eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"\n',
        "stripe.py": 'KEY = "sk_live_' + '4eC39HqLyjWDarjtT1zdp7dc"\n',
        "url.py": 'DSN = "https://admin:' + 'Passw0rd1234@db.example.com/x"\n',
        "conf.py": 'password = "' + 'hunter2hunter2"\n',
    }
    result = scan_secrets(planted)
    assert result.status == "failed"
    rules = {f["file"]: set() for f in result.details["findings"]}
    for f in result.details["findings"]:
        rules[f["file"]].add(f["rule"])
    assert "JSON Web Token" in rules["jwt.py"]
    assert "Stripe Access Key" in rules["stripe.py"]
    assert "Basic Auth Credentials" in rules["url.py"]
    assert "Secret Keyword" in rules["conf.py"]


def _tree(case: str = "batch_training") -> dict[str, str]:
    return render_request(request_for(case))


def test_bad_workflow_fails_actionlint(tmp_path: Path) -> None:
    files = _tree()
    files[".github/workflows/ci.yml"] = files[".github/workflows/ci.yml"].replace(
        "    runs-on: ubuntu-24.04\n", "    runs-on: ubuntu-24.04\n    needs: [build]\n", 1
    )
    _write(files, tmp_path)
    result = asyncio.run(run_actionlint(files, tmp_path))
    assert result.status == "failed", result.summary
    (finding,) = result.details["findings"]
    assert finding["file"] == ".github/workflows/ci.yml" and finding["kind"] == "job-needs"
    assert '"build"' in finding["message"]


def test_dockerfile_lint_error_fails_hadolint(tmp_path: Path) -> None:
    files = _tree()
    serve = "services/serve/Dockerfile"
    files[serve] = files[serve].replace("FROM python:3.11.9-slim", "FROM python:latest")
    _write(files, tmp_path)
    result = asyncio.run(run_hadolint(files, tmp_path))
    assert result.status == "failed", result.summary
    assert "DL3007" in result.summary  # "latest" is not a pinned image version


def test_missing_invalid_or_stale_sbom_fails() -> None:
    good = asyncio.run(add_sbom(_tree()))
    assert check_sbom(good).status == "passed"
    missing = {p: t for p, t in good.items() if p != SBOM_PATH}
    assert check_sbom(missing).status == "failed"
    assert "no SBOM" in check_sbom(missing).summary
    not_json = {**good, SBOM_PATH: "{not json"}
    assert "not JSON" in check_sbom(not_json).summary
    bom = json.loads(good[SBOM_PATH])
    bom["components"][0]["type"] = "spaceship"
    invalid = {**good, SBOM_PATH: json.dumps(bom)}
    result = check_sbom(invalid)
    assert result.status == "failed" and "schema" in result.summary, result.summary
    stale = {**good, "requirements.txt": good["requirements.txt"] + "httpx==0.27.2\n"}
    result = check_sbom(stale)
    assert result.status == "failed" and result.details["missing"] == ["httpx==0.27.2"]


def test_a_broken_tree_fails_the_whole_report() -> None:
    """validate_repo as the activity runs it: each broken part fails its own validator,
    and checkov names each planted fault where it is (one checkov run for all three)."""
    files = _tree()
    # An unencrypted bucket with no public access block, in a file of its own.
    files["infra/ingest/raw.tf"] = 'resource "aws_s3_bucket" "raw" {\n  bucket = "raw-data"\n}\n'
    serve = "services/serve/Dockerfile"
    files[serve] = files[serve].replace("python:3.11.9-slim", "python:latest")
    # checkov reads every service's Dockerfile, not only one at the root.
    train = "services/train/Dockerfile"
    assert "USER 10001" in files[train]
    files[train] = files[train].replace("USER 10001", "USER root")
    report = asyncio.run(validate_repo(files))  # no SBOM added: it is missing
    status = {r.name: r.status for r in report.results}
    assert {n for n, s in status.items() if s == "failed"} == {"checkov", "hadolint", "sbom"}
    assert report.failed == ["checkov", "hadolint", "sbom"] and not report.passed

    checkov = report.result("checkov")
    assert checkov is not None
    failed = checkov.details["failed_checks"]
    on_raw = {f["check_id"] for f in failed if f["resource"] == "aws_s3_bucket.raw"}
    assert "CKV_AWS_145" in on_raw, on_raw  # encryption with KMS by default is missing
    assert ("CKV_DOCKER_8", train) in {(f["check_id"], f["file"]) for f in failed}
    # Nothing else in the generated tree fails: only the planted files are named.
    assert {f["file"] for f in failed} <= {"infra/ingest/raw.tf", train, serve}, failed
    hadolint = report.result("hadolint")
    assert hadolint is not None and "DL3007" in hadolint.summary  # "latest" is not pinned


def _write(files: dict[str, str], root: Path) -> None:
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")


def test_broken_python_fails_ruff_and_pytest() -> None:
    files = render_request(request_for("online_serving_slo"))
    app = files["services/serve/app.py"]
    scored = "return Prediction(score=lr.score(body.features), model=version)"
    assert scored in app
    files["services/serve/app.py"] = app.replace(
        scored,
        "return Prediction(score=lr.score(body.features) + undefined_name, model=version)",
    )
    config = default_config()
    ruff = asyncio.run(run_ruff(files, config))
    assert ruff.status == "failed"
    assert "F821" in ruff.details["output"]
    tests = asyncio.run(run_pytest(files, config))
    assert tests.status == "failed"
    assert "NameError" in tests.details["output"]
