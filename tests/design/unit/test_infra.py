"""The generated Terraform (activities/design/infra.py): every catalogue pattern renders
real resources that parse, in every region, with sizes taken from the cost estimate."""

from __future__ import annotations

import functools
import json
import math
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hcl2
import pytest

from activities.design.codegen import CodeGenRequest, render_request
from activities.design.infra import TEMPLATES, pattern_template, render_infra
from keel.design.critics import estimate_plan_cost
from keel.design.diff import cost_line_diff, terraform_diff, terraform_resources
from tests.design.codegen_cases import request_for, request_from, with_patterns
from tests.design.unit.design_data import catalog, golden_cases, prices
from tests.support.hcl import parse_once

#: Resource types each pattern must create: its managed services, not a stand-in.
SERVICES: dict[str, set[str]] = {
    "ingest:s3-batch": {"aws_s3_bucket", "aws_sfn_state_machine", "aws_scheduler_schedule"},
    "ingest:kinesis-streams": {"aws_kinesis_stream", "aws_kinesis_firehose_delivery_stream"},
    "ingest:msk-kafka": {"aws_msk_cluster", "aws_msk_configuration", "aws_security_group"},
    "transform:glue-etl": {"aws_glue_job", "aws_glue_trigger", "aws_glue_security_configuration"},
    "transform:emr-serverless-spark": {"aws_emrserverless_application", "aws_iam_role"},
    "transform:kinesis-lambda": {"aws_lambda_function", "aws_sqs_queue"},
    "store:s3-lakehouse": {"aws_s3_bucket", "aws_glue_catalog_database", "aws_athena_workgroup"},
    "store:dynamodb": {"aws_dynamodb_table", "aws_iam_policy"},
    "store:opensearch-vector": {
        "aws_opensearchserverless_collection",
        "aws_opensearchserverless_security_policy",
        "aws_opensearchserverless_access_policy",
        "aws_opensearchserverless_vpc_endpoint",
    },
    "feature:glue-offline-features": {"aws_glue_job", "aws_glue_catalog_database"},
    "feature:dynamodb-online-features": {"aws_dynamodb_table", "aws_iam_policy"},
    "feature:sagemaker-feature-store": {"aws_sagemaker_feature_group", "aws_s3_bucket"},
    "train:ecs-fargate-jobs": {
        "aws_ecs_cluster",
        "aws_ecs_task_definition",
        "aws_ecr_repository",
        "aws_scheduler_schedule",
    },
    "train:sagemaker-training": {"aws_sfn_state_machine", "aws_ecr_repository"},
    "train:sagemaker-gpu-training": {"aws_sfn_state_machine", "aws_ecr_repository"},
    "serve:sagemaker-batch-transform": {"aws_sfn_state_machine", "aws_scheduler_schedule"},
    "serve:lambda-serverless": {
        "aws_lambda_function",
        "aws_apigatewayv2_api",
        "aws_apigatewayv2_stage",
    },
    "serve:ecs-fargate-fastapi": {
        "aws_ecs_service",
        "aws_lb",
        "aws_lb_listener",
        "aws_wafv2_web_acl",
        "aws_appautoscaling_policy",
    },
    "observe:cloudwatch": {"aws_cloudwatch_dashboard", "aws_cloudwatch_metric_alarm"},
    "observe:amp-grafana": {"aws_prometheus_workspace", "aws_grafana_workspace"},
    "observe:sagemaker-model-monitor": {
        "aws_sagemaker_data_quality_job_definition",
        "aws_sagemaker_monitoring_schedule",
    },
    "govern:lake-formation-cloudtrail": {"aws_cloudtrail", "aws_lakeformation_resource"},
    "govern:model-registry-config": {"aws_sagemaker_model_package_group", "aws_cloudtrail"},
    "govern:mlflow-registry": {"aws_ecs_service", "aws_efs_file_system", "aws_s3_bucket"},
}
#: What a pattern adds when the design owns the account's baseline (issue 38 §3): the
#: account's one-per-region settings and what needs them.
BASELINE_SERVICES: dict[str, set[str]] = {
    "govern:lake-formation-cloudtrail": {"aws_lakeformation_data_lake_settings"},
    "govern:model-registry-config": {
        "aws_config_configuration_recorder",
        "aws_config_delivery_channel",
        "aws_config_config_rule",
        "aws_macie2_account",
        "aws_macie2_classification_job",
    },
}
ALL_PATTERNS = sorted(catalog().by_id())
THREE = ["us-east-1", "eu-west-1", "ap-northeast-1"]


