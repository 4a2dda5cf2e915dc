"""The generated repository's application (§21.1 node 9): pipeline code, tests, images,
CI and README, rendered from the Jinja2 templates in ``configs/design/templates/app/``.

:func:`render_app` maps a :class:`~activities.design.codegen.CodeGenRequest` to
``{path: text}``. Every plan gets runnable Python packages for the lifecycle under
``services/``: ``common`` (settings from the plan, the event schema, an object store
with a local and an S3 implementation, the model registry, feature distributions),
``ingest``, ``feature`` (the transform and feature capabilities), ``train`` (training and
the evaluation gate), ``serve``, ``observe`` (drift) and, when the plan governs, ``govern``
(retention, model cards), plus ``services/pipeline.py`` running them in order. What
varies with the plan: the streaming consumer (Kinesis or Kafka), the online routes and
their latency target, batch scoring routes, the SageMaker container contract, the
Lambda handler, the retrieval route of a RAG plan, the metrics sink of the observe
pattern, and which services get a Dockerfile. The tests each package ships run in the
validators' jail and in the generated CI, on local data only.

Rendering is deterministic: same request and infra paths, same bytes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from activities.design.infra import (
    EMR_RELEASE,
    TRAINING_SET_PREFIX,
    drift_runner,
    landing_reader,
    name_prefix,
)
from keel.design.constraints import (
    DEFAULT_DATA_SPEC,
    ColumnType,
    DataSpec,
    Task,
    WorkloadType,
    data_spec,
)

if TYPE_CHECKING:
    from keel.design.codegen import CodeGenRequest

#: Where the application templates live.
TEMPLATES = Path(__file__).resolve().parents[2] / "configs" / "design" / "templates" / "app"

#: Runtime dependencies of the generated code, pinned to the versions its tests run
#: against in the validators' jail (Keel's own environment: see ``uv.lock``).
RUNTIME_REQUIREMENTS: tuple[str, ...] = (
    "boto3==1.44.5",
    "fastapi==0.165.0",
    "numpy==2.4.6",
    "pandas==3.1.1",
    "pydantic==2.14.3",
    "scikit-learn==1.9.1",
    "uvicorn==0.54.0",
)
#: The MLflow release of a plan that registers models in MLflow (``govern:mlflow-registry``):
#: the clients (the generated code, :data:`MLFLOW_REQUIREMENT`) and the tracking server's
#: image (``services/mlflow/Dockerfile``, :data:`MLFLOW_SERVER_REQUIREMENT`) both pin it,
#: and the wiring's ``images`` rule fails a tree where they differ.
MLFLOW_VERSION = "3.18.0"
MLFLOW_REQUIREMENT = f"mlflow-skinny=={MLFLOW_VERSION}"
MLFLOW_SERVER_REQUIREMENT = f"mlflow=={MLFLOW_VERSION}"
#: Only with an ``ingest:msk-kafka`` plan; imported lazily, never by the tests.
KAFKA_REQUIREMENT = "confluent-kafka==2.6.1"
DEV_REQUIREMENTS: tuple[str, ...] = (
    "httpx==0.28.1",
    "moto==5.2.6",
    "mypy==2.4.1",
    "pytest==9.2.0",
    "ruff==0.17.6",
)
DEFAULT_REGION = "us-east-1"
DEFAULT_RETENTION_DAYS = 30

#: The lifecycle packages every plan gets (each is needed by the pipeline runner).
CORE_PACKAGES: tuple[str, ...] = ("common", "ingest", "feature", "train", "serve", "observe")
#: Which capability each package carries out.
PACKAGE_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "common": ("store",),
    "ingest": ("ingest",),
    "feature": ("transform", "feature"),
    "train": ("train",),
    "serve": ("serve",),
    "observe": ("observe",),
    "govern": ("govern",),
}
#: Data flow between capabilities, in pipeline order (the diagram's edges).
_FLOW: tuple[tuple[str, str, str], ...] = (
    ("ingest", "transform", "raw events"),
    ("transform", "store", "clean partitions"),
    ("store", "feature", "history"),
    ("feature", "train", "feature rows"),
    ("train", "serve", "promoted model"),
    ("feature", "serve", "features"),
    ("serve", "observe", "scores, latency"),
    ("feature", "observe", "distributions"),
)
_PIPELINE_ORDER = ("ingest", "transform", "store", "feature", "train", "serve", "observe", "govern")
_SAFE = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class _File:
    """One generated file: its template and whether this plan gets it."""

    template: str
    when: str = ""  # a context flag; empty: always


#: Output path -> template (relative to :data:`TEMPLATES`) and the flag that selects it.
_FILES: dict[str, _File] = {
    "pyproject.toml": _File("pyproject.toml.j2"),
    "requirements.txt": _File("requirements.txt.j2"),
    "requirements-dev.txt": _File("requirements-dev.txt.j2"),
    ".gitignore": _File("gitignore.j2"),
    ".dockerignore": _File("dockerignore.j2"),
    "README.md": _File("README.md.j2"),
    ".github/workflows/ci.yml": _File(".github/workflows/ci.yml.j2"),
    "services/__init__.py": _File("services/__init__.py.j2"),
    "services/pipeline.py": _File("services/pipeline.py.j2"),
    "services/smoke.py": _File("services/smoke.py.j2"),
    "Makefile": _File("Makefile.j2"),
    "services/common/__init__.py": _File("services/common/__init__.py.j2"),
    "services/common/settings.py": _File("services/common/settings.py.j2"),
    "services/common/storage.py": _File("services/common/storage.py.j2"),
    "services/common/events.py": _File("services/common/events.py.j2"),
    "services/common/sample.py": _File("services/common/sample.py.j2"),
    "services/common/schema.py": _File("services/common/schema.py.j2"),
    "services/common/registry.py": _File("services/common/registry.py.j2"),
    "services/common/distribution.py": _File("services/common/distribution.py.j2"),
    "services/ingest/__init__.py": _File("services/ingest/__init__.py.j2"),
    "services/ingest/__main__.py": _File("services/ingest/__main__.py.j2"),
    "services/ingest/batch.py": _File("services/ingest/batch.py.j2"),
    "services/ingest/stream.py": _File("services/ingest/stream.py.j2", "streaming"),
    "services/ingest/lambda_handler.py": _File(
        "services/ingest/lambda_handler.py.j2", "transform_lambda"
    ),
    "services/feature/__init__.py": _File("services/feature/__init__.py.j2"),
    "services/feature/__main__.py": _File("services/feature/__main__.py.j2"),
    "services/feature/features.py": _File("services/feature/features.py.j2"),
    "services/train/__init__.py": _File("services/train/__init__.py.j2"),
    "services/train/__main__.py": _File("services/train/__main__.py.j2"),
    "services/train/model.py": _File("services/train/model.py.j2"),
    "services/train/train.py": _File("services/train/train.py.j2"),
    "services/train/evaluate.py": _File("services/train/evaluate.py.j2"),
    "services/train/package.py": _File("services/train/package.py.j2", "register_in_code"),
    "services/serve/__init__.py": _File("services/serve/__init__.py.j2"),
    "services/serve/__main__.py": _File("services/serve/__main__.py.j2"),
    "services/serve/app.py": _File("services/serve/app.py.j2"),
    "services/serve/batch.py": _File("services/serve/batch.py.j2"),
    "services/serve/loader.py": _File("services/serve/loader.py.j2"),
    "services/serve/handler.py": _File("services/serve/handler.py.j2", "lambda_handler"),
    "services/serve/sagemaker.py": _File("services/serve/sagemaker.py.j2", "sagemaker"),
    "services/serve/retrieve.py": _File("services/serve/retrieve.py.j2", "rag"),
    "services/observe/__init__.py": _File("services/observe/__init__.py.j2"),
    "services/observe/__main__.py": _File("services/observe/__main__.py.j2"),
    "services/observe/drift.py": _File("services/observe/drift.py.j2"),
    "services/govern/__init__.py": _File("services/govern/__init__.py.j2", "govern"),
    "services/govern/retention.py": _File("services/govern/retention.py.j2", "govern"),
    "services/govern/card.py": _File("services/govern/card.py.j2", "govern"),
    "tests/__init__.py": _File("tests/__init__.py.j2"),
    "tests/conftest.py": _File("tests/conftest.py.j2"),
    "tests/test_storage.py": _File("tests/test_storage.py.j2"),
    "tests/test_ingest.py": _File("tests/test_ingest.py.j2"),
    "tests/test_features.py": _File("tests/test_features.py.j2"),
    "tests/test_train.py": _File("tests/test_train.py.j2"),
    "tests/test_serve.py": _File("tests/test_serve.py.j2"),
    "tests/test_observe.py": _File("tests/test_observe.py.j2"),
    "tests/test_govern.py": _File("tests/test_govern.py.j2", "govern"),
    "tests/test_pipeline.py": _File("tests/test_pipeline.py.j2"),
    "tests/test_jobs.py": _File("tests/test_jobs.py.j2", "job_landing"),
    "tests/test_plan.py": _File("tests/test_plan.py.j2"),
}


def _py(value: Any) -> str:
    """A Python literal of a string, number, None or list of strings (JSON spelling,
    which Python reads the same for these)."""
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    return json.dumps(value, ensure_ascii=True)


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # the output is code and Markdown, not HTML
    )
    env.filters["py"] = _py
    return env


def _slug(text: str) -> str:
    return _SAFE.sub("-", text.lower()).strip("-") or "project"


def _one_line(text: str, limit: int) -> str:
    """``text`` on one line, without quotes or table bars, at most ``limit`` characters."""
    flat = " ".join(text.split())
    for bad, good in (('"', "'"), ("|", "/"), ("`", "'"), ("\\", "/")):
        flat = flat.replace(bad, good)
    return flat[:limit].rstrip()


def _infra_doc(infra_paths: Collection[str], images: bool = True) -> tuple[str, str, list[str]]:
    """What ``infra/`` holds and how to apply it: (layout, intro, shell lines); with
    ``images``, the plan passes the root's ``image_tag`` (the commit CI pushes)."""
    if "infra/main.tf" in infra_paths:
        backend = "infra/backend.s3.tfbackend.example"
        steps = ["cd infra"]
        if backend in infra_paths:
            steps += [
                "cp backend.s3.tfbackend.example backend.s3.tfbackend  # your state bucket and lock table",
                "terraform init -backend-config=backend.s3.tfbackend",
            ]
        else:
            steps += ["terraform init -backend-config=<your backend settings>"]
        steps += [
            'terraform plan -out=tfplan -var "image_tag=$(git rev-parse HEAD)"'
            if images
            else "terraform plan -out=tfplan",
            "terraform apply tfplan",
        ]
        return (
            "the root module composes one module per capability (`infra/modules/`), "
            "in every region of the plan",
            "The root module in `infra/` holds every capability in every region; its state "
            "lives in S3 (partial backend configuration).",
            steps,
        )
    found = {p.split("/")[1] for p in infra_paths if p.count("/") == 2}
    stacks = [c for c in _PIPELINE_ORDER if c in found] + sorted(found - set(_PIPELINE_ORDER))
    steps = []
    for stack in stacks:
        steps += [
            f"terraform -chdir=infra/{stack} init -backend-config=<your backend settings>",
            f"terraform -chdir=infra/{stack} plan -out=tfplan && "
            f"terraform -chdir=infra/{stack} apply tfplan",
        ]
    return (
        "one stack per capability (`infra/<capability>/`)",
        "Each capability is its own Terraform stack under `infra/`; apply them in the "
        "pipeline's order.",
        steps,
    )


