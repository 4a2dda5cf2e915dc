"""The generated repository's Terraform (§21.1 node 9): one module per capability, the
root instantiating each once per region of the plan.

Templates are Jinja2 files under ``configs/design/templates/terraform/``:

- ``root/*.tf.j2``: ``infra/main.tf`` (the module instances, wired to each other),
  ``providers.tf`` (one aliased ``aws`` provider per region), ``backend.tf`` (S3 state with
  a DynamoDB lock, bucket and region from a partial configuration), ``variables.tf`` and
  ``outputs.tf``;
- ``foundation/*.tf.j2``: the per-region network and logging every capability stands on
  (VPC, private and public subnets, flow logs, NAT, gateway endpoints, the S3 access-log
  bucket, the Glue catalog's encryption);
- ``module/*.tf.j2`` with ``patterns/<pattern>.tf.j2``: the capability module, its KMS key
  and log group, then the pattern's resources (``_macros.tf.j2`` holds the shared blocks:
  encrypted buckets, Lambda functions, roles, ECR repositories, Step Functions).

Sizes that the cost estimate prices (Kinesis shards, MSK brokers and their storage,
serving tasks, task vCPU and memory, training cadence) are read from the estimate's
workload and bill of materials in the request, so ``reports/cost.json`` and the Terraform
state the same numbers. Rendering is deterministic: same request, same bytes.
"""

from __future__ import annotations

import hashlib
import math
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from keel.design.critics import workload_of

if TYPE_CHECKING:
    from keel.design.codegen import CodeGenRequest

#: Where the Terraform templates live.
TEMPLATES = Path(__file__).resolve().parents[2] / "configs" / "design" / "templates" / "terraform"
#: The region used when the constraints name none.
DEFAULT_REGION = "us-east-1"
#: Region names as AWS spells them (the constraints' validator has checked them already).
_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$")
_SAFE = re.compile(r"[^a-z0-9]+")

#: The workload values a module sizes itself by, with the value used when an estimate
#: carries no workload (estimates made before formulas).
_SIZING_DEFAULTS: dict[str, float] = {
    "kinesis_shards": 1,
    "msk_brokers": 3,
    "serve_tasks": 2,
    "serve_task_vcpu": 1,
    "serve_task_gb": 2,
    "train_task_vcpu": 4,
    "train_task_gb": 16,
    "mlflow_task_vcpu": 1,
    "mlflow_task_gb": 2,
    "region_training_runs": 4,
    "batch_runs_per_day": 24,
    "retention_days": 30,
    "landing_days": 7,
    "kafka_retention_days": 7,
    "days_per_month": 30.4167,
    "grafana_editors": 5,
    "ocu_minimum": 2,
}


def _slug(text: str) -> str:
    return _SAFE.sub("-", text.lower()).strip("-") or "project"


def _ident(text: str) -> str:
    return _SAFE.sub("_", text.lower()).strip("_")


def pattern_template(pattern_id: str) -> str:
    """The template file of a pattern, relative to :data:`TEMPLATES`."""
    return f"patterns/{_ident(pattern_id)}.tf.j2"


@cache
def _template_text(template: str) -> str:
    return (TEMPLATES / template).read_text(encoding="utf-8")


@cache
def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # HCL, not HTML
    )
    env.filters["hcl"] = _hcl_string
    env.filters["aligned"] = aligned
    env.globals["training_set_prefix"] = TRAINING_SET_PREFIX
    return env


def _hcl_string(value: object) -> str:
    """``value`` as an HCL string literal (quotes, backslashes and ``${`` escaped)."""
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
    return '"' + text.replace("${", "$${").replace("%{", "%%{") + '"'


def _schedule_days(runs_per_month: float) -> int:
    """Days between scheduled runs for ``runs_per_month`` (at least daily, at most 30)."""
    if runs_per_month <= 0:
        return 30
    return max(1, min(30, math.floor(30 / runs_per_month)))


def _sizing(req: CodeGenRequest) -> dict[str, float]:
    """The workload's named values as the cost estimate used them."""
    values = {v.name: v.value for v in req.cost.workload}
    if not values and req.catalog is not None:
        values = workload_of(req.catalog, req.constraints).env()
    return {**_SIZING_DEFAULTS, **values}


