"""Rule ``account``: no account-wide singleton unless the design owns the account's baseline.

Some AWS settings exist once per account (and region): Lake Formation's administrators, the
AWS Config recorder and delivery channel, Macie's enablement, the Glue Data Catalog's
encryption, GuardDuty's detector, Security Hub. A repository that creates one overwrites
the setting another deployment in the same account made, or fails because it exists. So
a tree may create them only when its root module says it owns the account's baseline: a
local ``account_baseline = true`` (the design's ``account_baseline`` constraint or the
organisation policy's, issue 38 §3).
"""

from __future__ import annotations

from keel.design.wiring.model import Finding, TfModule
from keel.design.wiring.repo import Repo

#: Resource types of which an account holds one (per region where the service is regional),
#: and what each is.
ACCOUNT_SINGLETONS: dict[str, str] = {
    "aws_lakeformation_data_lake_settings": "Lake Formation's administrators and defaults",
    "aws_config_configuration_recorder": "AWS Config's configuration recorder",
    "aws_config_delivery_channel": "AWS Config's delivery channel",
    "aws_config_configuration_recorder_status": "AWS Config's recorder status",
    "aws_config_retention_configuration": "AWS Config's retention",
    "aws_macie2_account": "Macie's enablement",
    "aws_macie2_classification_export_configuration": "Macie's export configuration",
    "aws_guardduty_detector": "GuardDuty's detector",
    "aws_securityhub_account": "Security Hub's enablement",
    "aws_securityhub_standards_subscription": "a Security Hub standard's subscription",
    "aws_inspector2_enabler": "Inspector's enablement",
    "aws_detective_graph": "Detective's behaviour graph",
    "aws_glue_data_catalog_encryption_settings": "the Glue Data Catalog's encryption",
    "aws_glue_resource_policy": "the Glue Data Catalog's resource policy",
    "aws_ebs_encryption_by_default": "EBS encryption by default",
    "aws_ebs_default_kms_key": "EBS's default key",
    "aws_s3_account_public_access_block": "S3's account-level public access block",
    "aws_iam_account_password_policy": "IAM's password policy",
    "aws_iam_account_alias": "the account's alias",
    "aws_api_gateway_account": "API Gateway's CloudWatch role",
    "aws_xray_encryption_config": "X-Ray's encryption",
    "aws_ecr_registry_policy": "the ECR registry's policy",
    "aws_ecr_registry_scanning_configuration": "the ECR registry's scanning",
    "aws_ecr_replication_configuration": "the ECR registry's replication",
    "aws_emr_block_public_access_configuration": "EMR's block public access",
    "aws_vpc_block_public_access_options": "VPC block public access",
    "aws_ec2_image_block_public_access": "AMI block public access",
    "aws_ec2_serial_console_access": "EC2 serial console access",
    "aws_ssm_service_setting": "a Systems Manager service setting",
    "aws_account_alternate_contact": "the account's alternate contact",
    "aws_account_primary_contact": "the account's primary contact",
}

#: The root module local that says the tree owns the account's baseline.
BASELINE_LOCAL = "account_baseline"


def _owns_baseline(mod: TfModule) -> bool:
    return mod.locals.get(BASELINE_LOCAL) is True


def check_account(repo: Repo) -> list[Finding]:
    out: list[Finding] = []
    roots = {i.root: i.module for i in repo.instances if i.block is None}
    for mod in repo.modules.values():
        singletons = [r for r in mod.resources if r.kind in ACCOUNT_SINGLETONS]
        if not singletons:
            continue
        under = sorted({i.root for i in repo.instances_of(mod)}) or sorted(roots) or [mod.dir]
        without = [r for r in under if r not in roots or not _owns_baseline(roots[r])]
        if not without:
            continue
        for block in singletons:
            out.append(
                Finding(
                    "account",
                    block.file,
                    f"{block.kind}.{block.name} is {ACCOUNT_SINGLETONS[block.kind]}, one per "
                    "account and region: a second deployment in the account overwrites it "
                    f"or fails, and the root module {without[0]}/ does not own the account's "
                    f"baseline (no local {BASELINE_LOCAL} = true; the design's "
                    "account_baseline is off)",
                )
            )
    return out
