"""The ``smoke`` validator on generated repositories, for real, in the jail (issue 38 §2).

``make smoke`` (``python -m services.smoke``) lands the sample, runs the pipeline with S3
in moto, then sends feature rows through every serving entry point the plan has (the
FastAPI app over HTTP on loopback, the Lambda handler with API Gateway events, the
SageMaker ``train`` and ``serve`` entry points under an ``/opt/ml`` layout) and checks
drift over what was served. Keel runs it in the jail, network off. One real run per
shape (cached for the module), plus one of a tree whose Lambda handler was broken on
purpose: the validator must fail naming the step and the file.
"""

from __future__ import annotations

import asyncio
import functools
import json

import pytest

from activities.design.app import app_context
from activities.design.codegen import render_request
from activities.design.validators import report_files
from activities.design.validators.jailed import run_smoke
from keel.design.validation import ValidationReport, ValidatorResult
from sandbox.models import default_config
from tests.design.codegen_cases import request_for

pytestmark = pytest.mark.timeout(600)

#: A batch plan served by SageMaker, and an online and batch plan served by Lambda:
#: between them every entry point the smoke drives. (The RAG shapes register in MLflow,
#: whose first sqlite database alone takes most of their smoke: 61 s against 25 s here.)
SHAPES = ("batch_training", "hipaa_one_region")


@functools.cache
def _rendered(case: str) -> dict[str, str]:
    return render_request(request_for(case))


@functools.cache
def _smoked(case: str) -> ValidatorResult:
    return asyncio.run(run_smoke(_rendered(case), default_config()))


def _entry_points(case: str) -> list[str]:
    ctx = app_context(request_for(case))
    return (
        ["fastapi"]
        + (["lambda"] if ctx["lambda_handler"] else [])
        + (["sagemaker"] if ctx["sagemaker"] else [])
    )


@pytest.mark.parametrize("case", SHAPES)
def test_smoke_serves_a_prediction_through_every_entry_point(case: str) -> None:
    result = _smoked(case)
    assert result.status == "passed", (result.summary, result.details.get("output"))
    assert result.details["sandbox"] == "nsjail"
    report = result.details["report"]
    entry_points = _entry_points(case)
    assert report["entry_points"] == entry_points
    assert [s["name"] for s in report["steps"]] == [
        "storage",
        "ingest",
        "pipeline",
        *entry_points,
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
    assert sorted(by_entry) == sorted(entry_points)
    for prediction in report["predictions"]:
        assert prediction["input"] and prediction["output"], prediction
    assert len(report["predictions"]) == len(entry_points)
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


def test_a_broken_handler_fails_the_smoke_naming_the_step_and_file() -> None:
    files = dict(_rendered("hipaa_one_region"))
    handler = files["services/serve/handler.py"]
    anchor = '    """Answer one HTTP API event with ``holder``\'s model."""\n'
    assert anchor in handler
    files["services/serve/handler.py"] = handler.replace(
        anchor, anchor + '    raise RuntimeError("broken on purpose")\n'
    )
    result = asyncio.run(run_smoke(files, default_config()))
    assert result.status == "failed"
    assert result.summary.startswith("smoke step lambda failed: RuntimeError: broken on purpose"), (
        result.summary
    )
    finding = result.details["findings"][0]
    assert finding["file"] == "services/serve/handler.py" and isinstance(finding["line"], int)
    report = result.details["report"]
    assert report["failed_step"] == "lambda" and report["passed"] is False
    # The steps before it passed; none after it ran.
    assert [s["name"] for s in report["steps"]][-1] == "lambda"
