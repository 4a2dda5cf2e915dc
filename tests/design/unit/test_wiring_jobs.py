"""Script jobs in the wiring check (issue 38 §1), by mutation: the EMR Serverless
transform submits a job run of a script the repository uploads, and the Glue jobs and
that job run are followed by the ``jobs``, ``environment``, ``permissions`` and
``objects`` rules. A generated tree passes; each broken copy fails naming what broke."""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from keel.design.wiring import check_wiring
from tests.design.codegen_cases import request_for, request_for_form, with_patterns
from tests.design.unit.test_wiring import mutate, only
from tests.support.hcl import parse_once

EMR = "infra/modules/transform/main.tf"
GLUE = "infra/modules/feature/main.tf"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


@functools.cache
def _tree(emr: bool, sagemaker: bool) -> tuple[tuple[str, str], ...]:
    """batch_training (S3 batch ingest, Glue offline features) with the EMR Serverless
    transform and, optionally, SageMaker training (whose train channel the job writes)."""
    swaps = [
        *(["transform:emr-serverless-spark"] if emr else []),
        *(["train:sagemaker-training"] if sagemaker else []),
    ]
    return tuple(render_request(with_patterns(request_for("batch_training"), *swaps)).items())


def tree(*, emr: bool = True, sagemaker: bool = False) -> dict[str, str]:
    return dict(_tree(emr, sagemaker))


@pytest.mark.parametrize("sagemaker", [False, True])
def test_the_emr_transform_submits_a_job_run_of_its_script(sagemaker: bool) -> None:
    files = tree(sagemaker=sagemaker)
    assert check_wiring(files) == []
    main = files[EMR]
    assert '"arn:aws:scheduler:::aws-sdk:emrserverless:startJobRun"' in main
    assert 'EntryPoint = "s3://${aws_s3_bucket.artifacts.id}/jobs/transform.py"' in main
    assert 'fileset("${path.root}/../jobs/emr", "transform.py")' in main
    script = files["jobs/emr/transform.py"]
    assert "EMR Serverless job run transform" in script
    assert "def land(" in script and "landing_files(" in script
    # The job lands the batch ingest's files, and with SageMaker training its channel too.
    assert '"--landing_uri", "s3://${var.landing_bucket}/incoming/"' in main
    assert ('"--training_set_uri"' in main) is sagemaker
    assert "tests/test_jobs.py" in files
    assert '"jobs" / "emr" / "transform.py"' in files["tests/test_jobs.py"]


def test_an_emr_entry_point_missing_from_the_repository_fails() -> None:
    files = tree()
    del files["jobs/emr/transform.py"]
    (finding,) = only(check_wiring(files), "jobs")
    assert finding.file == EMR
    assert finding.message == (
        "aws_scheduler_schedule.transform: s3://${aws_s3_bucket.artifacts.id}/jobs/transform.py: "
        "aws_s3_object.transform_script uploads jobs/emr/transform.py, which is not in the "
        "repository"
    )


def test_an_emr_entry_point_nothing_uploads_fails() -> None:
    files = mutate(tree(), EMR, "/jobs/transform.py", "/jobs/spark_main.py")
    (finding,) = only(check_wiring(files), "jobs")
    assert finding.message.startswith(
        "aws_scheduler_schedule.transform: s3://${aws_s3_bucket.artifacts.id}/jobs/spark_main.py: "
        "no aws_s3_object of infra/modules/transform/ uploads key jobs/spark_main.py"
    )


def test_an_emr_application_no_job_run_is_submitted_to_fails() -> None:
    """The state before this rule: the application was created and nothing ran on it."""
    files = mutate(
        tree(),
        EMR,
        "ApplicationId    = aws_emrserverless_application.spark.id",
        'ApplicationId    = "00fabcdexample"',
    )
    (finding,) = only(check_wiring(files), "jobs")
    assert finding.file == EMR
    assert finding.message == (
        "aws_emrserverless_application.spark: no job run is submitted to it (no schedule or "
        "state machine of the module calls StartJobRun with its ApplicationId), so it never "
        "runs the repository's code"
    )


