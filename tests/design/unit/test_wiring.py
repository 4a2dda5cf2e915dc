"""The wiring check (issue 38 §1) by mutation: generated repositories pass it, and a copy
broken at one joint fails it with a finding that names the file and what is wrong.

Pure and fast: the trees come from the deterministic template renderer, the checks are
python-hcl2, PyYAML and ast over the ``{path: text}`` map.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from activities.design.infra import NAME_PREFIX_MAX, name_prefix
from activities.design.validators import check_wiring
from keel.design.wiring import (
    Finding,
    code_metrics,
    default_works_deployed,
    env_reads,
    import_closure,
)
from keel.design.wiring import check_wiring as findings_of
from tests.design.codegen_cases import CASES, FORMS, request_for, request_for_form, with_patterns
from tests.support.hcl import parse_once

#: A tree with ECS tasks, a Lambda function (image) and a stream; one with Glue jobs, a
#: SageMaker batch transform and the drift alarm.
STREAM = "kinesis_online_one_region"
BATCH = "batch_training"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    """Every check re-reads the tree's Terraform, and the mutated copies share all but
    one file with the tree they came from: each distinct text is parsed once."""
    with parse_once():
        yield


@functools.cache
def _tree(name: str) -> tuple[tuple[str, str], ...]:
    req = request_for(name) if name in CASES else request_for_form(name)
    return tuple(render_request(req).items())


def tree(name: str) -> dict[str, str]:
    return dict(_tree(name))


def mutate(files: dict[str, str], path: str, old: str, new: str) -> dict[str, str]:
    assert old in files[path], (path, old)
    return {**files, path: files[path].replace(old, new, 1)}


def only(found: list[Finding], rule: str) -> list[Finding]:
    assert {f.rule for f in found} == {rule}, found
    return found


def messages(found: list[Finding]) -> str:
    return "\n".join(f"{f.file}: {f.message}" for f in found)


@pytest.mark.parametrize("name", [*CASES, *FORMS])
def test_every_generated_shape_is_wired(name: str) -> None:
    assert findings_of(tree(name)) == []


def test_the_validator_reports_passed_failed_and_not_run() -> None:
    good = check_wiring(tree(STREAM))
    assert good.status == "passed" and good.details["findings"] == [], good.summary
    bad = check_wiring(
        mutate(tree(STREAM), "README.md", '-var "image_tag=', '-var "colour=red" -var "image_tag=')
    )
    assert bad.status == "failed" and bad.summary == "1 wiring finding(s): variables 1"
    assert bad.details["findings"] == [
        {
            "rule": "variables",
            "file": "README.md",
            # The README's first `-var "image_tag=` is the targeted apply that makes the ECR
            # repositories before the images are pushed (deploy order).
            "message": "terraform apply in infra/ passes colour (-var), which the root module "
            "infra/ does not declare",
        }
    ]
    assert check_wiring({"a.py": "x = 1\n"}).status == "not_run"


# ------------------------------------------------------------------------------ variables


def test_a_readme_variable_the_root_does_not_declare_fails() -> None:
    """The reviewer's finding: the README passed image_tag, which only modules declared."""
    files = tree(STREAM)
    root_vars = files["infra/variables.tf"]
    start = root_vars.index('variable "image_tag"')
    files["infra/variables.tf"] = root_vars[:start] + root_vars[root_vars.index("}\n", start) + 2 :]
    found = messages(only(findings_of(files), "variables"))
    assert "README.md: terraform plan in infra/ passes image_tag (-var)" in found
    # ... and every module block that passes var.image_tag now reads an undeclared variable
    # is Terraform's own error; the module's inputs are still declared.


def test_a_var_file_that_is_not_there_or_declares_too_much_fails() -> None:
    files = mutate(
        tree(STREAM),
        "README.md",
        "terraform plan -out",
        "terraform plan -var-file=prod.tfvars -out",
    )
    (finding,) = only(findings_of(files), "variables")
    assert finding.file == "README.md" and "reads -var-file prod.tfvars" in finding.message
    files["infra/prod.tfvars"] = 'image_tag = "x"\nreplicas = 3\n'
    (finding,) = only(findings_of(files), "variables")
    assert "passes replicas (-var-file prod.tfvars)" in finding.message