@pytest.fixture(scope="module", autouse=True)
def _hcl_parsed_once() -> Iterator[None]:
    """The 48 renders share all modules but the one under test: each distinct text is
    parsed once (``terraform_resources`` re-reads every file of each tree)."""
    with parse_once():
        yield


def test_every_catalogue_pattern_has_a_template_and_expectations() -> None:
    assert len(ALL_PATTERNS) == 24
    assert set(ALL_PATTERNS) == set(SERVICES)
    for pid in ALL_PATTERNS:
        assert (TEMPLATES / pattern_template(pid)).is_file(), pid


def _with(req: CodeGenRequest, pattern_id: str, regions: list[str]) -> CodeGenRequest:
    """``req`` with ``pattern_id`` chosen for its capability, in ``regions``, and the cost
    estimated again for that plan."""
    plan = with_patterns(req, pattern_id).plan.model_copy(update={"regions": regions})
    constraints = req.constraints.model_copy(update={"regions": regions})
    cost = estimate_plan_cost(plan, catalog(), constraints, prices())
    return req.model_copy(update={"plan": plan, "constraints": constraints, "cost": cost})


@functools.cache
def _parse(text: str) -> dict[str, Any]:
    """hcl2's parse (cached: the modules other than the one under test repeat)."""
    doc: dict[str, Any] = hcl2.loads(text)
    return doc


def _resources(text: str) -> list[tuple[str, str]]:
    doc = _parse(text)
    return [(rtype, name) for block in doc.get("resource", []) for rtype, v in block.items()
            for name in v]  # fmt: skip


@pytest.mark.parametrize("regions", [["eu-west-1"], THREE], ids=["1-region", "3-regions"])
@pytest.mark.parametrize("pattern_id", ALL_PATTERNS)
def test_pattern_renders_its_services_in_every_region(pattern_id: str, regions: list[str]) -> None:
    req = _with(request_for("streaming_features"), pattern_id, regions)
    files = render_infra(req)
    cap = pattern_id.split(":", 1)[0]
    for path, text in files.items():
        if path.endswith(".tf"):
            _parse(text)  # raises on a parse error
        assert "placeholder" not in text.lower(), path
        assert "aws_ssm_parameter" not in text, path
    for name in ("main.tf", "variables.tf", "outputs.tf"):
        assert f"infra/modules/{cap}/{name}" in files
    types = {t for t, _ in _resources(files[f"infra/modules/{cap}/main.tf"])}
    assert SERVICES[pattern_id] <= types, SERVICES[pattern_id] - types
    assert {"aws_kms_key", "aws_cloudwatch_log_group"} <= types
    assert pattern_id in files[f"infra/modules/{cap}/main.tf"]
    # The root: one provider per region, every capability instantiated in each.
    root = hcl2.loads(files["infra/main.tf"])
    instances = {name for block in root["module"] for name in block}
    providers = hcl2.loads(files["infra/providers.tf"])["provider"]
    assert sorted(p["aws"]["region"] for p in providers) == sorted(regions)
    for region in regions:
        rid = region.replace("-", "_")
        assert f"foundation_{rid}" in instances
        for choice in req.plan.choices:
            assert f"{choice.capability.value}_{rid}" in instances
    resources = terraform_resources(files)
    assert {r.region for r, _ in resources.values()} == set(regions)
    backend = hcl2.loads(files["infra/backend.tf"])["terraform"][0]["backend"][0]["s3"]
    assert backend["encrypt"] is True and backend["dynamodb_table"]