def test_the_emr_job_run_without_the_store_argument_fails() -> None:
    files = mutate(tree(), EMR, '"--data_uri", "s3://${var.pipeline_bucket}/pipeline",\n', "")
    found = only(check_wiring(files), "environment")
    assert [f.file for f in found] == [EMR]
    assert found[0].message.startswith(
        "aws_scheduler_schedule.transform runs jobs/emr/transform.py, which reads DATA_URI "
        "(services/common/settings.py:"
    )
    assert found[0].message.endswith("and nothing sets it there")


def test_the_emr_job_run_is_the_sagemaker_channel_writer() -> None:
    files = mutate(
        tree(sagemaker=True),
        EMR,
        '"--training_set_uri", "s3://${var.training_set_bucket}/',
        '"--training_set", "s3://${var.training_set_bucket}/',
    )
    (finding,) = only(check_wiring(files), "objects")
    assert "the SageMaker channel train reads" in finding.message


def test_a_glue_job_without_the_region_argument_fails() -> None:
    """Before the rule followed Glue jobs, every job read AWS_REGION and was given
    nothing: each region's job would have used the first region's default."""
    files = mutate(
        tree(emr=False),
        GLUE,
        '    "--aws_region"                       = local.region\n',
        "",
    )
    (finding,) = only(check_wiring(files), "environment")
    assert finding.file == GLUE
    assert finding.message.startswith(
        "aws_glue_job.features runs jobs/glue/features.py, which reads AWS_REGION "
        "(services/common/settings.py:"
    )


def test_a_glue_script_reading_an_argument_the_job_does_not_pass_fails() -> None:
    files = mutate(
        tree(emr=False),
        "jobs/glue/features.py",
        'args.get("run_date")',
        'args["run_date"]',
    )
    (finding,) = only(check_wiring(files), "environment")
    assert finding.file == GLUE
    assert finding.message.startswith(
        "aws_glue_job.features runs jobs/glue/features.py, which reads the argument "
        "--run_date (jobs/glue/features.py:"
    )
    assert finding.message.endswith("without checking it is there, and the job does not pass it")
    # Passing it is enough.
    passed = mutate(
        files,
        GLUE,
        '    "--aws_region"                       = local.region\n',
        '    "--aws_region"                       = local.region\n    "--run_date" = "2026-01-01"\n',
    )
    assert check_wiring(passed) == []


@pytest.mark.parametrize(
    ("script", "where", "role", "emr"),
    [
        ("jobs/glue/features.py", "aws_glue_job.features", "aws_iam_role.glue", False),
        ("jobs/emr/transform.py", "aws_scheduler_schedule.transform", "aws_iam_role.job", True),
    ],
)
def test_a_script_job_calling_what_its_role_may_not_fails(
    script: str, where: str, role: str, emr: bool
) -> None:
    files = mutate(
        tree(emr=emr),
        script,
        "def main(argv: list[str]) -> int:\n",
        "def describe(model: str) -> object:\n"
        "    import boto3\n\n"
        '    return boto3.client("bedrock-runtime").converse(modelId=model, messages=[])\n\n\n'
        "def main(argv: list[str]) -> int:\n",
    )
    (finding,) = only(check_wiring(files), "permissions")
    assert finding.message.startswith(f"{where} calls bedrock:InvokeModel ({script}:")
    assert finding.message.endswith(
        f"which its role ({role}) is not allowed: no policy of the module grants it"
    )