def _diagram(regions: list[str], present: list[str], patterns: dict[str, str]) -> dict[str, Any]:
    """Mermaid nodes per region and the edges of the data flow between them."""
    out_regions = []
    edges: list[str] = []
    for i, region in enumerate(regions):
        rid = f"r{i}"
        nodes = [
            {"id": f"{rid}_{cap}", "label": f"{cap}<br/>{patterns[cap]}"}
            for cap in _PIPELINE_ORDER
            if cap in present
        ]
        out_regions.append({"id": rid, "name": region, "nodes": nodes})
        entry = next((c for c in _PIPELINE_ORDER if c in present), None)
        if entry is not None:
            edges.append(f"sources -->|events| {rid}_{entry}")
        for src, dst, label in _links(present):
            edges.append(f"{rid}_{src} -->|{label}| {rid}_{dst}")
        if "govern" in present:
            for target in ("store", "train"):
                if target in present:
                    edges.append(f"{rid}_govern -.->|access, retention, audit| {rid}_{target}")
        if "serve" in present:
            edges.append(f"{rid}_serve -->|scores| clients")
    return {"regions": out_regions, "edges": edges}


def _links(present: list[str]) -> Iterable[tuple[str, str, str]]:
    """The data-flow edges among the capabilities present; a missing middle capability
    is bridged (ingest straight to store when there is no transform pattern)."""
    seen: set[tuple[str, str]] = set()
    for src, dst, label in _FLOW:
        if src not in present:
            continue
        target = dst
        while target not in present:
            nxt = next((d for s, d, _ in _FLOW if s == target), None)
            if nxt is None:
                break
            target = nxt
        if target in present and target != src and (src, target) not in seen:
            seen.add((src, target))
            yield src, target, label