def test_a_ci_tf_var_the_root_does_not_declare_fails() -> None:
    files = mutate(
        tree(STREAM),
        ".github/workflows/terraform.yml",
        "          terraform validate\n",
        "          terraform validate\n"
        "      - name: Plan\n        working-directory: infra\n"
        "        env:\n          TF_VAR_replicas: 3\n          TF_VAR_image_tag: ${{ github.sha }}\n"
        '          TF_VAR_certificate_arns: \'{"us-east-1"="arn"}\'\n'
        "        run: terraform plan -input=false\n",
    )
    (finding,) = only(findings_of(files), "variables")
    assert finding.file == ".github/workflows/terraform.yml"
    assert "terraform plan in infra/ passes replicas (TF_VAR_)" in finding.message


def test_a_module_input_the_module_does_not_declare_fails() -> None:
    files = mutate(
        tree(STREAM), "infra/main.tf", "  image_tag               = var.image_tag\n",
        "  image_tag               = var.image_tag\n  replicas = 3\n",
    )  # fmt: skip
    (finding,) = only(findings_of(files), "variables")
    assert finding.file == "infra/main.tf"
    assert finding.message.endswith("passes replicas, which infra/modules/train/ does not declare")


def test_a_required_module_variable_not_passed_fails() -> None:
    files = mutate(tree(STREAM), "infra/main.tf", "  image_tag               = var.image_tag\n", "")
    found = findings_of(files)
    assert {f.rule for f in found} == {"variables", "images"}, found
    text = messages(found)
    assert 'module "train_us_east_1" does not pass image_tag, which ' in text
    assert "infra/modules/train/variables.tf declares without a default" in text
    assert "its tag var.image_tag is not passed from the root module" in text


# --------------------------------------------------------------------------------- lambda

_ZIP_LAMBDA = """
resource "aws_lambda_function" "extra" {
  function_name = "extra"
  role          = "arn:aws:iam::123456789012:role/extra"
  runtime       = "python3.12"
  handler       = "HANDLER"
  s3_bucket     = "artifacts"
  s3_key        = var.lambda_package_key
  environment {
    variables = {
      DATA_URI = "s3://${split(\":::\", var.model_bucket_arns[0])[1]}/pipeline"
    }
  }
}

variable "lambda_package_key" {
  type    = string
  default = "lambda/serve.zip"
}
"""

_ARCHIVED_LAMBDA = """
data "archive_file" "extra" {
  type        = "zip"
  source_dir  = "${path.root}/.."
  excludes    = ["infra", "tests"]
  output_path = "${path.root}/.terraform/extra.zip"
}

resource "aws_lambda_function" "extra" {
  function_name = "extra"
  role          = "arn:aws:iam::123456789012:role/extra"
  runtime       = "python3.12"
  handler       = "HANDLER"
  filename      = data.archive_file.extra.output_path
  environment {
    variables = {
      DATA_URI = "s3://${split(\":::\", var.model_bucket_arns[0])[1]}/pipeline"
    }
  }
}
"""


def test_a_lambda_package_nothing_builds_and_a_missing_handler_fail() -> None:
    """The reviewer's two findings: a zip at var.lambda_package_key nothing makes, and
    handlers naming modules that do not exist."""
    files = tree(STREAM)
    files["infra/modules/serve/extra.tf"] = _ZIP_LAMBDA.replace(
        "HANDLER", "services.serve.lambda_handler.handler"
    )
    found = messages(only(findings_of(files), "lambda"))
    assert (
        "infra/modules/serve/extra.tf: aws_lambda_function.extra runs the package "
        "${var.lambda_package_key} (lambda/serve.zip), which nothing builds" in found
    )
    assert "handler services.serve.lambda_handler.handler names module " in found
    assert "services/serve/lambda_handler.py is not in its package" in found


def test_a_lambda_zip_ci_uploads_is_built() -> None:
    files = tree(STREAM)
    files["infra/modules/serve/extra.tf"] = _ZIP_LAMBDA.replace(
        "HANDLER", "services.ingest.lambda_handler.handler"
    )
    files = mutate(
        files, ".github/workflows/ci.yml", "      - name: Lint\n",
        "      - name: Package\n"
        "        run: python -m zipfile -c serve.zip services && aws s3 cp serve.zip "
        "s3://artifacts/lambda/serve.zip\n      - name: Lint\n",
    )  # fmt: skip
    assert findings_of(files) == []