def _bom_quantity(req: CodeGenRequest, pattern_id: str, resource: str, region: str) -> float | None:
    for line in req.cost.breakdown:
        if (
            line.pattern_id == pattern_id
            and line.service == resource
            and line.region in (region, None)
            and line.quantity is not None
        ):
            return line.quantity
    return None


def _bom_comment(req: CodeGenRequest, pattern_id: str, regions: list[str]) -> list[str]:
    """One line per bill-of-materials item: its formula and each region's quantity."""
    pattern = req.catalog.by_id().get(pattern_id) if req.catalog is not None else None
    if pattern is None or not pattern.bom:
        return ["(see reports/cost.json)"]
    out = []
    for item in pattern.bom:
        qty = []
        for region in regions:
            q = _bom_quantity(req, pattern_id, item.resource, region)
            if q is not None:
                qty.append(f"{region} {q:,.6g}")
        formula = item.formula or f"{item.quantity or 0:g}"
        out.append(
            f"{item.resource}: {formula} {item.unit}" + (f" ({'; '.join(qty)})" if qty else "")
        )
    return out


def _module_sizes(
    req: CodeGenRequest, pattern_id: str, region: str, w: dict[str, float]
) -> dict[str, Any]:
    """The numbers a pattern's module takes from the workload and the BOM in ``region``."""
    sizes: dict[str, Any] = {
        "data_retention_days": max(1, math.ceil(w["retention_days"])),
        "landing_days": max(1, math.ceil(min(w["retention_days"], w["landing_days"]))),
        "training_every_days": _schedule_days(w["region_training_runs"]),
        "batch_every_minutes": max(5, round(1440 / max(1.0, w["batch_runs_per_day"]))),
    }
    if pattern_id == "ingest:kinesis-streams":
        sizes["shard_count"] = max(1, math.ceil(w["kinesis_shards"]))
    elif pattern_id == "ingest:msk-kafka":
        brokers = max(3, math.ceil(w["msk_brokers"]))
        storage = _bom_quantity(req, pattern_id, "msk_storage", region) or 0.0
        sizes["broker_count"] = brokers
        sizes["broker_volume_gb"] = max(10, math.ceil(storage / brokers))
        sizes["kafka_retention_hours"] = 24 * max(
            1, math.ceil(min(w["retention_days"], w["kafka_retention_days"]))
        )
    elif pattern_id == "serve:ecs-fargate-fastapi":
        tasks = max(1, math.ceil(w["serve_tasks"]))
        sizes.update(
            desired_count=tasks,
            max_count=tasks * 3,
            task_cpu=int(w["serve_task_vcpu"] * 1024),
            task_memory=int(w["serve_task_gb"] * 1024),
        )
    elif pattern_id == "train:ecs-fargate-jobs":
        sizes.update(
            task_cpu=int(w["train_task_vcpu"] * 1024), task_memory=int(w["train_task_gb"] * 1024)
        )
    elif pattern_id == "govern:mlflow-registry":
        sizes.update(
            task_cpu=int(w["mlflow_task_vcpu"] * 1024), task_memory=int(w["mlflow_task_gb"] * 1024)
        )
    elif pattern_id in ("transform:glue-etl", "feature:glue-offline-features"):
        dpu = _bom_quantity(req, pattern_id, "glue_dpu", region) or 15.0
        # One daily run of about an hour: DPU-hours per day, at least Glue's two workers.
        sizes["glue_workers"] = max(2, math.ceil(dpu / w["days_per_month"]))
    elif pattern_id == "transform:emr-serverless-spark":
        vcpu = _bom_quantity(req, pattern_id, "emr_serverless_vcpu", region) or 100.0
        # The cap on the application: one daily run of about an hour, at least 8 vCPU.
        cpu = max(8, math.ceil(vcpu / w["days_per_month"]))
        sizes.update(max_vcpu=cpu, max_memory_gb=cpu * 4)
    elif pattern_id == "observe:amp-grafana":
        sizes["grafana_editors"] = max(1, math.ceil(w["grafana_editors"]))
    return sizes


def aligned(pairs: dict[str, Any]) -> list[str]:
    """``key = value`` lines with the ``=`` aligned, as ``terraform fmt`` writes them."""
    width = max((len(k) for k in pairs), default=0)
    return [f"{k.ljust(width)} = {v}" for k, v in pairs.items()]