def _serve_doc(ctx: dict[str, Any]) -> str:
    parts = ["FastAPI service (`/healthz`, `/slo`"]
    if ctx["online"]:
        parts.append(", `/predict`")
    if ctx["batch"]:
        parts.append(", `/score-batch`")
    if ctx["sagemaker"]:
        parts.append(", SageMaker's `/ping` and `/invocations`")
    if ctx["rag"]:
        parts.append(", `/retrieve`")
    parts.append("), batch scoring job")
    if ctx["lambda_handler"]:
        parts.append(", AWS Lambda handler")
    return "".join(parts)


#: Glue jobs of each pattern that runs them (the Terraform's ``glue_job`` names).
GLUE_JOBS: dict[str, str] = {
    "transform:glue-etl": "transform",
    "feature:glue-offline-features": "features",
}
#: EMR Serverless job runs of each pattern that submits them (``jobs/emr/<name>.py``, the
#: entry point its Terraform's scheduled StartJobRun names).
EMR_JOBS: dict[str, str] = {"transform:emr-serverless-spark": "transform"}
#: The Python and uv the EMR job image adds to its base, the EMR release the application
#: runs (:data:`activities.design.infra.EMR_RELEASE`; EMR 7's own Python is 3.9).
EMR_JOB_PYTHON = "3.11.9"
EMR_IMAGE_UV = "0.13.10"
#: Patterns whose Terraform runs an image of an ECR repository (capability -> image).
ECR_IMAGES: dict[str, str] = {
    "serve:ecs-fargate-fastapi": "serve",
    "serve:sagemaker-batch-transform": "serve",
    "serve:lambda-serverless": "serve",
    "transform:kinesis-lambda": "transform",
    "transform:emr-serverless-spark": "transform",
    "train:ecs-fargate-jobs": "train",
    "train:sagemaker-training": "train",
    "train:sagemaker-gpu-training": "train",
    "govern:mlflow-registry": "mlflow",
}