def test_an_archived_lambda_passes_and_its_handler_must_exist() -> None:
    files = tree(STREAM)
    good = "services.ingest.lambda_handler.handler"
    files["infra/modules/serve/extra.tf"] = _ARCHIVED_LAMBDA.replace("HANDLER", good)
    assert findings_of(files) == []
    files["infra/modules/serve/extra.tf"] = _ARCHIVED_LAMBDA.replace(
        "HANDLER", "services.ingest.lambda_handler.handle"
    )
    (finding,) = only(findings_of(files), "lambda")
    assert finding.message == (
        "aws_lambda_function.extra: handler services.ingest.lambda_handler.handle: "
        "services/ingest/lambda_handler.py defines no handle"
    )
    # A module the archive leaves out is not in the package.
    files["infra/modules/serve/extra.tf"] = _ARCHIVED_LAMBDA.replace("HANDLER", good).replace(
        '["infra", "tests"]', '["infra", "tests", "services"]'
    )
    (finding,) = only(findings_of(files), "lambda")
    assert "is not in its package (data.archive_file.extra)" in finding.message


# --------------------------------------------------------------------------------- images


def test_an_image_ci_does_not_push_fails() -> None:
    """The reviewer's finding: CI built local tags and pushed nothing."""
    files = tree(STREAM)
    ci = files[".github/workflows/ci.yml"]
    files[".github/workflows/ci.yml"] = ci[: ci.index("  # On main")]
    found = only(findings_of(files), "images")
    assert len(found) == 3  # serve, train and the transform function's image
    assert any(
        f.file == "infra/modules/train/main.tf"
        and f.message.startswith("aws_ecs_task_definition.train runs the ECR repository ")
        and f.message.endswith("/train, which no CI workflow pushes to (they push: nothing)")
        for f in found
    ), found


def test_an_image_pushed_under_another_tag_fails() -> None:
    files = tree(STREAM)
    files[".github/workflows/ci.yml"] = files[".github/workflows/ci.yml"].replace(
        ":${{ env.IMAGE_TAG }}", ":latest"
    )
    found = only(findings_of(files), "images")
    assert len(found) == 3
    assert all(f.file == ".github/workflows/ci.yml" for f in found)
    assert "at var.image_tag, but CI pushes it as latest" in found[0].message


def test_an_image_pushed_elsewhere_or_not_from_ecr_fails() -> None:
    files = tree(STREAM)
    files[".github/workflows/ci.yml"] = files[".github/workflows/ci.yml"].replace(
        "${{ steps.ecr.outputs.registry }}", "ghcr.io"
    )
    found = only(findings_of(files), "images")
    assert len(found) == 3 and "is pushed to ghcr.io, not to ECR" in found[0].message
    files = mutate(
        tree(STREAM), "infra/modules/train/main.tf",
        '"${aws_ecr_repository.train.repository_url}:${var.image_tag}"', '"python:3.11"',
    )  # fmt: skip
    finding, pushed = sorted(
        only(findings_of(files), "images"), key=lambda f: f.file != "infra/modules/train/main.tf"
    )
    assert finding.message == (
        "aws_ecs_task_definition.train: image python:3.11 is not from an ECR repository "
        "the Terraform declares"
    )
    # ... and the train image CI pushes is run by nothing now.
    assert pushed.file == ".github/workflows/ci.yml"
    assert pushed.message.endswith(
        "/train (services/train/Dockerfile), but no task definition, Lambda function, "
        "SageMaker job or model or EMR Serverless application of the Terraform runs it"
    )


# ---------------------------------------------------------------------------- environment


def test_data_uri_nothing_sets_fails() -> None:
    """The reviewer's finding: services read DATA_URI (default "data") and no task
    definition set it."""
    files = mutate(
        tree(STREAM), "infra/modules/train/main.tf",
        '    environment            = [{ name = "DATA_URI", value = "s3://${aws_s3_bucket.models.id}/pipeline" }]\n',
        "",
    )  # fmt: skip
    (finding,) = only(findings_of(files), "environment")
    assert finding.file == "infra/modules/train/main.tf"
    assert finding.message.startswith("aws_ecs_task_definition.train runs services/train/")
    assert "(services/train/Dockerfile), which reads DATA_URI (services/common/settings.py:" in (
        finding.message
    )
    assert finding.message.endswith("default 'data'), and nothing sets it there")


