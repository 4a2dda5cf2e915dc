"""The rule names, what AWS provides, and the parsed Terraform's shapes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

RULES = (
    "variables",
    "lambda",
    "images",
    "environment",
    "permissions",
    "alarms",
    "jobs",
    "account",
    "kafka",
    "objects",
)

#: Set by the runtime itself, so code may read them without anything in the Terraform
#: setting them: Lambda and ECS on Fargate put the region in both names. SageMaker jobs
#: and models are not relied on for it: there the Terraform must set it.
RUNTIME_PROVIDED: dict[str, frozenset[str]] = {
    "lambda": frozenset(
        {
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_LAMBDA_FUNCTION_NAME",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
            "AWS_LAMBDA_FUNCTION_VERSION",
            "AWS_EXECUTION_ENV",
            "LAMBDA_TASK_ROOT",
            "LAMBDA_RUNTIME_DIR",
        }
    ),
    "ecs": frozenset({"AWS_REGION", "AWS_DEFAULT_REGION", "ECS_CONTAINER_METADATA_URI_V4"}),
    "sagemaker": frozenset(),
    "compose": frozenset(),
    # Script jobs (:mod:`.scripts`): their environment is what the script sets.
    "glue": frozenset(),
    "emr": frozenset(),
}

#: Namespaces AWS emits metrics in, and the resource types whose presence means it does.
AWS_NAMESPACES: dict[str, tuple[str, ...]] = {
    "AWS/Lambda": ("aws_lambda_function",),
    "AWS/ECS": ("aws_ecs_service", "aws_ecs_cluster"),
    "ECS/ContainerInsights": ("aws_ecs_cluster",),
    "AWS/ApplicationELB": ("aws_lb", "aws_alb"),
    "AWS/States": ("aws_sfn_state_machine",),
    "AWS/Kinesis": ("aws_kinesis_stream",),
    "AWS/Firehose": ("aws_kinesis_firehose_delivery_stream",),
    "AWS/Kafka": ("aws_msk_cluster", "aws_msk_serverless_cluster"),
    "AWS/DynamoDB": ("aws_dynamodb_table",),
    "AWS/SQS": ("aws_sqs_queue",),
    "AWS/SNS": ("aws_sns_topic",),
    "AWS/S3": ("aws_s3_bucket",),
    "AWS/ApiGateway": ("aws_apigatewayv2_api", "aws_api_gateway_rest_api"),
    "AWS/AOSS": ("aws_opensearchserverless_collection",),
    "AWS/ES": ("aws_opensearch_domain", "aws_elasticsearch_domain"),
    "AWS/SageMaker": ("aws_sagemaker_endpoint", "aws_sfn_state_machine"),
    "/aws/sagemaker/TrainingJobs": ("aws_sfn_state_machine",),
    "/aws/sagemaker/TransformJobs": ("aws_sfn_state_machine",),
    "Glue": ("aws_glue_job",),
    "AWS/EMRServerless": ("aws_emrserverless_application",),
    "AWS/Events": ("aws_cloudwatch_event_rule",),
    "AWS/Scheduler": ("aws_scheduler_schedule",),
    "AWS/WAFV2": ("aws_wafv2_web_acl",),
    "AWS/EFS": ("aws_efs_file_system",),
    "AWS/Prometheus": ("aws_prometheus_workspace",),
}

#: Resource types whose reference to a log group means they write to it.
_LOG_WRITERS = (
    "aws_ecs_task_definition",
    "aws_lambda_function",
    "aws_sfn_state_machine",
    "aws_glue_job",
    "aws_apigatewayv2_stage",
    "aws_emrserverless_application",
)

_META_ARGS = frozenset({"source", "version", "providers", "count", "for_each", "depends_on"})
_IMAGE_KEYS = frozenset({"image", "image_uri", "Image", "TrainingImage", "ImageUri"})
_SCRIPT_KEYS = frozenset({"script_location", "ScriptLocation", "entryPoint", "EntryPoint"})
_ECR_IMAGE = re.compile(r"^\$\{aws_ecr_repository\.(\w+)\.repository_url\}:(.+)$")
_VAR_ONLY = re.compile(r"^\$\{var\.(\w+)\}$")
_VAR_REF = re.compile(r"\$\{var\.(\w+)\}")
_REF = re.compile(r"\b(data\.)?((?:aws|archive)_\w+)\.(\w+)")
_S3_URI = re.compile(r"^s3://(.+?)/(.+)$")
_BUCKET_REF = re.compile(r"^\$\{aws_s3_bucket\.(\w+)\.(?:id|bucket)\}$")
_STRING = r'"((?:[^"\\]|\\.)*)"'
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, order=True)
class Finding:
    """One broken joint: the rule, the file where it shows, and what is wrong."""

    rule: str
    file: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "file": self.file, "message": self.message}


@dataclass
class Variable:
    name: str
    file: str
    has_default: bool
    default: Any = None


@dataclass
class Block:
    kind: str  # resource type, data source type or module name
    name: str
    body: dict[str, Any]
    file: str


@dataclass
class TfModule:
    """The Terraform of one directory."""

    dir: str
    variables: dict[str, Variable] = field(default_factory=dict)
    modules: list[Block] = field(default_factory=list)
    resources: list[Block] = field(default_factory=list)
    data: list[Block] = field(default_factory=list)
    locals: dict[str, Any] = field(default_factory=dict)

    def resource(self, kind: str, name: str) -> Block | None:
        return next((r for r in self.resources if r.kind == kind and r.name == name), None)

    def datum(self, kind: str, name: str) -> Block | None:
        return next((d for d in self.data if d.kind == kind and d.name == name), None)

    def of_kind(self, *kinds: str) -> list[Block]:
        return [r for r in self.resources if r.kind in kinds]


@dataclass
class Instance:
    """A module as a root instantiates it: the module block's arguments, with a plain
    ``${var.x}`` resolved through its caller."""

    module: TfModule
    root: str
    args: dict[str, Any]
    block: Block | None  # None: the root itself