def _pushes(slug: str, regions: list[str], patterns: dict[str, str]) -> list[dict[str, str]]:
    """One CI push per image the Terraform runs and region: the Dockerfile and the ECR
    repository (``<name prefix>/<image>``, as the module declares it)."""
    return [
        {
            "service": image,
            "dockerfile": f"services/{image}/Dockerfile",
            "region": region,
            "repository": f"{name_prefix(slug, region)}/{image}",
        }
        for region in regions
        for image in _images(patterns)
    ]


def _images(patterns: dict[str, str]) -> list[str]:
    """The services CI builds as container images: exactly those the Terraform runs from
    an ECR repository (:data:`ECR_IMAGES`), the ones the ``push`` job pushes. The ``images``
    job builds them on every change, so a pull request sees a broken Dockerfile before
    ``main`` pushes it. Nothing else is built: MSK's ingest (``ingest:msk-kafka``) runs no
    container (its consumer is the ``transform`` Lambda function), so it gets no image.
    An image wanted only to be tested would be built and then run by CI (``docker run``)
    in the same job, which the wiring's ``images`` rule accepts."""
    return sorted({ECR_IMAGES[p] for p in patterns.values() if p in ECR_IMAGES})


def _dockerfile(service: str, ctx: dict[str, Any]) -> str:
    env = _environment()
    pattern = ctx["patterns_by_cap"].get(service) or "library"
    image = f"{ctx['slug'][:40]}-{service}"
    if service == "mlflow":
        boto3 = next(r for r in RUNTIME_REQUIREMENTS if r.startswith("boto3=="))
        return env.get_template("docker/mlflow.Dockerfile.j2").render(
            pattern=ctx["patterns_by_cap"]["govern"],
            image=image,
            boto3=boto3,
            mlflow=MLFLOW_SERVER_REQUIREMENT,
        )

    def render(template: str, **more: Any) -> str:
        return env.get_template(f"docker/{template}.Dockerfile.j2").render(
            service=service, pattern=pattern, image=image, **more
        )

    if service == "transform" and pattern in EMR_JOBS:
        return render("emr", release=EMR_RELEASE, python=EMR_JOB_PYTHON, uv=EMR_IMAGE_UV)
    if service == "transform":
        return render("lambda", handler="services.ingest.lambda_handler.handler")
    if service == "serve" and ctx["lambda_handler"]:
        return render("lambda", handler="services.serve.handler.lambda_handler")
    if service == "serve":
        http, health = True, "ping" if ctx["sagemaker"] else "healthz"
        if ctx["sagemaker"]:
            entrypoint, cmd = '["python", "-m", "services.serve.sagemaker"]', '["serve"]'
        else:
            entrypoint = ""
            cmd = '["uvicorn", "services.serve.app:app", "--host", "0.0.0.0", "--port", "8080"]'
    elif (
        service == "train"
        and pattern == "train:ecs-fargate-jobs"
        and drift_runner(ctx["patterns_by_cap"])
    ):
        # ECS training: the command, not an entry point, so that the daily drift
        # schedule's container override (python -m services.observe) replaces it.
        http, health = False, ""
        entrypoint, cmd = "", f'["python", "-m", "services.{service}"]'
    else:
        http, health = False, ""
        entrypoint, cmd = f'["python", "-m", "services.{service}"]', ""
    return render("python", http=http, health_path=health, entrypoint=entrypoint, cmd=cmd)


