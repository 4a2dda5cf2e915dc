"""The generated application under the real validators, for intake forms of different
shapes: batch in one region on a low budget (SageMaker batch transform), streaming in
three regions on a high budget (MSK, ECS), online RAG in three regions (Lambda,
OpenSearch), and Kinesis streaming with online serving in one region.

Each tree is the one that ships (``add_sbom`` then ``validate_repo``): ruff, mypy and the
repository's own pytest suite run in nsjail, hadolint on every service's Dockerfile,
actionlint on the workflows, checkov over Terraform, workflows and Dockerfiles, the
secret scan and the SBOM check on the host. Every one must pass, and the jailed pytest
must run every test the repository defines (none skipped or deselected).
"""

from __future__ import annotations

import ast
import asyncio
import re

import pytest

from activities.design.codegen import render_request
from activities.design.validators import add_sbom, validate_repo
from tests.design.codegen_cases import request_for_form

pytestmark = pytest.mark.timeout(600)

FORMS = (
    "batch_one_region_low",
    "streaming_three_regions_high",
    "online_rag_three_regions",
    "kinesis_online_one_region",
)
VALIDATORS = ("secrets", "ruff", "mypy", "pytest", "hcl", "checkov", "actionlint", "hadolint")


def expected_tests(files: dict[str, str]) -> int:
    """Tests the generated suite defines: each test function, times its parameters."""
    count = 0
    for path, text in files.items():
        if not (path.startswith("tests/test_") and path.endswith(".py")):
            continue
        for node in ast.parse(text).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            runs = 1
            for deco in node.decorator_list:
                if (
                    isinstance(deco, ast.Call)
                    and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr == "parametrize"
                ):
                    values = deco.args[1]
                    assert isinstance(values, ast.List | ast.Tuple)
                    runs *= len(values.elts)
            count += runs
    return count


@pytest.mark.parametrize("form", FORMS)
def test_generated_app_passes_every_validator(form: str) -> None:
    req = request_for_form(form)
    files = asyncio.run(add_sbom(render_request(req)))
    report = asyncio.run(validate_repo(files))
    summaries = {r.name: f"{r.status}: {r.summary}" for r in report.results}
    for name in (*VALIDATORS, "sbom"):
        assert summaries[name].startswith("passed"), (form, name, summaries[name])
    assert report.passed and report.complete and report.not_run == []

    # The jailed pytest ran the whole generated suite.
    pytest_result = report.result("pytest")
    assert pytest_result is not None
    output = str(pytest_result.details["output"])
    ran = re.search(r"(\d+) passed", output)
    assert ran is not None, output[-500:]
    assert int(ran.group(1)) == expected_tests(files) >= 40, output[-500:]
    assert not re.search(r"\b(failed|skipped|deselected|error)", output), output[-500:]

    # Every service's Dockerfile went through hadolint and checkov.
    dockerfiles = sorted(p for p in files if p.endswith("/Dockerfile"))
    hadolint = report.result("hadolint")
    assert hadolint is not None and hadolint.details["dockerfiles"] == dockerfiles
    checkov = report.result("checkov")
    assert checkov is not None and "dockerfile" in checkov.details["summary"]
    # checkov parsed every Terraform file and found the resources of every region.
    terraform = checkov.details["summary"]["terraform"]
    assert terraform["failed"] == 0 and terraform["parsing_errors"] == 0
    assert terraform["resource_count"] >= 150 * len(req.plan.regions) // 2, terraform
