"""ValidationReport: ``passed`` and ``not_run`` derive from the results; not_run never passes."""

from __future__ import annotations

import asyncio

import pytest

from activities.design.validators import run_hcl, scan_secrets, validate_repo
from keel.design.steps import VALIDATORS
from keel.design.validation import ValidationReport, ValidatorResult, tree_digest
from sandbox.models import SandboxConfig


def r(name: str, status: str) -> ValidatorResult:
    return ValidatorResult.model_validate({"name": name, "status": status, "summary": status})


def test_not_run_is_neither_passed_nor_complete() -> None:
    report = ValidationReport(results=[r("ruff", "passed"), r("checkov", "not_run")])
    assert report.passed is True
    assert report.not_run == ["checkov"]
    assert report.complete is False
    assert ValidationReport(results=[r("ruff", "passed")]).complete is True


def test_a_failure_fails_the_report() -> None:
    report = ValidationReport(results=[r("ruff", "failed"), r("mypy", "passed")])
    assert report.passed is False and report.complete is False


def test_derived_fields_ignore_what_is_passed_in_and_round_trip() -> None:
    forged = ValidationReport.model_validate(
        {"results": [r("pytest", "failed").model_dump()], "passed": True, "not_run": []}
    )
    assert forged.passed is False
    again = ValidationReport.model_validate_json(forged.model_dump_json())
    assert again == forged


def test_bad_status_refused() -> None:
    with pytest.raises(ValueError):
        ValidatorResult.model_validate({"name": "x", "status": "skipped", "summary": ""})


def test_hcl_parse_error_fails_and_no_terraform_is_not_run() -> None:
    assert run_hcl({"infra/a/main.tf": 'resource "x" "y" {\n  a = \n'}).status == "failed"
    assert run_hcl({"infra/a/main.tf": 'resource "x" "y" {\n  a = 1\n}\n'}).status == "passed"
    assert run_hcl({"README.md": "x"}).status == "not_run"


def test_secret_scan_matches_secrets_not_words() -> None:
    token = "ghp_" + "a1B2" * 9
    found = scan_secrets({"a.py": f'TOKEN = "{token}"\n'})
    assert found.status == "failed"
    assert found.details["findings"] == [{"file": "a.py", "line": 1, "rule": "GitHub Token"}]
    assert token not in found.model_dump_json()  # the value is never written down
    assert found.details["scanner"].startswith("detect-secrets ")
    clean = {"a.py": 'password = os.environ["PASSWORD"]\napi_key: str = ""\n'}
    assert scan_secrets(clean).status == "passed"


def test_tree_digest_is_the_same_for_text_and_bytes() -> None:
    text = {"b.txt": "é\n", "a.py": "x = 1\n"}
    assert tree_digest(text) == tree_digest({p: t.encode() for p, t in text.items()})
    assert tree_digest(text) != tree_digest({**text, "a.py": "x = 2\n"})
    assert tree_digest(text) != tree_digest({**text, "c": ""})


def test_failed_names_the_failing_validators() -> None:
    report = ValidationReport(
        results=[r("ruff", "failed"), r("mypy", "passed"), r("sbom", "not_run"), r("x", "failed")]
    )
    assert report.failed == ["ruff", "x"]


def test_tools_that_cannot_run_are_not_run(tmp_path: object) -> None:
    # No jail can start with a missing nsjail; no Dockerfile means nothing for hadolint.
    config = SandboxConfig.model_validate({"nsjail_path": "/nonexistent/nsjail"})
    files = {"a.py": "x = 1\n", "tests/test_a.py": "def test_a() -> None:\n    pass\n"}
    report = asyncio.run(validate_repo(files, sandbox_config=config))
    status = {x.name: x.status for x in report.results}
    for name in ("ruff", "mypy", "pytest"):
        assert status[name] == "not_run", report.result(name)
    assert status["hadolint"] == "not_run"
    assert "no Dockerfile" in report.result("hadolint").summary  # type: ignore[union-attr]
    for name in ("hcl", "checkov", "actionlint", "sbom"):
        assert status[name] == "not_run"
    assert status["secrets"] == "passed"
    assert report.passed is True and report.complete is False
    assert set(report.not_run) == set(status) - {"secrets"}
    assert '"status": "not_run"' in report.files["reports/ruff.json"]


def test_heartbeats_name_each_validator_inside_an_activity() -> None:
    from temporalio import activity
    from temporalio.testing import ActivityEnvironment

    config = SandboxConfig.model_validate({"nsjail_path": "/nonexistent/nsjail"})
    beats: list[str] = []

    @activity.defn
    async def validate(files: dict[str, str]) -> ValidationReport:
        return await validate_repo(files, sandbox_config=config)

    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0])
    report = asyncio.run(env.run(validate, {"a.py": "x = 1\n"}))
    # Each step beats the names of the validators running as it starts (the three lanes,
    # jailed, host tools and host checks, run side by side); the periodic beat repeats
    # them.
    first_seen: list[str] = []
    for beat in beats:
        for name in beat.split(", ") if beat != "start" else ():
            if name not in first_seen:
                first_seen.append(name)
    assert sorted(first_seen) == sorted(x.name for x in report.results)
    assert [x.name for x in report.results] == list(VALIDATORS)
    lanes = (("ruff", "mypy", "pytest"), ("checkov", "actionlint", "hadolint"))
    lanes += (("secrets", "hcl", "sbom"),)
    for lane in lanes:
        assert [n for n in first_seen if n in lane] == list(lane)


@pytest.mark.parametrize(
    ("limit", "words"),
    [("memory", "memory limit"), ("cpu", "CPU-time limit"), ("output", "output limit")],
)
def test_a_validator_stopped_by_a_sandbox_limit_says_which(limit: str, words: str) -> None:
    from activities.design.validators.jailed import _from_jail
    from sandbox.models import SandboxResult

    run = SandboxResult.model_validate(
        {"exit_code": None, "killed_by_signal": 9, "limit": limit, "timed_out": limit == "cpu"}
    )
    got = _from_jail("pytest", run, "pytest")
    assert got.status == "failed" and words in got.summary, got.summary
    assert got.details["limit"] == limit
    clean = _from_jail("pytest", SandboxResult(exit_code=0), "pytest")
    assert clean.status == "passed" and "limit" not in clean.details


async def test_only_the_selected_validators_run() -> None:
    files = {"README.md": "# x\n", "app.py": "x = 1\n"}
    report = await validate_repo(files, only=["secrets", "ruff"])
    ran = {r.name: r for r in report.results}
    assert [r.name for r in report.results] == list(VALIDATORS)
    assert ran["secrets"].status == "passed" and ran["ruff"].status == "passed"
    skipped = [n for n in VALIDATORS if n not in ("secrets", "ruff")]
    for name in skipped:
        assert ran[name].status == "not_run", ran[name]
        assert ran[name].summary == "not selected for this run"
        assert ran[name].details["seconds"] is None  # never started
    assert report.passed and not report.complete and report.not_run == skipped