def _metrics_sink(observe: str) -> str:
    """Where the observe pattern's metrics go: managed Prometheus, CloudWatch or the store."""
    if observe == "observe:amp-grafana":
        return "prometheus"
    if observe.startswith(("observe:cloudwatch", "observe:sagemaker")):
        return "cloudwatch"
    return "store"


_METRICS_SINK_DOC = {
    "cloudwatch": "CloudWatch for the observe pattern",
    "prometheus": "Prometheus text for managed Prometheus",
    "store": "to the object store",
}


def _naming_context(req: CodeGenRequest) -> dict[str, Any]:
    """The project's names: title, slug, decision set, catalog, cloud and regions."""
    plan = req.plan
    title = req.project.strip() or _slug(req.project)
    slug = _slug(req.project)
    return {
        "project": req.project,
        "title": _one_line(title, 200),
        "short_title": _one_line(title, 60),
        "slug": slug,
        "short_slug": slug[:60],
        "decision_set": req.decision_set,
        "short_ds": _one_line(req.decision_set, 60),
        "catalog_version": plan.catalog_version,
        "cloud": plan.cloud.value,
        "regions": list(plan.regions) or [DEFAULT_REGION],
        "regions_stated": ", ".join(plan.regions) or f"not stated ({DEFAULT_REGION} assumed)",
    }