def test_rendering_is_deterministic_and_codegen_ships_it() -> None:
    req = request_for("rag")
    assert render_infra(req) == render_infra(req)
    repo = render_request(req)
    for path, text in render_infra(req).items():
        assert repo[path] == text
    assert not any(p.startswith("infra/") and p not in render_infra(req) for p in repo)


def _root_args(files: dict[str, str], instance: str) -> dict[str, object]:
    for block in hcl2.loads(files["infra/main.tf"])["module"]:
        if instance in block:
            args: dict[str, object] = block[instance]
            return args
    raise AssertionError(instance)


def _workload(req: CodeGenRequest, name: str) -> float:
    return next(v.value for v in req.cost.workload if v.name == name)


def test_sizes_are_the_cost_estimates_numbers() -> None:
    form = dict(golden_cases()["streaming_features"]["constraints"])
    form.update(regions=["us-east-1", "us-west-2"], throughput={"data_gb_per_day": 4000})
    msk = _with(request_from(form, "sizes"), "ingest:msk-kafka", form["regions"])
    files = render_infra(msk)
    for region in ("us_east_1", "us_west_2"):
        args = _root_args(files, f"ingest_{region}")
        assert args["broker_count"] == math.ceil(_workload(msk, "msk_brokers"))
        storage = next(
            ln.quantity
            for ln in msk.cost.breakdown
            if ln.service == "msk_storage" and ln.region == region.replace("_", "-")
        )
        assert storage is not None
        assert args["broker_volume_gb"] == max(10, math.ceil(storage / int(args["broker_count"])))  # type: ignore[call-overload]
    kinesis = _with(msk, "ingest:kinesis-streams", form["regions"])
    args = _root_args(render_infra(kinesis), "ingest_us_east_1")
    assert args["shard_count"] == _workload(kinesis, "kinesis_shards") > 1
    serve = _with(request_for("online_serving_slo"), "serve:ecs-fargate-fastapi", ["us-east-1"])
    args = _root_args(render_infra(serve), "serve_us_east_1")
    assert args["desired_count"] == _workload(serve, "serve_tasks")
    assert args["task_cpu"] == 1024 * _workload(serve, "serve_task_vcpu")


def test_more_data_means_more_shards_and_a_diff_naming_them() -> None:
    form = dict(golden_cases()["streaming_features"]["constraints"])
    form.update(throughput={"data_gb_per_day": 500}, regions=["us-east-1"])
    small = _with(request_from(form, "diff"), "ingest:kinesis-streams", ["us-east-1"])
    form10 = {
        **form,
        "throughput": {"data_gb_per_day": 5000},
        "regions": ["us-east-1", "eu-west-1"],
    }
    big = _with(request_from(form10, "diff"), "ingest:kinesis-streams", form10["regions"])
    d = terraform_diff(render_infra(small), render_infra(big))
    changed = {r.address for r in d.changed}
    assert "module.ingest_us_east_1.aws_kinesis_stream.events" in changed
    assert {r.region for r in d.added} == {"eu-west-1"}
    assert "module.ingest_eu_west_1.aws_kinesis_stream.events" in {r.address for r in d.added}
    assert not d.removed
    lines = cost_line_diff(
        [ln.model_dump(mode="json") for ln in small.cost.breakdown],
        [ln.model_dump(mode="json") for ln in big.cost.breakdown],
    )
    shards = {(c.region): c for c in lines if c.resource == "kinesis_shard"}
    assert shards["us-east-1"].new_quantity > shards["us-east-1"].old_quantity  # type: ignore[operator]
    assert shards["eu-west-1"].old_usd is None and shards["eu-west-1"].new_usd
    assert terraform_diff(render_infra(small), render_infra(small)).empty


def test_unknown_pattern_gets_key_and_logs_only() -> None:
    req = _with(request_for("rag"), "store:made-up", ["eu-central-1"])
    files = render_infra(req)
    types = {t for t, _ in _resources(files["infra/modules/store/main.tf"])}
    assert types == {"aws_kms_key", "aws_kms_alias", "aws_cloudwatch_log_group"}
    assert "is not in Keel's template set" in files["infra/modules/store/main.tf"]