def test_a_lambda_and_a_sagemaker_job_must_set_what_they_read() -> None:
    files = mutate(
        tree(STREAM), "infra/modules/transform/main.tf",
        '      DATA_URI       = "s3://${var.pipeline_bucket}/pipeline"\n', "",
    )  # fmt: skip
    (finding,) = only(findings_of(files), "environment")
    assert finding.message.startswith(
        "aws_lambda_function.transform runs services/ingest/lambda_handler.py "
        "(services/transform/Dockerfile), which reads DATA_URI"
    )
    # SageMaker does not promise AWS_REGION: a model must be given it.
    files = mutate(tree(BATCH), "infra/modules/serve/main.tf", "AWS_REGION = local.region", "")
    (finding,) = only(findings_of(files), "environment")
    assert "aws_sfn_state_machine.score runs services/serve/sagemaker.py" in finding.message
    assert "reads AWS_REGION (services/common/settings.py:" in finding.message
    assert "default REGIONS[0])" in finding.message


def test_a_compose_service_must_set_what_it_reads() -> None:
    files = tree(STREAM)
    files["docker-compose.yml"] = (
        "services:\n  api:\n    build:\n      context: .\n"
        "      dockerfile: services/serve/Dockerfile\n    environment:\n      AWS_REGION: us-east-1\n"
    )
    (finding,) = only(findings_of(files), "environment")
    assert finding.file == "docker-compose.yml"
    assert "service api runs services/serve/app.py, which reads DATA_URI" in finding.message
    files["docker-compose.yml"] += "      DATA_URI: /data\n"
    assert findings_of(files) == []


def test_environment_reads_and_the_defaults_accepted() -> None:
    code = (
        "import os\nfrom pydantic_settings import BaseSettings\n"
        "LIMIT = 3\n"
        "a = os.environ['A']\n"
        "b = os.getenv('B', 'data')\n"
        "c = os.environ.get('C', LIMIT)\n"
        "d = os.getenv('D')\n"
        "def load(env=None):\n"
        "    source = os.environ if env is None else env\n"
        "    return source.get('E', 0.5), source['F']\n"
        "class Settings(BaseSettings):\n"
        "    queue_url: str\n"
        "    batch: int = 10\n"
    )
    reads = {(r.name, r.default, r.accepted) for r in env_reads("m.py", code)}
    assert reads == {
        ("A", "none", False),
        ("B", "'data'", False),  # a local path: works on a laptop, not in a task
        ("C", "LIMIT", True),  # the code's constant: the same wherever it runs
        ("D", "none", False),
        ("E", "0.5", True),
        ("F", "none", False),
        ("QUEUE_URL", "none", False),
        ("BATCH", "10", True),
    }
    assert default_works_deployed(ast.parse("None", mode="eval").body) == ("None", True)
    assert default_works_deployed(ast.parse("REGIONS[0]", mode="eval").body)[1] is False


def test_the_code_a_runtime_starts_is_followed_through_imports() -> None:
    files = tree(BATCH)
    closure = import_closure(files, ["services/serve/sagemaker.py"])
    # uvicorn.run("services.serve.app:app") starts the app, which loads the settings; the
    # container's `train` entry point (SageMaker's contract) imports the training code.
    assert "services/serve/app.py" in closure and "services/common/settings.py" in closure
    assert "services/train/train.py" in closure
    # Only what it imports: the local smoke driver is not.
    assert "services/smoke.py" not in closure


# --------------------------------------------------------------------------------- alarms