def _shape_context(req: CodeGenRequest, patterns: dict[str, str]) -> dict[str, Any]:
    """What the plan runs: workloads, patterns, packages and the flags templates branch on."""
    plan = req.plan
    by_id = req.catalog.by_id() if req.catalog is not None else {}
    online = WorkloadType.ONLINE in plan.workloads
    serve_pattern = patterns.get("serve", "")
    sagemaker = serve_pattern.startswith("serve:sagemaker")
    ingest = patterns.get("ingest", "")
    kinesis = ingest == "ingest:kinesis-streams"
    kafka = ingest == "ingest:msk-kafka"
    metrics_sink = _metrics_sink(patterns.get("observe", ""))
    return {
        "workloads": [w.value for w in plan.workloads],
        "patterns": sorted(patterns.items()),
        "patterns_by_cap": {c: patterns.get(c, "") for c in _PIPELINE_ORDER},
        "pattern_ids": sorted(patterns.values()),
        "packages": [*CORE_PACKAGES, *(["govern"] if "govern" in patterns else [])],
        "online": online,
        "batch": WorkloadType.BATCH in plan.workloads or not online or sagemaker,
        "streaming": WorkloadType.STREAMING in plan.workloads or kinesis or kafka,
        "kinesis": kinesis,
        "kafka": kafka,
        "rag": "store:opensearch-vector" in patterns.values(),
        "sagemaker": sagemaker,
        "lambda_handler": serve_pattern == "serve:lambda-serverless",
        "transform_lambda": patterns.get("transform") == "transform:kinesis-lambda",
        "govern": "govern" in patterns,
        "http_service": serve_pattern != "serve:lambda-serverless",
        "serve_pattern": serve_pattern,
        "serve_summary": _one_line(
            by_id[serve_pattern].summary if serve_pattern in by_id else serve_pattern, 80
        ),
        "metrics_sink": metrics_sink,
        "metrics_sink_doc": _METRICS_SINK_DOC[metrics_sink],
    }


def _constraints_context(req: CodeGenRequest, online: bool, kafka: bool) -> dict[str, Any]:
    """The constraints the code enforces (latency, retention, classification) and the
    dependencies it pins."""
    constraints = req.constraints
    latency = constraints.sla_latency_ms if online else None
    retention = constraints.retention_days or DEFAULT_RETENTION_DAYS
    untyped = [
        "boto3",
        "boto3.*",
        "botocore",
        "botocore.*",
        "sklearn",
        "sklearn.*",
        "pandas",
        "pandas.*",
    ]
    if kafka:
        untyped += ["confluent_kafka", "confluent_kafka.*"]
    return {
        "latency_slo_ms": latency,
        "latency_text": f"{latency} ms" if latency is not None else "none (no online serving)",
        "availability_target": constraints.availability_target,
        "retention_days": retention,
        # The pipeline's windows never reach past what retention keeps.
        "window_days": min(30, retention),
        "recent_days": min(7, retention),
        "data_classification": (
            constraints.data_classification.value if constraints.data_classification else None
        ),
        "compliance": [c.value for c in constraints.compliance],
        "requirements": sorted([*RUNTIME_REQUIREMENTS, *([KAFKA_REQUIREMENT] if kafka else [])]),
        "dev_requirements": list(DEV_REQUIREMENTS),
        # What a model logged to MLflow needs to load, stated: MLflow infers it otherwise by
        # loading the model in a subprocess (log+register 14.4 -> 4.2 s on sqlite here).
        "model_requirements": [
            r
            for r in RUNTIME_REQUIREMENTS
            if r.split("==")[0] in ("numpy", "pandas", "scikit-learn")
        ],
        "untyped_modules": untyped,
    }


#: Registries a plan may name: MLflow (``govern:mlflow-registry``), SageMaker model
#: packages (a SageMaker training or registry pattern), else the JSON registry in the store.
_SAGEMAKER_REGISTRY = ("govern:model-registry-config", "train:sagemaker-")


def _registry(patterns: dict[str, str]) -> str:
    chosen = set(patterns.values())
    if "govern:mlflow-registry" in chosen:
        return "mlflow"
    if any(p.startswith(_SAGEMAKER_REGISTRY) for p in chosen):
        return "sagemaker"
    return "json"


#: Forecasting's lag features: the target 1 and 7 days before, and its mean over the
#: last 7 days (all before the record's day), beside the day of the week.
FORECAST_FEATURES: tuple[tuple[str, str], ...] = (
    ("lag_1", "number"),
    ("lag_7", "number"),
    ("mean_7", "number"),
    ("day_of_week", "integer"),
)