def test_a_glue_job_runs_python_3_11_with_the_pinned_requirements() -> None:
    """Glue 5.0 (Python 3.11, what pyproject.toml requires) installing the uploaded
    requirements.txt with pip -r; each way of breaking it fails the ``jobs`` rule."""
    files = tree(emr=False)
    assert check_wiring(files) == []
    main = files[GLUE]
    assert 'glue_version           = "5.0"' in main
    uri = "s3://${aws_s3_bucket.artifacts.id}/jobs/features/requirements.txt"
    assert f'"--additional-python-modules"        = "{uri}"' in main
    assert '"--python-modules-installer-option"  = "-r"' in main
    assert 'fileset("${path.root}/..", "requirements.txt")' in main

    old = mutate(files, GLUE, 'glue_version           = "5.0"', 'glue_version           = "4.0"')
    (finding,) = only(check_wiring(old), "jobs")
    assert finding.file == GLUE and finding.message == (
        "aws_glue_job.features: glue_version 4.0 runs Python 3.10, and the repository's code "
        "needs Python >= 3.11 (pyproject.toml requires-python)"
    )
    unset = mutate(files, GLUE, 'glue_version           = "5.0"', "")
    (finding,) = only(check_wiring(unset), "jobs")
    assert "glue_version 0.9 runs Python 2.7" in finding.message

    no_r = mutate(files, GLUE, '"--python-modules-installer-option"  = "-r"', "")
    (finding,) = only(check_wiring(no_r), "jobs")
    assert finding.message.endswith(
        "without --python-modules-installer-option -r: the job would not install the "
        "repository's pinned requirements"
    )
    not_uploaded = mutate(files, GLUE, 'fileset("${path.root}/..", "requirements.txt")', "[]")
    found = only(check_wiring(not_uploaded), "jobs")
    assert any("which is not the repository's requirements.txt" in f.message for f in found)

    listed = mutate(files, GLUE, f'"{uri}"', '"pandas==2.2.3"')
    listed = mutate(listed, GLUE, '"--python-modules-installer-option"  = "-r"', "")
    (finding,) = only(check_wiring(listed), "jobs")
    assert "pins of requirements.txt (missing: " in finding.message


EMR_IMAGE = "services/transform/Dockerfile"


