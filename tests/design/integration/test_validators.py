"""Validators on the generated repositories, and on trees deliberately broken for each
validator (each must fail, naming what is wrong).

The shapes: the five frozen constraint sets and the intake forms of other shapes (batch in
one region on a low budget, streaming in three regions on a high budget, online RAG in
three regions, Kinesis streaming with online serving in one region). The shapes in
:data:`VALIDATED` go through every validator, and every one must pass, with the jailed
pytest running every test the repository defines; the others are checked to generate
nothing the validated ones do not.

ruff, mypy and pytest run inside nsjail; checkov, actionlint, hadolint, the SBOM check,
the secret scan (detect-secrets) and the wiring check (the pieces against each other,
``keel.design.wiring``) on the host. Each case runs the whole ``validate_repo``
on the tree that ships (the generated files and the SBOM ``add_sbom`` puts in).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest

from activities.design.codegen import CodeGenRequest, render_request
from activities.design.validators import (
    SBOM_PATH,
    add_sbom,
    check_sbom,
    run_actionlint,
    run_hadolint,
    run_mypy,
    run_pytest,
    run_ruff,
    scan_secrets,
    validate_repo,
)
from sandbox.models import default_config
from tests.design.codegen_cases import CASES, FORMS, request_for, request_for_form
from tests.design.smoke_report import check_smoke, entry_points
from tests.support.hcl import parse_once

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    """The ``hcl`` validator and the wiring check each parse every ``.tf`` of a tree, and
    the trees here share most of their modules: each distinct text is parsed once."""
    with parse_once():
        yield


#: The shapes that go through every real validator: together they generate every file,
#: every Terraform resource type and every argument of one that any shape generates
#: (``test_the_validated_shapes_cover_every_generated_shape`` keeps that true), and one
#: of them spans three regions. The other shapes cost 15-60 s each and add nothing (the
#: ``rag`` case, 58 s in the suite, generates nothing ``online_rag_three_regions`` does not).
#: Four shapes: batch and streaming, one region and three, tabular and RAG (issue 38).
VALIDATED = (
    ("case", "batch_training"),
    ("case", "streaming_features"),
    ("form", "kinesis_online_one_region"),
    ("form", "online_rag_three_regions"),
)
SHAPES = (*(("case", c) for c in CASES), *(("form", f) for f in FORMS))
VALIDATORS = (
    "secrets",
    "ruff",
    "mypy",
    "pytest",
    "hcl",
    "checkov",
    "actionlint",
    "hadolint",
    "wiring",
)


def request_for_shape(kind: str, name: str) -> CodeGenRequest:
    return request_for(name) if kind == "case" else request_for_form(name)


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


@pytest.mark.parametrize(("kind", "name"), VALIDATED)
def test_generated_repo_passes_every_validator(kind: str, name: str) -> None:
    req = request_for_shape(kind, name)
    files = asyncio.run(add_sbom(render_request(req)))
    report = asyncio.run(validate_repo(files))
    summaries = {r.name: f"{r.status}: {r.summary}" for r in report.results}
    # checkov comes from .tools/checkov (scripts/bootstrap.sh makes it).
    for validator in (*VALIDATORS, "sbom"):
        assert summaries[validator].startswith("passed"), (name, validator, summaries[validator])
    assert report.passed and report.complete and report.not_run == []
    mypy = report.result("mypy")
    assert mypy is not None and mypy.details["seeded"] is True  # from the warm cache
    for result in report.results:
        written = json.loads(report.files[f"reports/{result.name}.json"])
        assert written["status"] == result.status
    # The SBOM is in the tree that was validated; the report adds nothing to the tree.
    assert SBOM_PATH not in report.files
    sbom = json.loads(files[SBOM_PATH])
    assert {c["name"] for c in sbom["components"]} >= {"fastapi", "pydantic", "uvicorn"}

    # The jailed pytest ran the whole generated suite.
    pytest_result = report.result("pytest")
    assert pytest_result is not None
    output = str(pytest_result.details["output"])
    ran = re.search(r"(\d+) passed", output)
    assert ran is not None, output[-500:]
    assert int(ran.group(1)) == expected_tests(files) >= 40, output[-500:]
    assert not re.search(r"\b(failed|skipped|deselected|error)", output), output[-500:]

    # The smoke drove every entry point of the plan (tests/design/smoke_report.py).
    smoke = report.result("smoke")
    assert smoke is not None
    check_smoke(smoke, req)

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


def _keys(value: object, prefix: str = "") -> set[str]:
    """Every key path of a parsed HCL body (``tags.Name``, ``rule.action``)."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, inner in value.items():
            found |= {f"{prefix}{key}", *_keys(inner, f"{prefix}{key}.")}
    elif isinstance(value, list):
        for inner in value:
            found |= _keys(inner, prefix)
    return found