def _data_context(spec: DataSpec, stated: bool) -> dict[str, Any]:
    """The data the generated pipeline reads: its columns, target, task and features.

    A retrieval task keeps the retrieval route as it is; its tabular pipeline still needs
    a target, so it trains on the stated default schema's sample (the README says so)."""
    retrieval = spec.task == Task.RETRIEVAL
    if retrieval:
        spec, stated = DEFAULT_DATA_SPEC, False
    columns = [
        {
            "name": c.name,
            "type": c.type.value,
            "categories": list(c.categories)
            or (["a", "b", "c"] if c.type == ColumnType.CATEGORY else []),
        }
        for c in spec.columns
    ]
    features = [
        {"name": c["name"], "type": c["type"]}
        for c in columns
        if c["name"] != spec.target and c["type"] != ColumnType.TEXT.value
    ]
    series = None
    if spec.task == Task.FORECASTING:
        series = next((f["name"] for f in features if f["type"] == "category"), None)
        features += [{"name": n, "type": t} for n, t in FORECAST_FEATURES]
    target_type = next(c["type"] for c in columns if c["name"] == spec.target)
    return {
        "data_columns": columns,
        "data_target": spec.target,
        "data_target_type": target_type,
        "data_task": spec.task.value,
        "data_features": features,
        "data_series": series,
        "data_stated": stated,
        "data_retrieval": retrieval,
        "data_sample_csv": spec.sample_csv,
        "data_time_column": spec.time_column,
        "data_metric": "auc" if spec.task == Task.CLASSIFICATION else "r2",
    }


def _capability_rows(req: CodeGenRequest, patterns: dict[str, str]) -> list[dict[str, str]]:
    """The README's table: each capability present, its pattern, summary and code."""
    by_id = req.catalog.by_id() if req.catalog is not None else {}
    return [
        {
            "capability": cap,
            "pattern": patterns[cap],
            "summary": _one_line(by_id[patterns[cap]].summary, 120)
            if patterns[cap] in by_id
            else "",
            "code": ", ".join(
                f"`services/{p}/`" for p, caps in PACKAGE_CAPABILITIES.items() if cap in caps
            )
            or "",
        }
        for cap in _PIPELINE_ORDER
        if cap in patterns
    ]


def _rationale(req: CodeGenRequest) -> str:
    rationale = req.rationale_md.strip()
    if rationale and not rationale.startswith("## Design Rationale"):
        rationale = "## Design Rationale\n\n" + rationale
    return rationale