def test_an_alarm_on_a_metric_nothing_emits_fails() -> None:
    """The reviewer's finding: the PipelineErrors alarm watched a metric filter on a log
    group nothing wrote to."""
    files = mutate(
        tree(BATCH), "infra/modules/observe/main.tf", '"max_feature_psi"', '"PipelineErrors"'
    )
    (finding,) = only(findings_of(files), "alarms")
    assert finding.file == "infra/modules/observe/main.tf"
    assert finding.message == (
        "aws_cloudwatch_metric_alarm.drift watches batch-training/monitoring PipelineErrors, "
        "which nothing emits: no log metric filter on a log group a runtime writes to, and "
        "no code puts it"
    )
    # A metric filter on the module's log group does not help while nothing logs there...
    files["infra/modules/observe/errors.tf"] = (
        'resource "aws_cloudwatch_log_metric_filter" "errors" {\n'
        '  name           = "errors"\n'
        "  log_group_name = aws_cloudwatch_log_group.this.name\n"
        '  pattern        = "ERROR"\n'
        "  metric_transformation {\n"
        '    name      = "PipelineErrors"\n'
        '    namespace = "batch-training/monitoring"\n'
        '    value     = "1"\n'
        "  }\n}\n"
    )
    assert len(only(findings_of(files), "alarms")) == 1
    # ... and does once a task writes its logs there.
    files["infra/modules/observe/task.tf"] = (
        'resource "aws_ecs_task_definition" "logs" {\n'
        '  family                = "logs"\n'
        '  container_definitions = jsonencode([{ name = "x", logConfiguration = { options = '
        "{ awslogs-group = aws_cloudwatch_log_group.this.name } } }])\n}\n"
    )
    assert findings_of(files) == []


def test_an_alarm_on_an_aws_namespace_needs_its_resource() -> None:
    files = mutate(
        tree(BATCH), "infra/modules/observe/main.tf",
        'namespace           = "batch-training/monitoring"', 'namespace           = "AWS/Kafka"',
    )  # fmt: skip
    (finding,) = only(findings_of(files), "alarms")
    assert "watches AWS/Kafka max_feature_psi, but the Terraform creates no aws_msk_cluster" in (
        finding.message
    )
    streaming = tree("streaming_features")  # MSK: AWS/Kafka is emitted
    path = "infra/modules/ingest/alarm.tf"
    streaming[path] = (
        'resource "aws_cloudwatch_metric_alarm" "lag" {\n  alarm_name = "lag"\n'
        '  namespace = "AWS/Kafka"\n  metric_name = "MaxOffsetLag"\n}\n'
    )
    assert findings_of(streaming) == []


def test_an_alarm_must_match_the_dimensions_the_code_puts() -> None:
    files = mutate(
        tree(BATCH), "infra/modules/observe/main.tf", '"max_feature_psi"', '"feature_psi"'
    )
    (finding,) = only(findings_of(files), "alarms")
    assert finding.message == (
        "aws_cloudwatch_metric_alarm.drift watches batch-training/monitoring feature_psi with "
        "dimensions none, but services/observe/drift.py puts it with ['feature']: no such "
        "metric exists"
    )
    (drift,) = {m.name for m in code_metrics("d.py", tree(BATCH)["services/observe/drift.py"])} & {
        "max_feature_psi"
    }
    assert drift == "max_feature_psi"


# ----------------------------------------------------------------------------------- jobs


def test_a_glue_script_not_in_the_repository_fails() -> None:
    """The reviewer's finding: Glue jobs pointed at scripts never generated."""
    files = tree(BATCH)
    del files["jobs/glue/transform.py"]
    (finding,) = only(findings_of(files), "jobs")
    assert finding.file == "infra/modules/transform/main.tf"
    assert finding.message == (
        "aws_glue_job.transform: s3://${aws_s3_bucket.artifacts.id}/jobs/transform.py: "
        "aws_s3_object.transform_script uploads jobs/glue/transform.py, which is not in the "
        "repository"
    )
    files = mutate(
        tree(BATCH), "infra/modules/feature/main.tf", '/jobs/features.py"', '/jobs/other.py"'
    )
    (finding,) = only(findings_of(files), "jobs")
    assert finding.message.endswith(
        "no aws_s3_object of infra/modules/feature/ uploads key jobs/other.py to that bucket"
    )


# ---------------------------------------------------------------------------- name prefix