#: Regions whose first three zones (for most accounts) are not a, b and c.
_ZONE_LETTERS = {"ap-northeast-1": "acd"}


def _zones(region: str) -> list[str]:
    return [region + z for z in _ZONE_LETTERS.get(region, "abc")]


def _region_id(region: str) -> str:
    return region.replace("-", "_")


#: How each word of a region's name is written in a name prefix (``eu-west-1``: ``euw1``).
_REGION_WORDS = {
    "north": "n",
    "south": "s",
    "east": "e",
    "west": "w",
    "central": "c",
    "northeast": "ne",
    "southeast": "se",
    "northwest": "nw",
    "southwest": "sw",
    "gov": "g",
    "iso": "i",
    "isob": "ib",
}
#: The longest name prefix: SageMaker job and model names are ``<prefix>-<capability>-``
#: and the Step Functions execution name (a 36-character id), at most 63 characters.
NAME_PREFIX_MAX = 20


def region_code(region: str) -> str:
    """``eu-west-1`` as ``euw1``, ``ap-southeast-2`` as ``apse2`` (unique per region)."""
    area, *words = region.split("-")
    return area + "".join(_REGION_WORDS.get(w, w[:2]) for w in words)


def name_prefix(slug: str, region: str) -> str:
    """The prefix of every name in ``region``: the slug's start, a hash of the whole slug
    (``churn-model-eu`` and ``churn-model-us`` differ) and the region's code, at most
    :data:`NAME_PREFIX_MAX` characters (S3 bucket prefixes, OpenSearch collections and
    SageMaker job names are cut from it or built on it)."""
    digest = hashlib.sha256(slug.encode()).hexdigest()[:6]
    tail = f"-{digest}-{region_code(region)}"
    head = slug[: max(1, NAME_PREFIX_MAX - len(tail))].strip("-") or "keel"
    return head + tail


def _registry(plan_by_cap: dict[str, str]) -> str | None:
    """Where the generated code registers models (as ``activities.design.app`` decides
    it): ``mlflow``, ``sagemaker`` (model packages) or None (the store's JSON only)."""
    if plan_by_cap.get("govern") == "govern:mlflow-registry":
        return "mlflow"
    if plan_by_cap.get("govern") == "govern:model-registry-config" or plan_by_cap.get(
        "train", ""
    ).startswith("train:sagemaker-"):
        return "sagemaker"
    return None


#: The model artefact the SageMaker registry's model packages point at, under the models
#: bucket: where the pipeline's promoted model is published (the batch transform reads it).
MODEL_ARCHIVE_KEY = "registry/latest/model.tar.gz"
#: The prefix of the pipeline's store in a bucket (``DATA_URI`` is ``s3://<bucket>/pipeline``):
#: the promotion writes ``MODEL_ARCHIVE_KEY`` under it.
DATA_PREFIX = "pipeline"
#: The SageMaker training job's ``train`` channel under the models bucket (``S3Uri``
#: ``s3://<models bucket>/<TRAINING_SET_PREFIX>/``): the store's ``training-sets/latest/``
#: under ``DATA_URI``, where the stream's transform function lands each batch a second time
#: (``TRAINING_SET_URI``).
TRAINING_SET_PREFIX = f"{DATA_PREFIX}/training-sets/latest"

#: The EMR release of the EMR Serverless application (``release_label``), which is also
#: the base of its job image (``services/transform/Dockerfile``: EMR Serverless runs a
#: custom image only on the release it was built from).
EMR_RELEASE = "emr-7.2.0"


def registry_env(plan_by_cap: dict[str, str], cap: str) -> dict[str, str]:
    """The environment (name -> HCL expression) the registry code needs where ``cap``'s
    runtimes run it (training and serving import it): MLflow's tracking URI (the govern
    module's MLflow server), or the SageMaker model package group, the serving image and
    the model archive. The other capabilities get none."""
    registry = _registry(plan_by_cap)
    if cap not in ("train", "serve") or registry is None:
        return {}
    if registry == "mlflow":
        return {"MLFLOW_TRACKING_URI": "var.mlflow_tracking_uri"}
    if plan_by_cap.get("train", "").startswith("train:sagemaker-"):
        return {}  # the training state machine registers (sagemaker_registration)
    own_group = plan_by_cap.get("govern") != "govern:model-registry-config"
    if cap == "train":
        env = {
            "MODEL_PACKAGE_GROUP": (
                "aws_sagemaker_model_package_group.models.model_package_group_name"
                if own_group
                else "var.model_package_group"
            ),
            "MODEL_DATA_URL": (
                f'"s3://${{aws_s3_bucket.models.id}}/{DATA_PREFIX}/{MODEL_ARCHIVE_KEY}"'
            ),
        }
        if "serve" in plan_by_cap:
            env["MODEL_IMAGE"] = "var.model_image"
        return env
    return {}  # serving reads nothing of it: only the training registers (package.py)


