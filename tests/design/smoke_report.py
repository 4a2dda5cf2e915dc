"""What a passing ``smoke`` result must hold (issue 38 §2): every entry point of the plan
served a prediction, each step passed, storage went through S3 (moto), and drift was
checked over what was served. Used on each shape ``tests/design/integration/
test_validators.py`` runs through every validator (between them: FastAPI, Lambda and
SageMaker), so the smoke of those shapes is run once and checked in full there."""

from __future__ import annotations

import json

import pytest

from activities.design.app import app_context
from activities.design.codegen import CodeGenRequest
from activities.design.validators import report_files
from keel.design.validation import ValidationReport, ValidatorResult


def entry_points(req: CodeGenRequest) -> list[str]:
    """The serving entry points the smoke drives for ``req``'s plan, in its order."""
    ctx = app_context(req)
    return (
        ["fastapi"]
        + (["lambda"] if ctx["lambda_handler"] else [])
        + (["sagemaker"] if ctx["sagemaker"] else [])
    )


def check_smoke(result: ValidatorResult, req: CodeGenRequest) -> list[str]:
    """Assert ``result`` (the smoke of ``req``'s tree) passed as described above; returns
    the entry points it drove."""
    assert result.status == "passed", (result.summary, result.details.get("output"))
    assert result.details["sandbox"] == "nsjail"
    report = result.details["report"]
    served = entry_points(req)
    assert report["entry_points"] == served
    assert [s["name"] for s in report["steps"]] == [
        "storage",
        "ingest",
        "pipeline",
        *served,
        "drift",
    ]
    assert all(s["ok"] for s in report["steps"]) and report["passed"] is True
    # Storage went through boto3 against moto's S3.
    assert report["storage"] == {"data_uri": "s3://smoke-data/pipeline", "backend": "S3Store"}
    # Metrics of the promoted model.
    assert report["metrics"] and all(isinstance(v, int | float) for v in report["metrics"].values())
    version = report["summary"]["version"]
    # One prediction per entry point, each with its input and its output.
    by_entry = {p["entry_point"]: p for p in report["predictions"]}
    assert sorted(by_entry) == sorted(served)
    for prediction in report["predictions"]:
        assert prediction["input"] and prediction["output"], prediction
    assert len(report["predictions"]) == len(served)
    fastapi = by_entry["fastapi"]["output"]
    assert fastapi["model"] == version
    if "lambda" in by_entry:
        event, response = by_entry["lambda"]["input"], by_entry["lambda"]["output"]
        assert event["version"] == "2.0" and event["requestContext"]["http"]["method"] == "POST"
        assert response["statusCode"] == 200
        assert json.loads(response["body"])["model"] == version
        # The same row, the same model: the handler and the app agree.
        assert json.loads(response["body"])["score"] == pytest.approx(fastapi["score"])
    if "sagemaker" in by_entry:
        assert by_entry["sagemaker"]["route"] == "POST /invocations"
        assert isinstance(by_entry["sagemaker"]["output"]["score"], float)
        assert "model.tar.gz" in report["steps"][-2]["detail"]
    # The drift check over the rows served.
    drift = report["drift"]
    assert drift["version"] == version and drift["rows"] > 0
    assert set(drift["psi"]) and isinstance(drift["drifted"], list)
    # The result, with the report, is what reports/smoke.json keeps.
    kept = report_files(ValidationReport(results=[result]))["reports/smoke.json"]
    assert json.loads(kept)["details"]["report"] == report
    return served