def app_context(req: CodeGenRequest, infra_paths: Collection[str] = ()) -> dict[str, Any]:
    """Everything the templates read, derived from the request alone."""
    plan = req.plan
    patterns = {c.capability.value: c.pattern_id for c in plan.choices}
    ctx: dict[str, Any] = {**_naming_context(req), **_shape_context(req, patterns)}
    ctx["registry"] = _registry(patterns)
    # SageMaker model packages: a SageMaker training job runs network-isolated, so its
    # state machine publishes the job's archive and registers it after the job; other
    # training registers it in code (boto3, its task role allowed
    # sagemaker:CreateModelPackage).
    ctx["register_in_code"] = ctx["registry"] == "sagemaker" and not patterns.get(
        "train", ""
    ).startswith("train:sagemaker-")
    # A SageMaker training job runs the image under the container contract: the
    # training set from /opt/ml/input/data/train, the model to /opt/ml/model.
    ctx["sagemaker_training"] = patterns.get("train", "").startswith("train:sagemaker-")
    # Its train channel: the models bucket's prefix the transform also lands in.
    ctx["training_set_prefix"] = TRAINING_SET_PREFIX
    # The transform job (Glue, or EMR Serverless's job run) lands the batch ingest's files
    # in raw/ (jobs/<runner>/transform.py).
    ctx["job_landing"] = landing_reader(patterns)
    ctx["job_runner"] = "emr" if patterns.get("transform") in EMR_JOBS else "glue"
    # Promotion publishes model.tar.gz where SageMaker reads it: the batch transform's
    # ModelDataUrl, the archive the code registers as a model package.
    ctx["model_archive"] = bool(ctx["sagemaker"]) or ctx["register_in_code"]
    # With a SageMaker training job, its state machine publishes the job's model.tar.gz
    # there instead (the job cannot reach S3), all that ECS or Lambda serving then finds
    # under DATA_URI: the code reads it (archive_files) but never writes it.
    ctx["read_archive"] = ctx["model_archive"] or ctx["sagemaker_training"]
    ctx.update(_constraints_context(req, online=ctx["online"], kafka=ctx["kafka"]))
    if ctx["registry"] == "mlflow":
        ctx["requirements"] = sorted([*ctx["requirements"], MLFLOW_REQUIREMENT])
    ctx.update(_data_context(*data_spec(req.constraints)))
    present = [c for c in _PIPELINE_ORDER if c in patterns]
    ctx["steps"] = present or ["ingest"]
    ctx["serve_doc"] = _serve_doc(ctx)
    ctx["images"] = _images(patterns)
    ctx["pushes"] = _pushes(ctx["slug"], ctx["regions"], patterns)
    ctx["glue_jobs"] = [
        {"job": job, "pattern": pid, "runner": "glue"}
        for pid, job in GLUE_JOBS.items()
        if pid in patterns.values()
    ] + [
        {"job": job, "pattern": pid, "runner": "emr"}
        for pid, job in EMR_JOBS.items()
        if pid in patterns.values()
    ]
    ctx["diagram"] = _diagram(ctx["regions"], present, patterns)
    ctx["capability_rows"] = _capability_rows(req, patterns)
    ctx["gaps"] = [
        {"capability": g.capability.value, "detail": _one_line(g.detail, 200)} for g in plan.gaps
    ]
    layout, intro, steps = _infra_doc(infra_paths, images=bool(ctx["pushes"]))
    ctx["infra_doc"], ctx["deploy_infra_intro"], ctx["terraform_steps"] = layout, intro, steps
    ctx["has_tf_workflow"] = ".github/workflows/terraform.yml" in infra_paths
    ctx.update(_cost_context(req))
    ctx["policy"] = req.policy
    ctx["rationale"] = _rationale(req)
    return ctx


def _cost_context(req: CodeGenRequest) -> dict[str, Any]:
    cost = req.cost
    by_region: dict[str, float] = {}
    for line in cost.breakdown:
        region = line.region or "all regions"
        by_region[region] = by_region.get(region, 0.0) + line.usd
    table = cost.prices
    note = ""
    if table.get("version"):
        note = (
            f"Prices: `{table['version']}`"
            + (f", as of {table['as_of']}" if table.get("as_of") else "")
            + ": list prices copied by hand, not fetched (`reports/cost.json` names each "
            "line's source and formula)."
        )
    assumed = "; ".join(f"{v.name} = {v.value:g} {v.unit}".strip() for v in cost.assumed)
    return {
        "cost": cost,
        "cost_by_region": sorted((r, round(u, 2)) for r, u in by_region.items()),
        "assumed": assumed,
        "price_note": note,
    }


def render_app(req: CodeGenRequest, infra_paths: Collection[str] = ()) -> dict[str, str]:
    """The application part of the repository for ``req`` as ``{path: text}``.

    ``infra_paths`` are the Terraform paths rendered beside it (the README's deploy steps
    and layout follow them).
    """
    ctx = app_context(req, infra_paths)
    env = _environment()
    files: dict[str, str] = {}
    for path, spec in _FILES.items():
        if spec.when and not ctx[spec.when]:
            continue
        files[path] = env.get_template(spec.template).render(ctx)
    for service in ctx["images"]:
        files[f"services/{service}/Dockerfile"] = _dockerfile(service, ctx)
    if ctx["data_sample_csv"] is not None:
        files["samples/sample.csv"] = ctx["data_sample_csv"]
    for job in ctx["glue_jobs"]:
        files[f"jobs/{job['runner']}/{job['job']}.py"] = env.get_template(
            "jobs/glue/job.py.j2"
        ).render({**ctx, **job})
    return files


__all__ = ["TEMPLATES", "app_context", "render_app"]