@pytest.mark.skipif(shutil.which("terraform") is None, reason="terraform is not installed")
@pytest.mark.parametrize("case", ["batch_training", "streaming_features", "rag"])
def test_terraform_fmt_finds_nothing_to_change(case: str, tmp_path: Path) -> None:
    """A developer check where terraform is installed (CI has none): the tree is as
    ``terraform fmt`` would write it."""
    for path, text in render_infra(request_for(case)).items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    out = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(tmp_path / "infra")],
        capture_output=True,
        text=True,
        timeout=60,
        env={"TF_CLI_CONFIG_FILE": "/dev/null", "PATH": "/usr/local/bin:/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stdout[-3000:]


def test_names_fit_aws_limits() -> None:
    """Bucket prefixes (37), collection names (32) for the longest region name."""
    req = _with(request_for("rag"), "store:opensearch-vector", ["ap-southeast-2"])
    req = req.model_copy(update={"project": "a-very-long-project-name-indeed"})
    files = render_infra(req)
    main = files["infra/main.tf"]
    prefix = re.search(r'name_prefix\s+= "([^"]+)"', main)
    assert prefix is not None
    assert len(prefix.group(1)[:24] + "-landing-") <= 37
    assert len(prefix.group(1) + "-vec") <= 32


#: Where a machine keeps provider plugins for offline ``terraform init`` (CI has none).
PLUGIN_DIR = Path(os.environ.get("KEEL_TF_PLUGIN_DIR", "/opt/tf-plugins"))
#: Three plans that together choose each of the 24 patterns once.
COVERING_PLANS = {
    "A": "ingest:s3-batch transform:glue-etl store:s3-lakehouse feature:glue-offline-features "
    "train:ecs-fargate-jobs serve:sagemaker-batch-transform observe:sagemaker-model-monitor "
    "govern:lake-formation-cloudtrail",
    "B": "ingest:kinesis-streams transform:kinesis-lambda store:dynamodb "
    "feature:dynamodb-online-features train:sagemaker-training serve:lambda-serverless "
    "observe:cloudwatch govern:model-registry-config",
    "C": "ingest:msk-kafka transform:emr-serverless-spark store:opensearch-vector "
    "feature:sagemaker-feature-store train:sagemaker-gpu-training serve:ecs-fargate-fastapi "
    "observe:amp-grafana govern:mlflow-registry",
}


def test_covering_plans_cover_the_catalogue() -> None:
    chosen = [p for ids in COVERING_PLANS.values() for p in ids.split()]
    assert sorted(chosen) == ALL_PATTERNS


@pytest.mark.skipif(
    shutil.which("terraform") is None or not PLUGIN_DIR.is_dir(),
    reason="terraform or its offline provider plugins (KEEL_TF_PLUGIN_DIR) are not installed",
)
@pytest.mark.parametrize("baseline", [False, True], ids=["no-baseline", "baseline"])
@pytest.mark.parametrize("plan", sorted(COVERING_PLANS))
def test_terraform_validate_accepts_every_pattern(
    plan: str, baseline: bool, tmp_path: Path
) -> None:
    """A developer check where terraform and the aws provider are installed offline: the
    provider's schema accepts every resource and argument (two regions), with and without
    the account's baseline."""
    req = request_for("streaming_features")
    for pid in COVERING_PLANS[plan].split():
        req = _with(req, pid, ["us-east-1", "eu-west-1"])
    constraints = req.constraints.model_copy(update={"account_baseline": baseline})
    req = req.model_copy(update={"constraints": constraints})
    for path, text in render_infra(req).items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    env = {
        "TF_CLI_CONFIG_FILE": "/dev/null",
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
    }
    root = tmp_path / "infra"
    init = subprocess.run(
        ["terraform", "init", "-backend=false", f"-plugin-dir={PLUGIN_DIR}", "-input=false"],
        cwd=root, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert init.returncode == 0, init.stdout[-2000:] + init.stderr[-2000:]
    check = subprocess.run(
        ["terraform", "validate", "-json", "-no-color"],
        cwd=root, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    result = json.loads(check.stdout)
    assert result["valid"] and result["warning_count"] == 0, result["diagnostics"]