@functools.cache
def _parsed_hcl(text: str) -> dict[str, Any]:
    """One parse per distinct file text: the shapes share most of their modules, and
    python-hcl2 takes most of this file's time."""
    parsed: dict[str, Any] = hcl2.loads(text)
    return parsed


def _shape_features(files: dict[str, str]) -> set[str]:
    """What a tree generates: its files (digits folded) and each Terraform resource type
    with every argument path it sets."""
    features: set[str] = set()
    for path, text in files.items():
        features.add("file " + re.sub(r"\d+", "N", path))
        if path.endswith(".tf"):
            for block in _parsed_hcl(text).get("resource", []):
                for kind, named in block.items():
                    for body in named.values():
                        features |= {f"{kind} {key}" for key in _keys(body)}
    return features


def test_the_validated_shapes_cover_every_generated_shape() -> None:
    """The shapes not run through the validators generate nothing the validated ones do
    not: a pattern or an argument added for one shape only fails here until that shape
    joins :data:`VALIDATED`."""
    features = {
        shape: _shape_features(render_request(request_for_shape(*shape))) for shape in SHAPES
    }
    covered = set().union(*(features[shape] for shape in VALIDATED))
    for shape in SHAPES:
        assert features[shape] <= covered, (shape, sorted(features[shape] - covered)[:20])
    assert max(len(request_for_shape(*shape).plan.regions) for shape in VALIDATED) >= 3
    # Their smokes drive every serving entry point there is.
    served = {e for shape in VALIDATED for e in entry_points(request_for_shape(*shape))}
    assert served == {"fastapi", "lambda", "sagemaker"}, served


def test_planted_secret_fails_the_scan() -> None:
    files = render_request(request_for("batch_training"))
    # Two files the tree does not have: the rest of it is the generated tree, so the
    # exact findings below also say that nothing else in it is flagged.
    assert not {"services/serve/settings.py", "deploy/id_rsa"} & set(files)
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


def test_a_file_scanned_before_is_remembered_by_path_and_text() -> None:
    """The scan remembers each file by its path and text: the same tree again gives the
    same findings; a changed text, or the same text at another path, is scanned anew."""
    key_id = "AKIA" + "IOSFODNN7" + "EXAMPLE"  # built at run time, as above
    files = {"app/settings.py": f'AWS_KEY_ID = "{key_id}"\n', "README.md": "# A tree\n"}
    first = scan_secrets(files)
    assert first.status == "failed" and first.details["findings"] == [
        {"file": "app/settings.py", "line": 1, "rule": "AWS Access Key"}
    ]
    assert scan_secrets(files).details == first.details
    cleaned = {**files, "app/settings.py": 'AWS_KEY_ID = os.environ["AWS_KEY_ID"]\n'}
    assert scan_secrets(cleaned).status == "passed"
    moved = {"docs/settings.py": files["app/settings.py"], "README.md": files["README.md"]}
    assert [f["file"] for f in scan_secrets(moved).details["findings"]] == ["docs/settings.py"]
    # Planted again after the clean text was remembered: found again.
    assert scan_secrets(files).details == first.details


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
    rules: dict[str, set[str]] = {f["file"]: set() for f in result.details["findings"]}
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