def sagemaker_registration(plan_by_cap: dict[str, str], cap: str) -> dict[str, str] | None:
    """What a SageMaker training module's state machine registers after the job (HCL
    expressions): the model package ``group``, the serving ``image`` (None without a
    serve module: the archive is published, nothing registered) and the archive
    ``key`` it publishes the job's ``model.tar.gz`` to (under ``DATA_URI``). None where
    the plan does not register SageMaker model packages from a SageMaker training job.
    The job runs network-isolated, so it cannot call SageMaker or S3 itself."""
    train = plan_by_cap.get("train", "")
    if cap != "train" or not train.startswith("train:sagemaker-"):
        return None
    if _registry(plan_by_cap) != "sagemaker":
        return None
    own_group = plan_by_cap.get("govern") != "govern:model-registry-config"
    return {
        "group": (
            "aws_sagemaker_model_package_group.models.model_package_group_name"
            if own_group
            else "var.model_package_group"
        ),
        "image": "var.model_image" if "serve" in plan_by_cap else "",
        "key": f"{DATA_PREFIX}/{MODEL_ARCHIVE_KEY}",
    }


def training_set_writer(plan_by_cap: dict[str, str]) -> bool:
    """Whether the transform writes the SageMaker training job's ``train`` channel
    (:data:`TRAINING_SET_PREFIX` of the models bucket): a SageMaker training plan whose
    transform is the stream's function (``transform:kinesis-lambda``) or the job (Glue,
    EMR Serverless) that lands the batch ingest's files (:func:`landing_reader`)."""
    if not plan_by_cap.get("train", "").startswith("train:sagemaker-"):
        return False
    transform = plan_by_cap.get("transform")
    return transform == "transform:kinesis-lambda" or landing_reader(plan_by_cap)


def drift_runner(plan_by_cap: dict[str, str]) -> bool:
    """Whether something deployed runs ``services.observe`` (the drift check that puts
    ``max_feature_psi``): with ``train:ecs-fargate-jobs`` a daily EventBridge schedule of
    the ECS training task with the command overridden (on the training's image, store and
    role); with a SageMaker training that publishes its model (:func:`sagemaker_registration`:
    the archive under ``DATA_URI``) a daily SageMaker processing job on the training
    image, its entry point overridden, that reads the published archive and the training
    set's records (:data:`TRAINING_SET_PREFIX`). Other trainings (SageMaker with MLflow,
    which publishes no archive) have no such runtime, so their observe module has no drift
    alarm (it would watch a metric nothing emits)."""
    if "observe" not in plan_by_cap:
        return False
    if plan_by_cap.get("train") == "train:ecs-fargate-jobs":
        return True
    return sagemaker_registration(plan_by_cap, "train") is not None


#: Transforms that run a job script (``jobs/<runner>/transform.py``), which lands the batch
#: ingest's files before its feature step: the Glue job and the EMR Serverless job run.
JOB_TRANSFORMS = ("transform:glue-etl", "transform:emr-serverless-spark")
#: Patterns of other capabilities whose runtimes run pipeline steps on the pipeline's
#: store (``DATA_URI``): given the training's models bucket (``pipeline_bucket``).
PIPELINE_STEPS = (
    "transform:glue-etl",
    "transform:emr-serverless-spark",
    "transform:kinesis-lambda",
    "feature:glue-offline-features",
)
#: Ingests that land their records as files in their landing bucket's ``incoming/``: the
#: batch drops, and Firehose's files from the Kinesis stream (GZIP, a newline after each
#: record). MSK lands nothing in S3: only a stream consumer (``transform:kinesis-lambda``)
#: reads it, so the job transforms require one of these (``requires`` in patterns.yaml).
LANDING_INGESTS = ("ingest:s3-batch", "ingest:kinesis-streams")