def test_name_prefixes_are_unique_per_project_and_fit() -> None:
    """The reviewer's finding: churn-model-eu and churn-model-us both got churn-mode."""
    regions = ("us-east-1", "eu-west-1", "ap-southeast-2", "ap-south-1", "us-gov-west-1")
    prefixes = {
        (slug, region): name_prefix(slug, region)
        for slug in ("churn-model-eu", "churn-model-us", "a-very-long-project-name-indeed", "x")
        for region in regions
    }
    assert len(set(prefixes.values())) == len(prefixes)
    assert max(len(p) for p in prefixes.values()) <= NAME_PREFIX_MAX
    assert name_prefix("churn-model-eu", "eu-west-1").endswith("-euw1")
    assert name_prefix("churn-model-eu", "ap-south-1") != name_prefix(
        "churn-model-eu", "ap-southeast-1"
    )
    main = tree(BATCH)["infra/main.tf"]
    assert f'name_prefix        = "{name_prefix("batch-training", "eu-west-1")}"' in main


# ------------------------------------------------------------------- account singletons


@functools.cache
def _baseline_tree(name: str) -> tuple[tuple[str, str], ...]:
    req = request_for(name) if name in CASES else request_for_form(name)
    constraints = req.constraints.model_copy(update={"account_baseline": True})
    return tuple(render_request(req.model_copy(update={"constraints": constraints})).items())


@pytest.mark.parametrize("name", [BATCH, "streaming_features"])
def test_a_tree_that_owns_the_baseline_is_wired(name: str) -> None:
    files = dict(_baseline_tree(name))
    assert (
        "aws_lakeformation_data_lake_settings" in files["infra/modules/govern/main.tf"]
        or "aws_config_configuration_recorder" in files["infra/modules/govern/main.tf"]
    )
    assert findings_of(files) == []


def test_an_account_singleton_without_the_baseline_fails() -> None:
    """A baseline tree whose root no longer owns the baseline, and a plain tree that
    enables GuardDuty: each singleton is named."""
    files = mutate(
        dict(_baseline_tree(BATCH)),
        "infra/main.tf",
        "account_baseline = true",
        "account_baseline = false",
    )
    found = only(findings_of(files), "account")
    kinds = sorted(f.message.split(" ", 1)[0] for f in found)
    # One per region instance's module file: the foundation's catalog encryption and
    # Lake Formation's settings.
    assert kinds == [
        "aws_glue_data_catalog_encryption_settings.this",
        "aws_lakeformation_data_lake_settings.this",
    ]
    assert all("does not own the account's baseline" in f.message for f in found)
    plain = mutate(
        tree(STREAM),
        "infra/modules/ingest/main.tf",
        'resource "aws_kinesis_stream"',
        'resource "aws_guardduty_detector" "this" {\n  enable = true\n}\n\n'
        'resource "aws_kinesis_stream"',
    )
    (finding,) = only(findings_of(plain), "account")
    assert finding.file == "infra/modules/ingest/main.tf"
    assert "aws_guardduty_detector.this is GuardDuty's detector" in finding.message


# ------------------------------------------------------------------------------- kafka

KAFKA = "streaming_features"


def test_the_msk_tree_creates_its_topic_and_connects_with_iam() -> None:
    files = tree(KAFKA)
    transform = files["infra/modules/transform/main.tf"]
    assert 'resource "aws_lambda_invocation" "topics"' in transform
    assert "depends_on        = [aws_lambda_invocation.topics]" in transform
    assert 'command = ["services.ingest.stream.create_topics"]' in transform
    assert "iam = true" in files["infra/modules/ingest/main.tf"]
    stream = files["services/ingest/stream.py"]
    assert '"security.protocol": "SASL_SSL"' in stream and '"OAUTHBEARER"' in stream
    assert '"SSL"' not in stream


def test_a_client_that_connects_another_way_than_the_cluster_admits_fails() -> None:
    """The reviewer's finding: the consumer used SSL while the cluster asked for IAM."""
    files = mutate(
        tree(KAFKA),
        "services/ingest/stream.py",
        '"security.protocol": "SASL_SSL"',
        '"security.protocol": "SSL"',
    )
    (finding,) = only(findings_of(files), "kafka")
    assert finding.file == "services/ingest/stream.py"
    assert "security.protocol SSL" in finding.message and "(tls)" in finding.message
    assert "aws_msk_cluster.this (infra/modules/ingest/) admits iam" in finding.message