def test_the_emr_job_image_passes_hadolint_checkov_and_wiring() -> None:
    """No validated shape runs the EMR transform; its tree (batch_training with it) goes
    through the validators that read what it adds: the job image's Dockerfile (the EMR
    Serverless base, tagged latest by AWS, is the one rule each tool skips, by name and
    with the reason), its Terraform (the application's image, the repository policy) and
    the wiring between them."""
    from tests.design.unit.test_wiring_jobs import EMR_IMAGE, tree

    files = tree()
    report = asyncio.run(validate_repo(files, only=("hcl", "checkov", "hadolint", "wiring")))
    summaries = {r.name: f"{r.status}: {r.summary}" for r in report.results}
    for name in ("hcl", "checkov", "hadolint", "wiring"):
        assert summaries[name].startswith("passed"), (name, summaries[name])
    hadolint = report.result("hadolint")
    assert hadolint is not None and EMR_IMAGE in hadolint.details["dockerfiles"]
    checkov = report.result("checkov")
    assert checkov is not None
    dockerfile = checkov.details["summary"]["dockerfile"]
    assert dockerfile["failed"] == 0 and dockerfile["skipped"] == 1, dockerfile
    assert "# checkov:skip=CKV_DOCKER_7:" in files[EMR_IMAGE]
    assert "# hadolint ignore=DL3007\nFROM public.ecr.aws/emr-serverless/" in files[EMR_IMAGE]


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


def test_sbom_schema_check_asserts_formats_references_and_versions() -> None:
    """The schema check (jsonschema_rs over the schema files cyclonedx-python-lib ships):
    an IRI that is no IRI (a ``format``), a licence id the SPDX schema does not list
    (a ``$ref`` into another file) and a version with no JSON schema each fail it."""
    good = asyncio.run(add_sbom(_tree()))
    bom = json.loads(good[SBOM_PATH])

    def summary(change: dict[str, Any], spec: str | None = None) -> str:
        broken = json.loads(json.dumps(bom))
        broken["components"][0].update(change)
        if spec is not None:
            broken["specVersion"] = spec
        result = check_sbom({**good, SBOM_PATH: json.dumps(broken)})
        assert result.status == "failed", result.summary
        return result.summary

    bad_url = [{"type": "website", "url": "http://exa mple.com/\\\\x"}]
    assert "components/0/externalReferences/0/url" in summary({"externalReferences": bad_url})
    bad_licence = [{"license": {"id": "NOT-A-LICENCE"}}]
    assert "components/0/licenses" in summary({"licenses": bad_licence})
    assert "has no JSON schema" in summary({}, spec="1.1")
    assert "unknown CycloneDX specVersion '9.9'" in summary({}, spec="9.9")


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


def test_mypy_from_the_warm_cache_still_fails_a_misused_library() -> None:
    """The seed carries the libraries' real types: a call FastAPI's signature refuses,
    and a plain type error, both fail the seeded run, each named where it is."""
    files = render_request(request_for("online_serving_slo"))
    app = files["services/serve/app.py"]
    assert "from fastapi import FastAPI" in app
    files["services/serve/app.py"] = app + (
        "\n\ndef _misused() -> FastAPI:\n    return FastAPI(title=1)\n"
        "\n\ndef _wrong() -> int:\n    return 'one'\n"
    )
    result = asyncio.run(run_mypy(files, default_config()))
    assert result.status == "failed" and result.details["seeded"] is True, result
    output = result.details["output"]
    assert re.search(r'services/serve/app\.py:\d+: error: Argument "title" to "FastAPI"', output)
    assert re.search(r"services/serve/app\.py:\d+: error: Incompatible return value", output)
    assert "Found 2 errors in 1 file" in output, output


def test_broken_python_fails_ruff_and_pytest() -> None:
    files = render_request(request_for("online_serving_slo"))
    app = files["services/serve/app.py"]
    scored = "return Prediction(score=model.score(row), model=version)"
    assert scored in app
    files["services/serve/app.py"] = app.replace(
        scored,
        "return Prediction(score=model.score(row) + undefined_name, model=version)",
    )
    config = default_config()
    ruff = asyncio.run(run_ruff(files, config))
    assert ruff.status == "failed"
    assert "F821" in ruff.details["output"]
    tests = asyncio.run(run_pytest(files, config))
    assert tests.status == "failed"
    assert "NameError" in tests.details["output"]