def landing_reader(plan_by_cap: dict[str, str]) -> bool:
    """Whether the transform job (Glue, or EMR Serverless's scheduled job run) lands the
    landing bucket's files (``incoming/``) in its store's ``raw/`` before its feature
    step: a transform of :data:`JOB_TRANSFORMS` with an ingest of
    :data:`LANDING_INGESTS`."""
    return (
        plan_by_cap.get("ingest") in LANDING_INGESTS
        and plan_by_cap.get("transform") in JOB_TRANSFORMS
    )


def _wiring(plan_by_cap: dict[str, str], region: str) -> dict[str, dict[str, str]]:
    """HCL expressions passed between a region's modules (capability -> argument -> expr)."""
    r = _region_id(region)
    ingest, serve = plan_by_cap.get("ingest"), plan_by_cap.get("serve")
    out: dict[str, dict[str, str]] = {cap: {} for cap in plan_by_cap}

    def buckets(*caps: str) -> str:
        parts = [f"module.{c}_{r}.data_bucket_arns" for c in caps if c in plan_by_cap]
        return f"concat({', '.join(parts)})" if len(parts) > 1 else (parts[0] if parts else "[]")

    def names(*caps: str) -> str:
        parts = [f"module.{c}_{r}.data_bucket_names" for c in caps if c in plan_by_cap]
        return f"concat({', '.join(parts)})" if len(parts) > 1 else (parts[0] if parts else "[]")

    if "transform" in out:
        out["transform"]["source_bucket_arns"] = buckets("ingest")
        # The transform lands its records in the pipeline's store (the training's models
        # bucket) and, with SageMaker training, in the training job's channel there.
        out["transform"]["target_bucket_arns"] = buckets("store", "feature", "train")
        if training_set_writer(plan_by_cap):
            out["transform"]["training_set_bucket"] = f"module.train_{r}.training_set_bucket"
        if landing_reader(plan_by_cap):
            out["transform"]["landing_bucket"] = f"module.ingest_{r}.data_bucket_names[0]"
        if ingest == "ingest:kinesis-streams":
            out["transform"]["source_stream_arn"] = f"module.ingest_{r}.stream_arn"
        elif ingest == "ingest:msk-kafka":
            out["transform"]["source_cluster_arn"] = f"module.ingest_{r}.cluster_arn"
            out["transform"]["source_bootstrap_brokers"] = f"module.ingest_{r}.bootstrap_brokers"
    if "feature" in out:
        out["feature"]["source_bucket_arns"] = buckets("store", "ingest")
    if "train" in plan_by_cap:
        # One store for the pipeline (DATA_URI = s3://<bucket>/pipeline): the training's
        # models bucket, where the training reads and serving and the drift check read
        # what it publishes. The runtimes of other modules that run pipeline steps (the
        # transform landing raw/, the offline feature job building features/) are given
        # that bucket instead of a store of their own, which the training never read.
        for cap in ("transform", "feature"):
            if plan_by_cap.get(cap) in PIPELINE_STEPS:
                out[cap]["pipeline_bucket"] = f"module.train_{r}.data_bucket_names[0]"
        if plan_by_cap.get("feature") in PIPELINE_STEPS:
            out["feature"]["pipeline_bucket_arns"] = buckets("train")
    for cap in ("train", "serve"):
        if cap in out and "feature" in plan_by_cap:
            out[cap]["feature_read_policy_arn"] = f"module.feature_{r}.read_policy_arn"
    if "train" in out:
        out["train"]["source_bucket_arns"] = buckets("store", "feature")
    if "serve" in out and "train" in plan_by_cap:
        out["serve"]["model_bucket_arns"] = buckets("train")
    if "observe" in out and plan_by_cap.get("train", "").startswith("train:sagemaker-"):
        # The observe module alarms on failed training runs: a metric AWS emits for the
        # state machine (beside the drift alarm where drift_runner says drift is run).
        out["observe"]["training_state_machine_arn"] = f"module.train_{r}.state_machine_arn"
    if "observe" in out and serve == "serve:sagemaker-batch-transform":
        out["observe"]["capture_s3_uri"] = f"module.serve_{r}.capture_s3_uri"
        out["observe"]["capture_bucket_arns"] = f"module.serve_{r}.data_bucket_arns"
    registry = _registry(plan_by_cap)
    if registry == "mlflow":
        for cap in ("train", "serve"):
            if cap in out:
                out[cap]["mlflow_tracking_uri"] = f"module.govern_{r}.mlflow_tracking_uri"
    elif registry == "sagemaker":
        # The group: the govern module's (model-registry-config), else the train module's.
        if plan_by_cap.get("govern") == "govern:model-registry-config":
            for cap in ("train", "serve"):
                if cap in out:
                    out[cap]["model_package_group"] = f"module.govern_{r}.model_package_group_name"
        elif "serve" in out and "train" in out:
            out["serve"]["model_package_group"] = f"module.train_{r}.model_package_group_name"
        if "train" in out and "serve" in out:
            out["train"]["model_image"] = f"module.serve_{r}.image_uri"
    if "govern" in out:
        out["govern"]["data_bucket_arns"] = buckets("ingest", "store", "feature")
        out["govern"]["data_bucket_names"] = names("ingest", "store", "feature")
    return out


