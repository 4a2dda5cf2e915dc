"""Deployable into a real account (issue 38 §3): no account-wide singleton unless the
design asks for the account's baseline, and every name unique per project and within its
service's length limit.

The trees come from the template renderer (pure); the plans are test_infra's three
covering plans, which together choose each of the 24 catalogue patterns once.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import hcl2
import pytest

from activities.design.codegen import CodeGenRequest
from activities.design.infra import NAME_PREFIX_MAX, name_prefix, render_infra
from keel.design.constraints import parse_constraints
from keel.design.policy import (
    PolicySettings,
    policy_from_yaml,
    wants_account_baseline,
    with_account_baseline,
)
from keel.design.wiring import ACCOUNT_SINGLETONS
from tests.design.codegen_cases import request_for
from tests.design.unit.test_infra import BASELINE_SERVICES, COVERING_PLANS, _with


@functools.cache
def _covering(plan: str, baseline: bool, project: str = "", regions: str = "") -> CodeGenRequest:
    req = request_for("streaming_features")
    where = regions.split() or ["us-east-1", "eu-west-1"]
    for pid in COVERING_PLANS[plan].split():
        req = _with(req, pid, where)
    constraints = req.constraints.model_copy(update={"account_baseline": baseline or None})
    update: dict[str, Any] = {"constraints": constraints}
    if project:
        update["project"] = project
    return req.model_copy(update=update)


@functools.cache
def _infra(plan: str, baseline: bool, project: str = "", regions: str = "") -> dict[str, str]:
    return render_infra(_covering(plan, baseline, project, regions))


def _resources(files: dict[str, str]) -> dict[str, set[str]]:
    """``{path: resource types}`` of every Terraform file."""
    out: dict[str, set[str]] = {}
    for path, text in files.items():
        if path.endswith(".tf"):
            doc = hcl2.loads(text)
            out[path] = {t for block in doc.get("resource", []) for t in block}
    return out


# ------------------------------------------------------------------------ the flag


def test_the_flag_is_a_constraint_and_a_policy_setting_off_by_default() -> None:
    assert parse_constraints({}).account_baseline is None
    asked = parse_constraints({"account_baseline": True})
    assert asked.account_baseline is True
    assert PolicySettings().account_baseline is False
    org = policy_from_yaml({"version": 1, "policy": {"account_baseline": True}})
    plain = parse_constraints({"regions": ["eu-west-1"]})
    assert not wants_account_baseline(plain, PolicySettings())
    assert not wants_account_baseline(plain, None)
    assert wants_account_baseline(asked, PolicySettings())
    assert wants_account_baseline(plain, org)
    assert with_account_baseline(plain, org).account_baseline is True
    assert with_account_baseline(plain, PolicySettings()) is plain
    # The organisation's policy file in the repository keeps it off.
    import yaml

    from activities.design.infra import TEMPLATES

    shipped = TEMPLATES.parents[1] / "policy.yaml"
    settings = policy_from_yaml(yaml.safe_load(shipped.read_text(encoding="utf-8")))
    assert settings.account_baseline is False


# ------------------------------------------------------------------------ singletons


@pytest.mark.parametrize("plan", sorted(COVERING_PLANS))
def test_no_account_singleton_without_the_baseline(plan: str) -> None:
    """Every pattern, rendered with the flag off: none of the account's one-per-region
    settings anywhere in the tree, and the root says it owns no baseline."""
    files = _infra(plan, False)
    found = {p: t & set(ACCOUNT_SINGLETONS) for p, t in _resources(files).items()}
    assert {p: t for p, t in found.items() if t} == {}
    main = hcl2.loads(files["infra/main.tf"])
    assert main["locals"][0]["account_baseline"] is False
    assert "lake_admin_arns" not in files["infra/variables.tf"]
    # What the audit patterns still create without it: the project's own trail.
    govern = _resources(files)["infra/modules/govern/main.tf"]
    if "govern:mlflow-registry" not in COVERING_PLANS[plan]:
        assert "aws_cloudtrail" in govern


@pytest.mark.parametrize("plan", sorted(COVERING_PLANS))
def test_the_baseline_brings_the_account_settings(plan: str) -> None:
    files = _infra(plan, True)
    types = _resources(files)
    govern_pattern = next(p for p in COVERING_PLANS[plan].split() if p.startswith("govern:"))
    wanted = BASELINE_SERVICES.get(govern_pattern, set())
    assert wanted <= types["infra/modules/govern/main.tf"], wanted
    assert "aws_glue_data_catalog_encryption_settings" in types["infra/modules/foundation/main.tf"]
    main = hcl2.loads(files["infra/main.tf"])
    assert main["locals"][0]["account_baseline"] is True
    outputs = hcl2.loads(files["infra/outputs.tf"])["output"]
    assert any("account_baseline" in o for o in outputs)
    if govern_pattern == "govern:lake-formation-cloudtrail":
        assert 'variable "lake_admin_arns"' in files["infra/variables.tf"]
        assert re.search(r"lake_admin_arns\s+= var\.lake_admin_arns", files["infra/main.tf"])


# ------------------------------------------------------------------------ names

#: The longest a name (or a prefix Terraform adds 26 characters to) may be, by resource
#: type and argument; other names get :data:`DEFAULT_LIMITS`.
LIMITS: dict[tuple[str, str], int] = {
    ("aws_s3_bucket", "bucket_prefix"): 63 - 26,
    ("aws_iam_role", "name_prefix"): 64 - 26,
    ("aws_iam_role", "name"): 64,
    ("aws_iam_policy", "name_prefix"): 128 - 26,
    ("aws_sqs_queue", "name_prefix"): 80 - 26,
    ("aws_lb", "name_prefix"): 6,
    ("aws_lb", "name"): 32,
    ("aws_lb_target_group", "name_prefix"): 6,
    ("aws_lb_target_group", "name"): 32,
    ("aws_lambda_function", "function_name"): 64,
    ("aws_sfn_state_machine", "name"): 80,
    ("aws_scheduler_schedule", "name"): 64,
    ("aws_msk_cluster", "cluster_name"): 64,
    ("aws_msk_configuration", "name"): 64,
    ("aws_sagemaker_model_package_group", "model_package_group_name"): 63,
    ("aws_sagemaker_feature_group", "feature_group_name"): 64,
    ("aws_sagemaker_data_quality_job_definition", "name"): 63,
    ("aws_sagemaker_monitoring_schedule", "name"): 63,
    ("aws_opensearchserverless_collection", "name"): 32,
    ("aws_opensearchserverless_security_policy", "name"): 32,
    ("aws_opensearchserverless_access_policy", "name"): 32,
    ("aws_opensearchserverless_vpc_endpoint", "name"): 32,
    ("aws_emrserverless_application", "name"): 64,
    ("aws_kinesis_firehose_delivery_stream", "name"): 64,
    ("aws_kinesis_stream", "name"): 128,
    ("aws_athena_workgroup", "name"): 128,
    ("aws_cloudtrail", "name"): 128,
    ("aws_config_config_rule", "name"): 128,
    ("aws_apigatewayv2_api", "name"): 128,
    ("aws_wafv2_web_acl", "name"): 128,
    ("aws_iam_role_policy", "name"): 128,
    ("aws_prometheus_workspace", "alias"): 100,
    ("aws_efs_file_system", "creation_token"): 64,
}
DEFAULT_LIMITS = {"name_prefix": 255 - 26, "bucket_prefix": 37}
NAME_ARGS = frozenset(
    {a for _, a in LIMITS} | {"name", "name_prefix", "family", "alarm_name", "dashboard_name"}
)
_REF = re.compile(r"\$\{(var\.name_prefix|local\.\w+)\}")
_BARE = re.compile(r"\b(var\.name_prefix|local\.\w+)\b")
_SUBSTR = re.compile(r'\$\{substr\("?([^",()${}]*)"?, 0, (\d+)\)\}')
_REPLACE = re.compile(r'\$\{replace\("?([^",()${}]*)"?, "-", "_"\)\}')


def evaluate(expr: str, env: dict[str, str]) -> str | None:
    """A name's HCL template with the module's prefix and locals put in (``substr`` and
    ``replace`` applied); None when it depends on anything else."""
    text = expr
    for _ in range(6):
        text = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), text)
        text = re.sub(
            r"\$\{([^{}]*)\}",
            lambda m: "${" + _BARE.sub(lambda r: f'"{env[r.group(1)]}"' if r.group(1) in env
                                       else r.group(0), m.group(1)) + "}",
            text,
        )  # fmt: skip
        text = _SUBSTR.sub(lambda m: m.group(1)[: int(m.group(2))], text)
        text = _REPLACE.sub(lambda m: m.group(1).replace("-", "_"), text)
    return None if "${" in text else text


def rendered_names(files: dict[str, str]) -> list[tuple[str, str, str, str]]:
    """``(file, resource type, argument, name)`` of every name the modules give, for each
    name prefix the root passes them."""
    root = hcl2.loads(files["infra/main.tf"])
    prefixes = sorted({body["name_prefix"] for block in root["module"] for body in block.values()})
    out = []
    for path, text in sorted(files.items()):
        if not path.startswith("infra/modules/") or not path.endswith("main.tf"):
            continue
        doc = hcl2.loads(text)
        local_exprs = {k: v for block in doc.get("locals", []) for k, v in block.items()}
        for prefix in prefixes:
            env = {"var.name_prefix": prefix}
            for _ in range(3):
                for k, v in local_exprs.items():
                    got = evaluate(v, env) if isinstance(v, str) else None
                    if got is not None:
                        env[f"local.{k}"] = got
            for block in doc.get("resource", []):
                for rtype, named in block.items():
                    for body in named.values():
                        for arg, value in body.items():
                            if arg in NAME_ARGS and isinstance(value, str):
                                name = evaluate(value, env)
                                if name is not None:
                                    out.append((path, rtype, arg, name))
    return out


#: Names unique within their parent (an inline policy in its role), not in the account.
ROLE_SCOPED = frozenset({"aws_iam_role_policy"})
#: A project slug far longer than the prefix keeps, and the longest region codes.
LONG = "a-very-long-project-name-indeed-with-more-words-than-anyone-would-type"


@pytest.mark.parametrize("plan", sorted(COVERING_PLANS))
def test_every_rendered_name_fits_its_limit(plan: str) -> None:
    files = _infra(plan, True, LONG, "ap-southeast-2 us-gov-west-1")
    names = rendered_names(files)
    assert len(names) > 60, len(names)
    too_long = [
        (path, rtype, arg, name, LIMITS.get((rtype, arg), DEFAULT_LIMITS.get(arg, 255)))
        for path, rtype, arg, name in names
        if len(name) > LIMITS.get((rtype, arg), DEFAULT_LIMITS.get(arg, 255))
    ]
    assert too_long == []
    # The tightest ones were among those checked.
    kinds = {(rtype, arg) for _, rtype, arg, _ in names}
    assert ("aws_s3_bucket", "bucket_prefix") in kinds
    assert ("aws_iam_role", "name_prefix") in kinds


def test_two_projects_sharing_a_start_get_their_own_names() -> None:
    """The reviewer's finding: churn-model-eu and churn-model-us both got churn-mode."""
    eu = _infra("A", False, "churn-model-eu", "eu-west-1")
    us = _infra("A", False, "churn-model-us", "eu-west-1")
    # Inline role policies are named within their role, which has a name of its own.
    names_eu = {n for _, t, _, n in rendered_names(eu) if t not in ROLE_SCOPED}
    names_us = {n for _, t, _, n in rendered_names(us) if t not in ROLE_SCOPED}
    assert len(names_eu) > 30 and len(names_us) > 30
    assert names_eu & names_us == set()
    assert name_prefix("churn-model-eu", "eu-west-1") != name_prefix("churn-model-us", "eu-west-1")
    assert len(name_prefix(LONG, "us-gov-west-1")) <= NAME_PREFIX_MAX