def test_the_emr_job_runs_python_3_11_from_its_image_with_the_pinned_requirements() -> None:
    """EMR 7's own Python is 3.9: the application runs the job image CI builds and pushes
    (the EMR Serverless base of its release, Python 3.11 in /opt/venv with
    requirements.txt), and the job run points Spark's driver and executors at it. Each way
    of breaking that fails the ``jobs`` rule, naming what broke."""
    files = tree()
    assert check_wiring(files) == []
    main, image = files[EMR], files[EMR_IMAGE]
    assert 'release_label = "emr-7.2.0"' in main
    assert 'image_uri = "${aws_ecr_repository.transform.repository_url}:${var.image_tag}"' in main
    assert "FROM public.ecr.aws/emr-serverless/spark/emr-7.2.0:latest" in image
    assert "uv venv --python 3.11.9 /opt/venv" in image and "USER hadoop:hadoop" in image
    ci = files[".github/workflows/ci.yml"]
    assert EMR_IMAGE in ci  # built on every change and pushed from main

    def jobs_findings(changed: dict[str, str]) -> list[str]:
        found = check_wiring(changed)
        return [f"{f.file}: {f.message}" for f in found if f.rule == "jobs"]

    block = (
        "  image_configuration {\n"
        '    image_uri = "${aws_ecr_repository.transform.repository_url}:${var.image_tag}"\n'
        "  }\n"
    )
    assert block in main
    no_image = mutate(files, EMR, block, "")
    (pushed,) = [f for f in check_wiring(no_image) if f.rule == "images"]
    assert (
        "but no task definition, Lambda function, SageMaker job or model or EMR" in pushed.message
    )
    (finding,) = jobs_findings(no_image)
    assert finding == (
        f"{EMR}: aws_emrserverless_application.spark runs release emr-7.2.0's own Python 3.9 "
        "(it has no image_configuration), and jobs/emr/transform.py, which "
        "aws_scheduler_schedule.transform runs on it, needs Python >= 3.11 (pyproject.toml "
        "requires-python): give the application an image that brings it"
    )

    older = mutate(files, EMR_IMAGE, "spark/emr-7.2.0:latest", "spark/emr-7.1.0:latest")
    (finding,) = jobs_findings(older)
    assert finding.startswith(
        f"{EMR_IMAGE}: {EMR_IMAGE} builds on emr-7.1.0, but aws_emrserverless_application.spark "
        "(its image_configuration) runs release emr-7.2.0: EMR Serverless runs an image only"
    )

    driver = "--conf spark.emr-serverless.driverEnv.PYSPARK_PYTHON=/opt/venv/bin/python "
    (finding,) = jobs_findings(mutate(files, EMR, driver, ""))
    assert finding == (
        f"{EMR}: aws_scheduler_schedule.transform: its job run does not set "
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON (SparkSubmitParameters): the driver "
        f"(where the entry point runs) would use the release's own Python, not {EMR_IMAGE}'s"
    )

    py39 = mutate(files, EMR_IMAGE, "--python 3.11.9", "--python 3.9.19")
    (driver_f, executor_f) = jobs_findings(py39)
    assert driver_f == (
        f"{EMR}: aws_scheduler_schedule.transform: "
        "spark.emr-serverless.driverEnv.PYSPARK_PYTHON is /opt/venv/bin/python, Python 3.9 "
        f"in {EMR_IMAGE}; jobs/emr/transform.py needs Python >= 3.11 (pyproject.toml "
        "requires-python)"
    )
    assert "spark.executorEnv.PYSPARK_PYTHON is /opt/venv/bin/python, Python 3.9" in executor_f
    elsewhere = mutate(
        files, EMR, "PYSPARK_PYTHON=/opt/venv/bin/python", "PYSPARK_PYTHON=/opt/py/bin/python"
    )
    assert all(
        "which services/transform/Dockerfile does not make" in f for f in jobs_findings(elsewhere)
    )

    no_pins = mutate(
        files,
        EMR_IMAGE,
        "    && uv pip install --python /opt/venv/bin/python --no-cache -r /tmp/requirements.txt \\\n",
        "",
    )
    findings = jobs_findings(no_pins)
    assert findings and all(
        f.startswith(
            f"{EMR_IMAGE}: {EMR_IMAGE} does not install requirements.txt with /opt/venv/bin/python"
        )
        and f.endswith("would import none of the repository's pins")
        for f in findings
    )


@functools.cache
def _kinesis_tree(transform: str) -> tuple[tuple[str, str], ...]:
    req = with_patterns(request_for_form("kinesis_online_one_region"), transform)
    assert "ingest:kinesis-streams" in req.plan.pattern_ids()
    return tuple(render_request(req).items())


@pytest.mark.parametrize("transform", ["transform:glue-etl", "transform:emr-serverless-spark"])
def test_with_the_kinesis_ingest_the_job_lands_firehoses_files(transform: str) -> None:
    """Kinesis ingest with a job transform: Firehose writes the stream to the landing
    bucket's incoming/ as GZIP JSON lines (a newline appended to each record), and the
    job is given that prefix to land (jobs/<runner>/transform.py reads GZIP; its
    generated test puts a Firehose file through moto)."""
    files = dict(_kinesis_tree(transform))
    assert check_wiring(files) == []
    ingest = files["infra/modules/ingest/main.tf"]
    assert 'type = "AppendDelimiterToRecord"' in ingest
    assert 'prefix              = "incoming/!{timestamp:yyyy/MM/dd/HH}/"' in ingest
    main = files[EMR]
    assert "s3://${var.landing_bucket}/incoming/" in main
    runner = "emr" if "emr" in transform else "glue"
    assert "gzip.GzipFile(fileobj=stream)" in files[f"jobs/{runner}/transform.py"]
    assert "def test_the_job_reads_firehose_gzip_files" in files["tests/test_jobs.py"]
