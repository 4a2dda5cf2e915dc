"""The drift check deployed (issue 38 §1): ``services.observe`` runs daily on the ECS
training task (an EventBridge Scheduler target overriding its command), or with SageMaker
training as a processing job on the training image (a state machine the schedule starts,
the entry point overridden), and the wiring
rules follow that scheduled task: its environment, its role's permission to put the
metric, and the drift alarm, whose metric must be put by code something deployed runs.
Mutation tests: the generated tree passes, each broken copy fails naming why."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from activities.design.codegen import render_request
from keel.design.wiring import check_wiring
from tests.design.codegen_cases import request_for_form, with_patterns
from tests.design.unit.test_wiring import BATCH, mutate, only, tree
from tests.support.hcl import parse_once

TRAIN = "infra/modules/train/main.tf"
OBSERVE = "infra/modules/observe/main.tf"
COMMAND = 'command = ["python", "-m", "services.observe"]'


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    with parse_once():
        yield


def test_the_training_task_runs_the_drift_check_daily() -> None:
    files = tree(BATCH)
    assert check_wiring(files) == []
    train = files[TRAIN]
    assert 'resource "aws_scheduler_schedule" "observe"' in train
    assert COMMAND in train
    assert '"cloudwatch:namespace" = "batch-training/monitoring"' in train
    # The override replaces the image's command: ECS training has no entry point.
    dockerfile = files["services/train/Dockerfile"]
    assert 'CMD ["python", "-m", "services.train"]' in dockerfile
    assert "ENTRYPOINT" not in dockerfile
    assert 'metric_name         = "max_feature_psi"' in files[OBSERVE]
    # The date is optional: the schedule passes none (yesterday, UTC).
    assert 'nargs="?"' in files["services/observe/__main__.py"]


def test_a_drift_alarm_nothing_deployed_feeds_fails() -> None:
    """The state before: services/observe/drift.py put the metric, nothing ran it. (Not
    batch_training: its batch transform's entry imports the whole local pipeline.)"""
    files = tree("online_serving_slo")
    assert check_wiring(files) == []
    files = mutate(files, TRAIN, COMMAND, 'command = ["python", "-m", "services.train"]')
    (finding,) = only(check_wiring(files), "alarms")
    assert finding.file == OBSERVE
    assert finding.message == (
        "aws_cloudwatch_metric_alarm.drift watches online-serving-slo/monitoring max_feature_psi, "
        "which nothing deployed emits: services/observe/drift.py puts it, but no runtime of "
        "the Terraform (task, scheduled task, function, SageMaker job or model, script job) "
        "runs that code"
    )


def test_the_scheduled_drift_check_without_the_metric_permission_fails() -> None:
    files = mutate(
        tree(BATCH),
        TRAIN,
        'Action    = "cloudwatch:PutMetricData"',
        'Action    = "cloudwatch:GetMetricData"',
    )
    (finding,) = only(check_wiring(files), "permissions")
    assert finding.file == TRAIN
    assert finding.message.startswith(
        "aws_scheduler_schedule.observe calls cloudwatch:PutMetricData (services/observe/drift.py:"
    )
    assert finding.message.endswith(
        "which its role (aws_iam_role.task) is not allowed: no policy of the module grants it"
    )


def test_the_scheduled_drift_check_gets_its_task_environment() -> None:
    """The schedule runs observe with the task definition's environment: a variable the
    task definition does not set is reported once, there; one only the override would
    need is the schedule's."""
    files = mutate(
        tree(BATCH),
        TRAIN,
        '{ name = "DATA_URI", value = "s3://${aws_s3_bucket.models.id}/pipeline" }',
        '{ name = "DATA_PATH", value = "s3://${aws_s3_bucket.models.id}/pipeline" }',
    )
    (finding,) = only(check_wiring(files), "environment")
    assert finding.message.startswith("aws_ecs_task_definition.train runs services/train/")
    assert "reads DATA_URI" in finding.message
    observe = mutate(
        tree(BATCH),
        "services/observe/__main__.py",
        "    settings = load()\n",
        '    settings = load()\n    os.environ["DRIFT_TOPIC"]\n',
    )
    observe = mutate(
        observe, "services/observe/__main__.py", "import json\n", "import json\nimport os\n"
    )
    (finding,) = only(check_wiring(observe), "environment")
    assert finding.file == TRAIN
    assert finding.message.startswith(
        "aws_scheduler_schedule.observe runs services/observe/__init__.py and "
        "services/observe/__main__.py (services/train/Dockerfile), which reads DRIFT_TOPIC "
        "(services/observe/__main__.py:"
    )


ENTRY = 'ContainerEntrypoint = ["python", "-m", "services.observe"]'


def test_sagemaker_training_runs_the_drift_check_as_a_processing_job() -> None:
    """SageMaker training that publishes its model (the SageMaker registry): a daily
    schedule starts a state machine whose processing job runs services.observe on the
    training image (entry point overridden), reading the published archive and the
    training set; the observe module alarms on drift and on failed training runs."""
    files = tree("streaming_only_three_regions")
    assert check_wiring(files) == []
    train = files[TRAIN]
    assert 'resource "aws_sfn_state_machine" "observe"' in train
    assert '"arn:aws:states:::sagemaker:createProcessingJob.sync"' in train
    assert ENTRY in train
    assert "arn      = aws_sfn_state_machine.observe.arn" in train
    assert '"cloudwatch:namespace" = "streaming-only-three-regions/monitoring"' in train
    # SageMaker starts the training image with `train`: it keeps its entry point.
    dockerfile = files["services/train/Dockerfile"]
    assert 'ENTRYPOINT ["python", "-m", "services.train"]' in dockerfile
    observe = files[OBSERVE]
    assert 'resource "aws_cloudwatch_metric_alarm" "drift"' in observe
    assert 'resource "aws_cloudwatch_metric_alarm" "training_failed"' in observe
    assert "def published(" in files["services/observe/__main__.py"]
    assert (
        "def test_the_deployed_check_reads_what_sagemaker_training_publishes"
        in (files["tests/test_observe.py"])
    )

    # The processing job running the training's entry point instead: it reads what only
    # training sets. (The alarms rule cannot tell here: the batch transform's entry
    # imports the whole local pipeline, drift.py with it; see the online_serving_slo test.)
    back = mutate(files, TRAIN, ENTRY, 'ContainerEntrypoint = ["python", "-m", "services.train"]')
    found = only(check_wiring(back), "environment")
    assert sorted(f.message.split(", which reads ")[1].split(" ")[0] for f in found) == [
        "SM_CHANNEL_TRAIN",
        "SM_MODEL_DIR",
    ]
    assert all(
        f.message.startswith("aws_sfn_state_machine.observe runs services/train/") for f in found
    )


def test_without_a_drift_runner_the_alarm_watches_failed_training() -> None:
    """SageMaker training registered in MLflow publishes no archive under DATA_URI, so
    nothing deployed runs services.observe: the observe module has no drift alarm (its
    metric would come from nothing); its alarm watches the training state machine's
    failed runs, a metric AWS emits. (The planner no longer makes this pair, and the
    wiring fails it: the isolated training job cannot reach MLflow; rendered here
    directly for the alarm.)"""
    req = with_patterns(request_for_form("streaming_only_three_regions"), "govern:mlflow-registry")
    assert "train:sagemaker-training" in req.plan.pattern_ids()
    files = render_request(req)
    (isolated,) = only(check_wiring(files), "environment")
    assert isolated.file == TRAIN
    assert isolated.message.startswith("aws_sfn_state_machine.train runs services/train/")
    assert isolated.message.endswith(
        "network-isolated (EnableNetworkIsolation), and it reads MLFLOW_TRACKING_URI "
        "(services/common/settings.py:91), the address of a service it cannot reach from there"
    )
    # Unset, the registry code raises without it: the pair cannot work either way.
    unset = mutate(files, TRAIN, "MLFLOW_TRACKING_URI = var.mlflow_tracking_uri", "")
    (missing,) = only(check_wiring(unset), "environment")
    assert "reads MLFLOW_TRACKING_URI" in missing.message and "raises without it" in (
        missing.message
    )
    assert 'resource "aws_scheduler_schedule" "observe"' not in files[TRAIN]
    assert 'resource "aws_sfn_state_machine" "observe"' not in files[TRAIN]
    observe = files[OBSERVE]
    assert 'resource "aws_cloudwatch_metric_alarm" "drift"' not in observe
    assert 'resource "aws_cloudwatch_metric_alarm" "training_failed"' in observe
    assert "dimensions          = { StateMachineArn = var.training_state_machine_arn }" in observe
    assert (
        "training_state_machine_arn = module.train_us_east_1.state_machine_arn"
        in (files["infra/main.tf"])
    )
    # The alarm on a namespace no resource of the design emits in is still found.
    files = mutate(files, OBSERVE, '"AWS/States"', '"AWS/Batch"')
    (finding,) = [f for f in check_wiring(files) if f.rule == "alarms"]
    assert "aws_cloudwatch_metric_alarm.training_failed watches AWS/Batch" in finding.message
