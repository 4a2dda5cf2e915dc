"""The wiring check's rules for the gaps issue 38 §2/§3 found in generated repositories
that passed it: a root variable without a default that nothing passes, a variable the
code needs deployed (its absence raises) that no runtime sets, a service that calls an
AWS API its role may not call, and an image CI builds that nothing runs.

By mutation, like :mod:`tests.design.unit.test_wiring`: the generated tree passes, a copy
broken at one joint fails with the finding's message.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from keel.design.wiring import check_wiring as findings_of
from tests.design.codegen_cases import CASES, request_for, request_for_form, with_patterns
from tests.design.unit.test_wiring import messages, mutate, only, tree
from tests.support.hcl import parse_once

BATCH = "batch_training"


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


@functools.cache
def _baseline(name: str) -> tuple[tuple[str, str], ...]:
    req = request_for(name) if name in CASES else request_for_form(name)
    constraints = req.constraints.model_copy(update={"account_baseline": True})
    return tuple(render_request(req.model_copy(update={"constraints": constraints})).items())


def baseline(name: str) -> dict[str, str]:
    return dict(_baseline(name))


# ------------------------------------------------------------------------------ variables


def test_a_required_root_variable_nothing_passes_fails() -> None:
    """lake_admin_arns (the baseline's Lake Formation admins) had no default, and neither
    the README's plan nor its apply passed it."""
    files = baseline(BATCH)
    assert findings_of(files) == []
    files = mutate(
        files,
        "infra/variables.tf",
        "  type        = list(string)\n  default     = []\n}",
        "  type        = list(string)\n}",
    )
    found = messages(only(findings_of(files), "variables"))
    for sub in ("plan", "apply"):
        assert (
            f"README.md: terraform {sub} in infra/ does not pass lake_admin_arns, which the "
            "root module declares without a default (infra/variables.tf)"
        ) in found
    # A tfvars file Terraform loads by itself gives it; so does -var on each command.
    assert findings_of({**files, "infra/terraform.tfvars": 'lake_admin_arns = ["x"]\n'}) == []
    assert findings_of({**files, "infra/admins.auto.tfvars.json": '{"lake_admin_arns": []}'}) == []
    passed = files["README.md"].replace(
        '-var "image_tag=$(git rev-parse HEAD)"',
        '-var "image_tag=$(git rev-parse HEAD)" -var \'lake_admin_arns=["x"]\'',
    )
    assert findings_of({**files, "README.md": passed}) == []


def test_a_required_root_variable_with_no_command_at_all_fails() -> None:
    files = mutate(
        baseline(BATCH),
        "infra/variables.tf",
        "  type        = list(string)\n  default     = []\n}",
        "  type        = list(string)\n}",
    )
    files["README.md"] = "# nothing to run\n"
    found = messages(only(findings_of(files), "variables"))
    assert (
        "infra/variables.tf: nothing passes lake_admin_arns, which the root module infra/ "
        "declares without a default: no README or CI command plans or applies infra/"
    ) in found
    assert "nothing passes image_tag" in found


def test_applying_a_saved_plan_needs_no_variables() -> None:
    """``terraform apply tfplan`` runs what the plan (which passed them) decided."""
    files = tree(BATCH)
    assert "terraform apply tfplan" in files["README.md"]
    files = mutate(files, "README.md", "terraform plan -out=tfplan", "terraform plan -out tfplan")
    assert findings_of(files) == []


# ---------------------------------------------------------------------------- environment


def test_a_none_default_the_code_raises_without_must_be_set() -> None:
    """MLflow plans: settings read MLFLOW_TRACKING_URI with None, and the registry raises
    "set MLFLOW_TRACKING_URI" on a remote store; the tasks did not set it."""
    files = tree("rag")
    assert "MLFLOW_TRACKING_URI = var.mlflow_tracking_uri" in files["infra/modules/serve/main.tf"]
    assert findings_of(files) == []
    # ... and the function and the training task may reach the server (port 5000 in the VPC).
    for cap in ("serve", "train"):
        assert (
            '"The MLflow tracking server (MLFLOW_TRACKING_URI) inside the VPC"\n'
            "    from_port   = 5000"
        ) in files[f"infra/modules/{cap}/main.tf"]
    assert "from_port   = 5000" not in tree(BATCH)["infra/modules/train/main.tf"]
    broken = mutate(
        files,
        "infra/modules/serve/main.tf",
        "    MLFLOW_TRACKING_URI = var.mlflow_tracking_uri\n",
        "",
    )
    found = messages(only(findings_of(broken), "environment"))
    assert (
        "infra/modules/serve/main.tf: aws_lambda_function.api runs services/serve/handler.py "
        "(services/serve/Dockerfile), which reads MLFLOW_TRACKING_URI "
        "(services/common/settings.py:"
    ) in found
    assert "default None, and services/common/registry.py:" in found
    assert "raises without it), and nothing sets it there" in found


def test_a_none_default_nothing_demands_is_still_accepted() -> None:
    """The same read where no raise names it (a plan without MLflow) needs nothing."""
    files = tree("rag")
    registry = files["services/common/registry.py"]
    assert 'raise RuntimeError("set MLFLOW_TRACKING_URI: the store is not local")' in registry
    files = mutate(
        files,
        "services/common/registry.py",
        '"set MLFLOW_TRACKING_URI: the store is not local"',
        '"the store is not local"',
    )
    files = mutate(
        files,
        "infra/modules/serve/main.tf",
        "    MLFLOW_TRACKING_URI = var.mlflow_tracking_uri\n",
        "",
    )
    assert findings_of(files) == []


# ---------------------------------------------------------------------------- permissions


@pytest.mark.parametrize("name", ["rag", "online_rag_three_regions"])
def test_a_call_the_role_may_not_make_fails(name: str) -> None:
    """The RAG function calls Bedrock's Converse; its role had no bedrock:InvokeModel."""
    files = tree(name)
    serve = files["infra/modules/serve/main.tf"]
    assert 'resource "aws_iam_role_policy" "api_model"' in serve
    assert findings_of(files) == []
    broken = mutate(
        files,
        "infra/modules/serve/main.tf",
        '["bedrock:InvokeModel", "bedrock:InvokeModelWithResponseStream"]',
        '["bedrock:InvokeModelWithResponseStream"]',
    )
    (finding,) = only(findings_of(broken), "permissions")
    assert finding.file == "infra/modules/serve/main.tf"
    assert finding.message.startswith(
        "aws_lambda_function.api calls bedrock:InvokeModel (services/serve/handler.py:"
    )
    assert finding.message.endswith(
        "which its role (aws_iam_role.api) is not allowed: no policy of the module grants it"
    )
    # A wildcard grants it; a policy of the module attached to the role does too.
    wild = mutate(files, "infra/modules/serve/main.tf", '"bedrock:InvokeModel", ', '"bedrock:*", ')
    assert findings_of(wild) == []
    start = serve.index('resource "aws_iam_role_policy" "api_model"')
    attached = (
        serve[:start]
        + serve[start:]
        .replace('"aws_iam_role_policy" "api_model"', '"aws_iam_policy" "model"', 1)
        .replace("  role = aws_iam_role.api.id\n", "", 1)
        + '\nresource "aws_iam_role_policy_attachment" "model" {\n'
        "  role       = aws_iam_role.api.name\n  policy_arn = aws_iam_policy.model.arn\n}\n"
    )
    assert findings_of({**files, "infra/modules/serve/main.tf": attached}) == []


def test_a_runtime_whose_code_makes_no_checked_call_needs_nothing() -> None:
    """hipaa_one_region's serving function answers without Bedrock: no policy needed."""
    files = tree("hipaa_one_region")
    assert "converse" not in files["services/serve/handler.py"]
    assert "bedrock" not in files["infra/modules/serve/main.tf"]
    assert findings_of(files) == []


# --------------------------------------------------------------------------------- images

MSK = "streaming_features"


def test_a_push_to_a_repository_nothing_declares_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MSK ingest image put in ECR_IMAGES (CI then pushes it) without a repository or
    a runtime in the Terraform: the push fails, and nothing would run it."""
    from activities.design import app

    assert "ingest:msk-kafka" not in app.ECR_IMAGES
    assert "services/ingest/Dockerfile" not in tree(MSK)  # nothing runs it: not built
    monkeypatch.setitem(app.ECR_IMAGES, "ingest:msk-kafka", "ingest")
    files = render_request(request_for(MSK))
    found = only(findings_of(files), "images")
    assert [f.file for f in found] == [".github/workflows/ci.yml"]
    assert found[0].message.startswith("CI pushes ")
    assert "/ingest (services/ingest/Dockerfile), which no aws_ecr_repository of the " in (
        found[0].message
    )
    # The repository declared, still nothing runs it.
    ingest = files["infra/modules/ingest/main.tf"]
    files["infra/modules/ingest/main.tf"] = (
        ingest + '\nresource "aws_ecr_repository" "ingest" {\n'
        '  name = "${var.name_prefix}/ingest"\n}\n'
    )
    (finding,) = only(findings_of(files), "images")
    assert finding.message.endswith(
        "/ingest (services/ingest/Dockerfile), but no task definition, Lambda function, "
        "SageMaker job or model or EMR Serverless application of the Terraform runs it"
    )


def test_every_pushed_image_is_declared_and_run() -> None:
    """What CI pushes in the generated trees is exactly what the Terraform runs."""
    files = tree(MSK)
    assert findings_of(files) == []
    gone = mutate(
        files,
        "infra/modules/transform/main.tf",
        '"${var.name_prefix}/transform"',
        '"${var.name_prefix}/transform-old"',
    )
    text = messages(findings_of(gone))
    assert "/transform (services/transform/Dockerfile), which no aws_ecr_repository" in text
    # ... and the function's image is one no CI pushes (the rule's older half).
    assert "which no CI workflow pushes to" in text


def _step_line(text: str, needle: str) -> int:
    """The 1-based line of the first line of ``text`` that holds ``needle``."""
    return next(i for i, line in enumerate(text.splitlines(), 1) if needle in line)


def test_an_image_ci_builds_that_nothing_uses_fails() -> None:
    """The MSK plans' CI built services/ingest/Dockerfile on every change, and nothing
    pushed or ran it (MSK's consumer is the transform Lambda function): CI now builds
    exactly the images the Terraform runs, and the rule finds the old build again."""
    files = tree(MSK)
    assert findings_of(files) == []
    ci = files[".github/workflows/ci.yml"]
    assert "service: [serve, train, transform]" in ci  # the push job's images, no more
    broken = mutate(
        files,
        ".github/workflows/ci.yml",
        "service: [serve, train, transform]",
        "service: [ingest, serve, train, transform]",
    )
    broken["services/ingest/Dockerfile"] = files["services/train/Dockerfile"]
    (finding,) = only(findings_of(broken), "images")
    line = _step_line(ci, "- name: Build")
    assert finding.file == ".github/workflows/ci.yml"
    assert finding.message == (
        f".github/workflows/ci.yml:{line} (job images, step Build) builds "
        "services/ingest/Dockerfile, which nothing uses: no CI step pushes it or runs it "
        "(docker run), and no task definition, Lambda function, SageMaker job or model, or "
        "compose service runs it"
    )
    # Built to be tested, said so: CI runs the image it built (same job, same tag).
    tested = mutate(
        broken,
        ".github/workflows/ci.yml",
        "          .\n",
        "          .\n      - name: Try the image\n        run: >-\n"
        "          docker run --rm\n"
        "          ${{ github.event.repository.name }}-${{ matrix.service }}:${{ github.sha }}\n"
        "          --help\n",
    )
    assert only(findings_of(tested), "images")  # another image name: still unused
    tag = ci.splitlines()[_step_line(ci, "--tag ") - 1].strip().removeprefix("--tag ")
    assert tag.endswith("-${{ matrix.service }}:${{ github.sha }}")
    tested = mutate(
        broken,
        ".github/workflows/ci.yml",
        "          .\n",
        f"          .\n      - name: Try the image\n        run: docker run --rm {tag} --help\n",
    )
    assert findings_of(tested) == []
    # Pushed by a build-push-action step of its own job: used.
    pushed = mutate(
        broken,
        ".github/workflows/ci.yml",
        "          .\n",
        "          .\n      - uses: docker/build-push-action@v6\n        with:\n"
        "          file: services/ingest/Dockerfile\n          push: true\n"
        "          tags: ghcr.io/example/ingest:latest\n",
    )
    assert findings_of(pushed) == []


def test_a_compose_service_uses_the_image_it_builds() -> None:
    """An image CI builds that a compose file builds and runs is used (locally)."""
    files = mutate(
        tree(MSK),
        ".github/workflows/ci.yml",
        "service: [serve, train, transform]",
        "service: [ingest, serve, train, transform]",
    )
    files["services/ingest/Dockerfile"] = files["services/train/Dockerfile"]
    assert only(findings_of(files), "images")
    files["docker-compose.yml"] = (
        "services:\n  ingest:\n    build:\n      context: .\n"
        "      dockerfile: services/ingest/Dockerfile\n"
        "    environment:\n      DATA_URI: /data\n"
    )
    assert [f for f in findings_of(files) if f.rule == "images"] == []


def test_the_mlflow_server_runs_the_clients_mlflow_version() -> None:
    """The tracking server's image pinned mlflow==2.16.2 while the code, its clients,
    pinned mlflow-skinny 3.x: both now come from one version, and a drift fails."""
    from activities.design.app import MLFLOW_VERSION

    files = tree("rag")
    dockerfile = files["services/mlflow/Dockerfile"]
    assert f"pip install --no-cache-dir mlflow=={MLFLOW_VERSION} " in dockerfile
    assert f"mlflow-skinny=={MLFLOW_VERSION}" in files["requirements.txt"].splitlines()
    assert findings_of(files) == []
    broken = mutate(
        files, "services/mlflow/Dockerfile", f"mlflow=={MLFLOW_VERSION}", "mlflow==2.16.2"
    )
    (finding,) = only(findings_of(broken), "images")
    line = _step_line(dockerfile, "pip install")
    req_line = files["requirements.txt"].splitlines().index(f"mlflow-skinny=={MLFLOW_VERSION}") + 1
    assert finding.file == "services/mlflow/Dockerfile"
    assert finding.message == (
        f"services/mlflow/Dockerfile:{line} installs mlflow==2.16.2, but requirements.txt:"
        f"{req_line} pins mlflow-skinny=={MLFLOW_VERSION}: the image and the code run "
        "different versions of mlflow"
    )
    # Another package pinned apart from the requirements is found the same way.
    boto = next(r for r in files["requirements.txt"].splitlines() if r.startswith("boto3=="))
    drift = mutate(files, "services/mlflow/Dockerfile", boto, "boto3==1.0.0")
    (finding,) = only(findings_of(drift), "images")
    assert "installs boto3==1.0.0, but requirements.txt:1 pins " + boto in finding.message


# -------------------------------------------------------------------------------- objects


def test_a_model_archive_nothing_writes_fails() -> None:
    """The batch transform read registry/latest/model.tar.gz from the scoring bucket, and
    only the smoke wrote it: promotion now publishes it under DATA_URI, where the
    schedule points."""
    files = tree(BATCH)
    serve = files["infra/modules/serve/main.tf"]
    url = 's3://${split(":::", var.model_bucket_arns[0])[1]}/pipeline/registry/latest/model.tar.gz'
    assert f'model_data_url = "{url}"' in serve
    assert "store.write_bytes(MODEL_ARCHIVE," in files["services/common/registry.py"]
    assert findings_of(files) == []
    old = "s3://${aws_s3_bucket.scoring.id}/registry/latest/model.tar.gz"
    broken = mutate(files, "infra/modules/serve/main.tf", url, old)
    (finding,) = only(findings_of(broken), "objects")
    line = _step_line(broken["infra/modules/serve/main.tf"], old)
    assert finding.file == "infra/modules/serve/main.tf"
    assert finding.message.startswith(
        f"infra/modules/serve/main.tf:{line} hands model_data_url {old}, which nothing in "
        "the design writes: no code a runtime runs writes it under a DATA_URI the "
        "Terraform gives (prefixes: pipeline; keys the code writes: "
    )
    # The code no longer publishing it: the same finding at the schedule's URL.
    unpublished = mutate(
        files,
        "services/common/registry.py",
        "    store.write_bytes(MODEL_ARCHIVE, model_archive(store, version))\n",
        "",
    )
    (finding,) = only(findings_of(unpublished), "objects")
    assert f"hands model_data_url {url}, which nothing in the design writes" in finding.message
    # An object the Terraform uploads is written.
    uploaded = {
        **broken,
        "infra/modules/serve/seed.tf": 'resource "aws_s3_object" "model" {\n'
        "  bucket = aws_s3_bucket.scoring.id\n"
        '  key    = "registry/latest/model.tar.gz"\n'
        '  source = "${path.module}/model.tar.gz"\n}\n',
    }
    assert findings_of(uploaded) == []


def test_the_sagemaker_packages_archive_is_the_one_the_state_machine_publishes() -> None:
    """SageMaker training plans: the model package's ModelDataUrl is the archive the
    training state machine copies the job's model.tar.gz to (under DATA_URI)."""
    files = tree(MSK)
    assert findings_of(files) == []
    train = files["infra/modules/train/main.tf"]
    url = "s3://${aws_s3_bucket.models.id}/pipeline/registry/latest/model.tar.gz"
    assert f'ModelDataUrl = "{url}"' in train
    assert 'Key                  = "pipeline/registry/latest/model.tar.gz"' in train
    broken = mutate(
        files,
        "infra/modules/train/main.tf",
        'Key                  = "pipeline/registry/latest/model.tar.gz"',
        'Key                  = "registry/latest/model.tar.gz"',
    )
    (finding,) = only(findings_of(broken), "objects")
    assert finding.message.startswith(
        f"infra/modules/train/main.tf:{_step_line(train, 'ModelDataUrl = ')} hands "
        f"ModelDataUrl {url}, which nothing in the design writes"
    )


# ------------------------------------------------------------- SageMaker package registration


@pytest.mark.parametrize("name", [MSK, "streaming_only_three_regions"])
def test_the_training_state_machine_registers_with_a_role_allowed_to(name: str) -> None:
    """The SageMaker training job runs network-isolated and its role had no
    sagemaker:CreateModelPackage, so promotion's boto3 registration inside it could not
    work: the state machine publishes the job's archive and registers it after the job,
    as the orchestrator role, which must be allowed to."""
    files = tree(name)
    train = files["infra/modules/train/main.tf"]
    assert 'Resource = "arn:aws:states:::aws-sdk:sagemaker:createModelPackage"' in train
    assert 'Resource = "arn:aws:states:::aws-sdk:s3:copyObject"' in train
    assert "create_model_package" not in files["services/common/registry.py"]
    assert "MODEL_PACKAGE_GROUP" not in train  # the job reads nothing of the registry
    assert findings_of(files) == []
    broken = mutate(
        files,
        "infra/modules/train/main.tf",
        '["sagemaker:CreateModelPackage", "sagemaker:AddTags"]',
        '["sagemaker:AddTags"]',
    )
    (finding,) = only(findings_of(broken), "permissions")
    assert finding.file == "infra/modules/train/main.tf"
    assert finding.message == (
        "aws_sfn_state_machine.train calls sagemaker:CreateModelPackage (a Task state's "
        "arn:aws:states:::aws-sdk:sagemaker:createModelPackage), which its role "
        "(aws_iam_role.orchestrator) is not allowed: no policy of the module grants it"
    )
    # The copy needs both halves of S3's CopyObject.
    unread = mutate(
        files, "infra/modules/train/main.tf", '["s3:GetObject", "s3:PutObject"]', '"s3:PutObject"'
    )
    (finding,) = only(findings_of(unread), "permissions")
    assert finding.message.startswith("aws_sfn_state_machine.train calls s3:GetObject (")


@pytest.mark.parametrize("name", [MSK, "streaming_only_three_regions"])
def test_the_sagemaker_training_job_runs_the_container_contract(name: str) -> None:
    """The job ran ``python -m services.train`` against DATA_URI, which network isolation
    keeps it from reaching: now its environment names the contract's folders, the entry
    trains from the train channel and writes the model folder SageMaker uploads as
    model.tar.gz (the archive Publish copies), and the channel is a fixed prefix under
    DATA_URI, not an input of the schedule."""
    files = tree(name)
    train = files["infra/modules/train/main.tf"]
    assert 'SM_CHANNEL_TRAIN = "/opt/ml/input/data/train"' in train
    assert 'SM_MODEL_DIR     = "/opt/ml/model"' in train
    assert 'ChannelName = "train"' in train
    assert (
        'S3Uri                  = "s3://${aws_s3_bucket.models.id}/pipeline/training-sets/latest/"'
        in train
    )
    assert 'DATA_URI         = "s3://${aws_s3_bucket.models.id}/pipeline"' in train
    assert "training_data_uri" not in train and "S3Uri.$" not in train
    assert "/output/{}/output/model.tar.gz" in train
    entry = files["services/train/__main__.py"]
    for needle in (
        'os.environ.get("SM_CHANNEL_TRAIN")',
        'os.environ.get("SM_MODEL_DIR")',
        "--sagemaker",
    ):
        assert needle in entry
    assert (
        "test_the_sagemaker_training_entry_follows_the_container_contract"
        in files["tests/test_train.py"]
    )
    assert findings_of(files) == []
    # Plans without SageMaker training keep the plain entry.
    assert "SM_CHANNEL_TRAIN" not in tree(BATCH)["services/train/__main__.py"]


def test_a_training_job_that_registers_in_code_needs_the_action_on_its_role() -> None:
    """The old promotion: boto3's create_model_package inside the SageMaker training job,
    whose role (aws_iam_role.training) no policy allows it."""
    files = tree(MSK)
    registry = files["services/common/registry.py"]
    broken = {
        **files,
        "services/common/registry.py": registry
        + "\n\ndef _register(group: str, image: str, url: str) -> None:\n"
        "    import boto3\n\n"
        '    client = boto3.client("sagemaker")\n'
        "    client.create_model_package(\n"
        "        ModelPackageGroupName=group,\n"
        '        InferenceSpecification={"Containers": [{"Image": image, "ModelDataUrl": url}]},\n'
        "    )\n",
    }
    line = len(registry.splitlines()) + 7
    found = only(findings_of(broken), "permissions")
    training = [f for f in found if "aws_iam_role.training" in f.message]
    assert [f.message for f in training] == [
        "aws_sfn_state_machine.train calls sagemaker:CreateModelPackage "
        f"(services/common/registry.py:{line}), which its role (aws_iam_role.training) is "
        "not allowed: no policy of the module grants it"
    ]


# ------------------------------------------------------------------ batch transform content


@pytest.mark.parametrize("name", [BATCH, "streaming_only_three_regions"])
def test_the_batch_transform_sends_what_the_model_reads(name: str) -> None:
    """The transform sent text/csv to an /invocations that reads JSON lines: now both say
    application/jsonlines, and the code refuses other types (415) rather than misread."""
    files = tree(name)
    serve = files["infra/modules/serve/main.tf"]
    assert 'ContentType = "application/jsonlines"' in serve
    assert 'Accept = "application/jsonlines"' in serve
    assert 'INVOCATIONS_CONTENT_TYPE = "application/jsonlines"' in files["services/serve/app.py"]
    assert findings_of(files) == []
    broken = mutate(
        files,
        "infra/modules/serve/main.tf",
        'ContentType = "application/jsonlines"',
        'ContentType = "text/csv"',
    )
    (finding,) = only(findings_of(broken), "images")
    assert finding.file == "infra/modules/serve/main.tf"
    assert finding.message == (
        "aws_sfn_state_machine.score's batch transform ContentType is text/csv, which the "
        "model's code never names (it names: application/jsonlines): /invocations would "
        "get what it does not read"
    )


@functools.cache
def _ecs_training_with_packages() -> tuple[tuple[str, str], ...]:
    """streaming_features' plan with ECS training: SageMaker model packages
    (govern:model-registry-config) registered by code, not by a state machine."""
    req = with_patterns(request_for(MSK), "train:ecs-fargate-jobs")
    return tuple(render_request(req).items())


def test_ecs_training_registers_packages_with_a_role_allowed_to() -> None:
    """ECS training registers in code (services/train/package.py), which only the
    training imports: its task role may create model packages, serving needs nothing."""
    files = dict(_ecs_training_with_packages())
    assert "create_model_package" in files["services/train/package.py"]
    assert "create_model_package" not in files["services/common/registry.py"]
    assert "MODEL_PACKAGE_GROUP" not in files["infra/modules/serve/main.tf"]
    assert findings_of(files) == []
    broken = mutate(
        files,
        "infra/modules/train/main.tf",
        '["sagemaker:CreateModelPackage", "sagemaker:CreateModelPackageGroup",',
        '["sagemaker:CreateModelPackageGroup",',
    )
    (finding,) = only(findings_of(broken), "permissions")
    assert finding.message.startswith(
        "aws_ecs_task_definition.train calls sagemaker:CreateModelPackage "
        "(services/train/package.py:"
    )
    assert finding.message.endswith(
        "which its role (aws_iam_role.task) is not allowed: no policy of the module grants it"
    )