def render_infra(req: CodeGenRequest) -> dict[str, str]:
    """``infra/``: the root and one module per capability (``infra/modules/<capability>/``)
    plus the per-region foundation, as ``{path: text}``; deterministic."""
    plan = req.plan
    slug = _slug(req.project)
    regions = [r for r in plan.regions if _REGION.match(r)] or [DEFAULT_REGION]
    env = _env()
    w = _sizing(req)
    plan_by_cap = {c.capability.value: c.pattern_id for c in plan.choices}
    modules = _modules(req, regions, w)
    region_ctx: list[dict[str, Any]] = [
        {
            "name": r,
            "id": _region_id(r),
            "prefix": name_prefix(slug, r),
            "primary": i == 0,
            "cidr": f"10.{(i * 16) % 256}.0.0/16",
            "zones": _zones(r),
            "wiring": _wiring(plan_by_cap, r),
        }
        for i, r in enumerate(regions)
    ]
    common: dict[str, Any] = {
        "slug": slug,
        "project": req.project,
        "decision_set": req.decision_set,
        "catalog_version": plan.catalog_version,
        "regions": region_ctx,
        "plan": plan_by_cap,
        "modules": modules,
        "images": any(m["image_tag"] for m in modules),
        "monthly_usd": req.cost.monthly_usd,
        # Issue 38 §3: the account's one-per-region settings (Lake Formation admins, AWS
        # Config's recorder, Macie, the Glue catalog's encryption) only when asked for.
        "baseline": bool(req.constraints.account_baseline),
        # Whether the training module schedules services.observe (the drift alarm's feed).
        "drift_runner": drift_runner(plan_by_cap),
        # Where services.observe puts its metrics (services/observe/drift.py), and the
        # namespace of the drift alarm where something deployed puts them there: none
        # without a drift runner or with managed Prometheus.
        "metrics_namespace": f"{slug[:60]}/monitoring",
        "drift_namespace": (
            f"{slug[:60]}/monitoring"
            if drift_runner(plan_by_cap) and plan_by_cap.get("observe") != "observe:amp-grafana"
            else None
        ),
        "emr_release": EMR_RELEASE,
    }
    return _render_files(env, common, modules, regions[0], region_ctx[0])


def _modules(req: CodeGenRequest, regions: list[str], w: dict[str, float]) -> list[dict[str, Any]]:
    """The template context of each capability's module, in the plan's order."""
    by_id = req.catalog.by_id() if req.catalog is not None else {}
    modules: list[dict[str, Any]] = []
    plan_by_cap = {c.capability.value: c.pattern_id for c in req.plan.choices}
    for choice in req.plan.choices:
        cap, pid = choice.capability.value, choice.pattern_id
        template = pattern_template(pid)
        known = (TEMPLATES / template).is_file()
        pattern = by_id.get(pid)
        modules.append(
            {
                "cap": cap,
                "pattern_id": pid,
                "template": template if known else "patterns/_unknown.tf.j2",
                "summary": pattern.summary if pattern is not None else pid,
                # Modules that run an image of their ECR repository take its tag from the
                # root's image_tag (the tag CI pushes).
                "image_tag": known and 'variable "image_tag"' in _template_text(template),
                "bom": _bom_comment(req, pid, regions),
                # Sizes per region (the BOM's quantities may differ by region).
                "sizes": {r: _module_sizes(req, pid, r, w) for r in regions},
                # What the model registry's code reads where this module runs it.
                "registry_env": registry_env(plan_by_cap, cap),
                # The serving image, for the SageMaker model packages training registers.
                "image_output": cap == "serve" and _registry(plan_by_cap) == "sagemaker",
                # What the SageMaker training state machine registers after the job.
                "registration": sagemaker_registration(plan_by_cap, cap),
                # Whether this module creates the SageMaker model package group (a
                # SageMaker training plan governed without model-registry-config).
                "package_group": cap == "train"
                and _registry(plan_by_cap) == "sagemaker"
                and plan_by_cap.get("govern") != "govern:model-registry-config",
            }
        )
    return modules


