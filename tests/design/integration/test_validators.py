"""Validators on the repositories generated for the five frozen constraint sets.

ruff, mypy and pytest run inside nsjail; checkov, actionlint, hadolint, the SBOM and
the secret scan on the host. Each case runs the whole ``validate_repo``.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from activities.design.codegen import render_request
from activities.design.validators import run_pytest, run_ruff, scan_secrets, validate_repo
from sandbox.models import default_config
from tests.design.codegen_cases import CASES, request_for

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("case", CASES)
def test_generated_repo_passes_every_validator(case: str) -> None:
    files = render_request(request_for(case))
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
    sbom = json.loads(report.files["reports/sbom.cdx.json"])
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
        ("services/serve/settings.py", "aws-access-key-id"),
        ("deploy/id_rsa", "private-key"),
    }
    assert key_id not in json.dumps(result.model_dump())
    assert scan_secrets(render_request(request_for("batch_training"))).status == "passed"


def test_broken_python_fails_ruff_and_pytest() -> None:
    files = render_request(request_for("online_serving_slo"))
    files["services/serve/app.py"] = files["services/serve/app.py"].replace(
        "return sum(values) / len(values)", "return sum(values) / len(values) + undefined_name"
    )
    config = default_config()
    ruff = asyncio.run(run_ruff(files, config))
    assert ruff.status == "failed"
    assert "F821" in ruff.details["output"]
    tests = asyncio.run(run_pytest(files, config))
    assert tests.status == "failed"
    assert "NameError" in tests.details["output"]
