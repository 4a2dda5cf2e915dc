"""The ``smoke`` validator on generated repositories, for real, in the jail (issue 38 §2).

``make smoke`` (``python -m services.smoke``) lands the sample, runs the pipeline with S3
in moto, then sends feature rows through every serving entry point the plan has (the
FastAPI app over HTTP on loopback, the Lambda handler with API Gateway events, the
SageMaker ``train`` and ``serve`` entry points under an ``/opt/ml`` layout) and checks
drift over what was served. Keel runs it in the jail, network off.

A passing smoke is checked in full on each shape ``test_validators.py`` runs through
every validator (``tests/design/smoke_report.py``: between them FastAPI, Lambda and
SageMaker); here, a tree whose Lambda handler was broken on purpose: the validator must
fail naming the step and the file.
"""

from __future__ import annotations

import asyncio
import functools

import pytest

from activities.design.codegen import render_request
from activities.design.validators.jailed import run_smoke
from sandbox.models import default_config
from tests.design.codegen_cases import request_for

pytestmark = pytest.mark.timeout(600)


@functools.cache
def _rendered(case: str) -> dict[str, str]:
    return render_request(request_for(case))


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