def _render_files(
    env: jinja2.Environment,
    common: dict[str, Any],
    modules: list[dict[str, Any]],
    primary: str,
    primary_ctx: dict[str, Any],
) -> dict[str, str]:
    """Render the root, the foundation and each module (sized and wired for the primary
    region) as ``{path: tidied text}``."""
    files: dict[str, str] = {}
    for name in ("main", "providers", "backend", "variables", "outputs"):
        files[f"infra/{name}.tf"] = env.get_template(f"root/{name}.tf.j2").render(common)
    files["infra/backend.s3.tfbackend.example"] = env.get_template(
        "root/backend.s3.tfbackend.j2"
    ).render(common)
    for name in ("main", "variables", "outputs"):
        files[f"infra/modules/foundation/{name}.tf"] = env.get_template(
            f"foundation/{name}.tf.j2"
        ).render(common)
    for module in modules:
        ctx = {
            **common,
            "m": module,
            "sizes": module["sizes"][primary],
            "wiring": primary_ctx["wiring"][module["cap"]],
        }
        for name in ("main", "variables", "outputs"):
            files[f"infra/modules/{module['cap']}/{name}.tf"] = env.get_template(
                f"module/{name}.tf.j2"
            ).render(ctx)
    return {p: _tidy(t) for p, t in files.items()}


_ATTR = re.compile(r'^(\s*)("[^"]*"|[A-Za-z_][\w.$-]*)\s*=(?!=)\s*(.*)$')
_HEREDOC = re.compile(r"<<-?([A-Z]+)\s*$")


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _opens(value: str) -> bool:
    """Whether ``value`` leaves a bracket open at the end of its line."""
    bare = _STRING.sub('""', value)
    return sum(bare.count(c) for c in "([{") > sum(bare.count(c) for c in ")]}")


def _align(lines: list[str]) -> list[str]:
    """Align the ``=`` of consecutive attributes at one indentation, as ``terraform fmt``
    does (a blank line, a comment, a block or a change of indentation ends a run)."""
    out = list(lines)
    run: list[tuple[int, str, str, str]] = []

    def flush() -> None:
        if len(run) > 1:
            width = max(len(key) for _, _, key, _ in run)
            for idx, indent, key, value in run:
                out[idx] = f"{indent}{key.ljust(width)} = {value}"
        elif run:
            idx, indent, key, value = run[0]
            out[idx] = f"{indent}{key} = {value}"
        run.clear()

    heredoc: str | None = None
    for idx, line in enumerate(lines):
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        match = _ATTR.match(line)
        if match is None or line.lstrip().startswith("#") or _opens(match.group(3)):
            # A value that goes on over the next lines is left as written, and ends the run.
            flush()
        else:
            indent, key, value = match.groups()
            if run and run[-1][1] != indent:
                flush()
            run.append((idx, indent, key, value))
        tail = _HEREDOC.search(line)
        if tail is not None:
            flush()
            heredoc = tail.group(1)
    flush()
    return out


def _tidy(text: str) -> str:
    """One trailing newline, no runs of blank lines (templates' conditionals leave them),
    attributes aligned as ``terraform fmt`` aligns them."""
    lines = [ln.rstrip() for ln in text.splitlines()]
    out: list[str] = []
    for ln in lines:
        if not ln and (not out or not out[-1]):
            continue
        out.append(ln)
    while out and not out[-1]:
        out.pop()
    return "\n".join(_align(out)) + "\n"


__all__ = [
    "DEFAULT_REGION",
    "NAME_PREFIX_MAX",
    "TEMPLATES",
    "name_prefix",
    "pattern_template",
    "region_code",
    "render_infra",
]