def test_a_cluster_that_admits_only_scram_fails_every_iam_client() -> None:
    files = mutate(tree(KAFKA), "infra/modules/ingest/main.tf", "iam = true", "scram = true")
    found = only(findings_of(files), "kafka")
    assert sorted(f.file for f in found) == [
        "infra/modules/ingest/outputs.tf",  # bootstrap_brokers_sasl_iam handed out
        "infra/modules/transform/main.tf",  # the event source mapping reads with IAM
        "services/ingest/stream.py",  # the client's OAUTHBEARER
    ]
    assert any("reads with iam or none auth" in f.message for f in found)


def test_a_topic_nothing_creates_or_not_waited_for_fails() -> None:
    renamed = mutate(
        tree(KAFKA),
        "infra/modules/transform/main.tf",
        'topics            = ["events"]',
        'topics            = ["orders"]',
    )
    (finding,) = only(findings_of(renamed), "kafka")
    assert "reads topic orders, which nothing creates" in finding.message
    racing = mutate(
        tree(KAFKA),
        "infra/modules/transform/main.tf",
        "  depends_on        = [aws_lambda_invocation.topics]\n",
        "",
    )
    (finding,) = only(findings_of(racing), "kafka")
    assert "does not wait for aws_lambda_invocation.topics" in finding.message
    # The bootstrap gone altogether: the mapping's topic and the cluster have none.
    transform = tree(KAFKA)["infra/modules/transform/main.tf"]
    start = transform.index('resource "aws_lambda_invocation" "topics"')
    end = transform.index("}\n}\n", start) + 4
    gone = {
        **tree(KAFKA),
        "infra/modules/transform/main.tf": transform[:start]
        + transform[end:].replace("  depends_on        = [aws_lambda_invocation.topics]\n", ""),
    }
    found = messages(only(findings_of(gone), "kafka"))
    assert "reads topic events, which nothing creates" in found
    assert "aws_msk_cluster.this (infra/modules/ingest/): no topic is created on it" in found
    # A cluster that creates topics on first use needs no bootstrap.
    auto = mutate(
        gone,
        "infra/modules/ingest/main.tf",
        "auto.create.topics.enable=false",
        "auto.create.topics.enable=true",
    )
    assert findings_of(auto) == []


def test_an_image_handler_that_is_not_there_fails() -> None:
    files = mutate(
        tree(KAFKA),
        "infra/modules/transform/main.tf",
        "services.ingest.stream.create_topics",
        "services.ingest.stream.make_topics",
    )
    (finding,) = only(findings_of(files), "lambda")
    assert finding.message == (
        "aws_lambda_function.topics: image_config command services.ingest.stream.make_topics: "
        "services/ingest/stream.py defines no make_topics"
    )


def test_msk_with_the_spark_transform_creates_topics_on_first_use() -> None:
    """Issue 38 §3: with EMR Serverless Spark no module runs a topic bootstrap (CI pushes
    no image it could run), so the cluster creates topics on first use and producers may
    create them; with the setting off the check finds the cluster without a topic."""
    req = with_patterns(request_for(KAFKA), "transform:emr-serverless-spark")
    assert {"ingest:msk-kafka", "transform:emr-serverless-spark"} <= set(req.plan.pattern_ids())
    files = render_request(req)
    ingest = files["infra/modules/ingest/main.tf"]
    assert "auto.create.topics.enable=true" in ingest
    assert '"kafka-cluster:CreateTopic"' in ingest
    assert "aws_lambda_invocation" not in files["infra/modules/transform/main.tf"]
    # The one finding is not the kafka rule's: the EMR job reads landed files, not the
    # topic (no Kafka drain yet), so nothing writes the SageMaker training job's channel
    # (the stream's Lambda function did).
    (channel,) = only(findings_of(files), "objects")
    assert "the SageMaker channel train reads" in channel.message
    off = mutate(
        files,
        "infra/modules/ingest/main.tf",
        "auto.create.topics.enable=true",
        "auto.create.topics.enable=false",
    )
    (finding,) = [f for f in findings_of(off) if f.rule != "objects"]
    assert finding.rule == "kafka"
    assert "aws_msk_cluster.this (infra/modules/ingest/): no topic is created on it" in (
        finding.message
    )
    # The kinesis-lambda consumer keeps its bootstrap, and the cluster creates nothing.
    assert "auto.create.topics.enable=false" in tree(KAFKA)["infra/modules/ingest/main.tf"]
    assert '"kafka-cluster:CreateTopic"' not in tree(KAFKA)["infra/modules/ingest/main.tf"]
