"""The generated application (activities/design/app.py): complete per capability for every
plan shape, what varies with the plan, deterministic, and valid Python everywhere.

The validators' verdict on these trees (ruff, mypy, pytest in the jail, hadolint,
actionlint, ...) is in tests/design/integration/test_validators.py.
"""

from __future__ import annotations

import ast
import re
import tomllib

import pytest
import yaml

from activities.design.app import (
    CORE_PACKAGES,
    DEV_REQUIREMENTS,
    KAFKA_REQUIREMENT,
    MLFLOW_REQUIREMENT,
    RUNTIME_REQUIREMENTS,
    TEMPLATES,
    app_context,
    render_app,
)
from activities.design.codegen import CodeGenRequest, render_request
from keel.design.patterns import Capability
from keel.design.planner import Gap
from tests.design.codegen_cases import CASES, FORMS, request_for, request_for_form, request_from

SHAPES = [*CASES, *FORMS]

#: Modules every package ships, whatever the plan.
CORE_FILES = (
    "services/common/settings.py",
    "services/common/storage.py",
    "services/common/events.py",
    "services/common/sample.py",
    "services/common/schema.py",
    "services/common/registry.py",
    "services/common/distribution.py",
    "services/ingest/batch.py",
    "services/ingest/__main__.py",
    "services/feature/features.py",
    "services/feature/__main__.py",
    "services/train/model.py",
    "services/train/train.py",
    "services/train/evaluate.py",
    "services/train/__main__.py",
    "services/serve/app.py",
    "services/serve/batch.py",
    "services/serve/loader.py",
    "services/serve/__main__.py",
    "services/observe/drift.py",
    "services/observe/__main__.py",
    "services/pipeline.py",
    "tests/conftest.py",
    "tests/test_storage.py",
    "tests/test_ingest.py",
    "tests/test_features.py",
    "tests/test_train.py",
    "tests/test_serve.py",
    "tests/test_observe.py",
    "tests/test_pipeline.py",
    "tests/test_plan.py",
    "pyproject.toml",
    "requirements.txt",
    "requirements-dev.txt",
    "README.md",
    ".github/workflows/ci.yml",
    ".dockerignore",
    ".gitignore",
)


def _request(shape: str) -> CodeGenRequest:
    return request_for(shape) if shape in CASES else request_for_form(shape)


def _tests_in(text: str) -> set[str]:
    return {n.name for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("shape", SHAPES)
def test_every_capability_has_its_code_tests_and_images(shape: str) -> None:
    req = _request(shape)
    files = render_request(req)
    patterns = {c.capability.value: c.pattern_id for c in req.plan.choices}
    for path in CORE_FILES:
        assert path in files, path
    for package in CORE_PACKAGES:
        assert f"services/{package}/__init__.py" in files
    assert ("services/govern/retention.py" in files) == ("govern" in patterns)
    assert ("tests/test_govern.py" in files) == ("govern" in patterns)
    # Settings carry the plan: every region, every chosen pattern.
    settings = files["services/common/settings.py"]
    tree = ast.parse(settings)
    consts = {
        t.id: ast.literal_eval(n.value)
        for n in tree.body
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None
        for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)
        if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant | ast.Tuple | ast.Dict)
    }
    assert consts["REGIONS"] == tuple(req.plan.regions or ["us-east-1"])
    assert consts["PATTERNS"] == patterns
    # Every service that is a container has a Dockerfile, and CI builds each of them.
    dockerfiles = sorted(p.split("/")[1] for p in files if p.endswith("/Dockerfile"))
    assert "serve" in dockerfiles and "train" in dockerfiles
    ci = yaml.safe_load(files[".github/workflows/ci.yml"])
    assert ci["jobs"]["images"]["strategy"]["matrix"]["service"] == dockerfiles
    steps = [s.get("run", "") for s in ci["jobs"]["test"]["steps"]]
    assert "ruff check ." in steps and "mypy" in steps and "pytest -q" in steps
    assert "Dockerfile" not in files  # one per service, built from the repository root
    # Each package has tests the generated CI runs.
    assert _tests_in(files["tests/test_ingest.py"]) >= {"test_events_land_by_date_sorted"}
    assert _tests_in(files["tests/test_train.py"]) >= {"test_trained_model_meets_the_gate"}
    assert _tests_in(files["tests/test_observe.py"]) >= {"test_shifted_data_is_reported_as_drift"}
    assert _tests_in(files["tests/test_pipeline.py"]) >= {
        "test_pipeline_trains_promotes_scores_and_monitors"
    }


@pytest.mark.parametrize("shape", SHAPES)
def test_generated_python_parses_and_no_template_syntax_is_left(shape: str) -> None:
    files = render_request(_request(shape))
    for path, text in files.items():
        if path.endswith(".py"):
            ast.parse(text, filename=path)
        # Workflows keep GitHub's ${{ }}; Terraform keeps Prometheus alert templates
        # ({{ $labels.job }}), which test_infra checks as HCL.
        if not path.startswith((".github/workflows/", "infra/")):
            assert "{{" not in text and "{%" not in text, path
        elif path.startswith("infra/"):
            assert "{%" not in text and "{{ " not in text.replace("{{ $labels", ""), path
    # The CI's own expressions survive the templating.
    assert "${{ matrix.service }}" in files[".github/workflows/ci.yml"]
    tomllib.loads(files["pyproject.toml"])


@pytest.mark.parametrize("shape", SHAPES)
def test_same_request_same_bytes(shape: str) -> None:
    assert render_app(_request(shape)) == render_app(_request(shape))


def test_batch_plan_scores_in_batches_behind_sagemakers_contract() -> None:
    files = render_request(request_for_form("batch_one_region_low"))
    app = files["services/serve/app.py"]
    assert '@app.post("/score-batch")' in app and '@app.post("/predict")' not in app
    assert '@app.post("/invocations")' in app and '@app.get("/ping")' in app
    assert "LATENCY_SLO_MS: int | None = None" in app
    assert "services/serve/sagemaker.py" in files
    docker = files["services/serve/Dockerfile"]
    assert 'ENTRYPOINT ["python", "-m", "services.serve.sagemaker"]' in docker
    assert "services/ingest/stream.py" not in files
    assert (
        "p95_score_ms" not in files["tests/test_train.py"]
        or "LATENCY_SLO_MS" in (files["tests/test_train.py"])
    )


def test_online_plan_exposes_predict_and_its_latency_target() -> None:
    files = render_request(request_for("online_serving_slo"))
    app = files["services/serve/app.py"]
    assert '@app.post("/predict")' in app and '@app.get("/slo")' in app
    assert "LATENCY_SLO_MS: int | None = 100" in app
    assert "LATENCY_SLO_MS: int | None = 100" in files["services/common/settings.py"]
    assert "p95 scoring time within the SLO" in files["README.md"]
    docker = files["services/serve/Dockerfile"]
    assert "uvicorn" in docker and "HEALTHCHECK --interval" in docker and "USER 10001" in docker


def test_rag_plan_retrieves_and_serves_from_lambda() -> None:
    files = render_request(request_for_form("online_rag_three_regions"))
    assert "services/serve/retrieve.py" in files
    assert '@app.post("/retrieve")' in files["services/serve/app.py"]
    assert "test_retrieve_ranks_the_nearest_passage_first" in _tests_in(
        files["tests/test_serve.py"]
    )
    assert "services/serve/handler.py" in files
    docker = files["services/serve/Dockerfile"]
    assert docker.splitlines()[2] == "FROM public.ecr.aws/lambda/python:3.11"
    assert 'CMD ["services.serve.handler.lambda_handler"]' in docker
    assert "OpenSearchIndex" in files["services/serve/retrieve.py"]


def test_streaming_plans_consume_from_their_stream() -> None:
    kafka = render_request(request_for_form("streaming_three_regions_high"))
    stream = kafka["services/ingest/stream.py"]
    assert "class KafkaSource" in stream and "class KinesisSource" not in stream
    assert KAFKA_REQUIREMENT in kafka["requirements.txt"].splitlines()
    assert "confluent_kafka" in kafka["pyproject.toml"]
    # MSK's consumer is the transform Lambda: no ingest image, since nothing would run it.
    assert "services/ingest/Dockerfile" not in kafka
    assert "test_stream_lands_in_micro_batches" in _tests_in(kafka["tests/test_ingest.py"])
    kinesis = render_request(request_for_form("kinesis_online_one_region"))
    stream = kinesis["services/ingest/stream.py"]
    assert "class KinesisSource" in stream and "class KafkaSource" not in stream
    assert KAFKA_REQUIREMENT not in kinesis["requirements.txt"]
    assert "services/ingest/Dockerfile" not in kinesis  # Kinesis is managed
    assert "test_kinesis_source_reads_a_shard" in _tests_in(kinesis["tests/test_ingest.py"])


def test_observe_pattern_picks_the_metrics_sink() -> None:
    amp = render_request(request_for("streaming_features"))["services/observe/drift.py"]
    assert "class PrometheusSink" in amp and "class CloudWatchSink" not in amp
    cw = render_request(request_for("batch_training"))["services/observe/drift.py"]
    assert "class CloudWatchSink" in cw and "class PrometheusSink" not in cw


@pytest.mark.parametrize(
    ("shape", "regions"),
    [
        ("batch_one_region_low", ["eu-west-1"]),
        ("streaming_three_regions_high", ["eu-west-1", "us-east-1", "us-west-2"]),
        ("online_rag_three_regions", ["eu-central-1", "eu-north-1", "eu-west-1"]),
    ],
)
def test_readme_diagram_has_every_region_and_capability(shape: str, regions: list[str]) -> None:
    req = request_for_form(shape)
    readme = render_request(req)["README.md"]
    diagram = readme.split("```mermaid\n", 1)[1].split("```", 1)[0]
    assert diagram.startswith("flowchart LR\n")
    subgraphs = re.findall(r'^  subgraph (r\d+)\["([^"]+)"\]$', diagram, re.M)
    assert [name for _, name in subgraphs] == regions
    for rid, _ in subgraphs:
        for choice in req.plan.choices:
            cap = choice.capability.value
            assert f'{rid}_{cap}["{cap}<br/>{choice.pattern_id}"]' in diagram
        assert f"sources -->|events| {rid}_ingest" in diagram
        assert f"{rid}_train -->|promoted model| {rid}_serve" in diagram
    # Deploy steps log in to every region's registry and build every image.
    for region in regions:
        assert f"aws ecr get-login-password --region {region}" in readme
    assert "init -backend-config=" in readme and "apply tfplan" in readme
    assert f"**${req.cost.monthly_usd:,.2f}**" in readme
    if len(regions) > 1:
        assert "| Region | USD/month |" in readme


def test_readme_follows_a_root_terraform_module() -> None:
    req = request_for_form("streaming_three_regions_high")
    root = render_app(
        req, infra_paths=["infra/main.tf", "infra/backend.s3.tfbackend.example", "infra/x.tf"]
    )["README.md"]
    assert "terraform init -backend-config=backend.s3.tfbackend" in root
    assert "cp backend.s3.tfbackend.example backend.s3.tfbackend" in root
    per_stack = render_app(req, infra_paths=["infra/ingest/main.tf", "infra/serve/main.tf"])
    assert "terraform -chdir=infra/ingest init" in per_stack["README.md"]


def test_a_gap_is_listed_and_the_code_still_renders() -> None:
    req = request_for("rag")
    gapped = req.model_copy(
        update={
            "plan": req.plan.model_copy(
                update={
                    "choices": [c for c in req.plan.choices if c.capability.value != "govern"],
                    "gaps": [
                        Gap(capability=Capability.GOVERN, detail="no pattern | fits", candidates=[])
                    ],
                }
            )
        }
    )
    files = render_request(gapped)
    assert "services/govern/retention.py" not in files
    assert "| govern | none | no pattern / fits | |" in files["README.md"]
    assert "govern" not in files["services/pipeline.py"]
    ast.parse(files["services/pipeline.py"])


@pytest.mark.parametrize(
    ("retention", "window", "recent"), [(None, 30, 7), (365, 30, 7), (14, 14, 7), (3, 3, 3)]
)
def test_windows_never_reach_past_retention(
    retention: int | None, window: int, recent: int
) -> None:
    form = {**FORMS["batch_one_region_low"], "retention_days": retention}
    settings = render_app(request_from(form, "retention"))["services/common/settings.py"]
    assert f"WINDOW_DAYS = {window}\n" in settings
    assert f"RECENT_DAYS = {recent}\n" in settings
    assert f"RETENTION_DAYS = {retention or 30}\n" in settings


def test_requirements_are_pinned_and_match_the_sbom_input() -> None:
    files = render_request(request_for("rag"))
    pins = files["requirements.txt"].splitlines()
    # The rag case registers models in MLflow (govern:mlflow-registry).
    assert pins == sorted([*RUNTIME_REQUIREMENTS, MLFLOW_REQUIREMENT])
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9.]+", p) for p in pins)
    dev = [ln for ln in files["requirements-dev.txt"].splitlines() if not ln.startswith("#")]
    assert dev == list(DEV_REQUIREMENTS)
    project = tomllib.loads(files["pyproject.toml"])["project"]
    assert project["dependencies"] == pins


def test_hostile_project_names_stay_inside_strings_and_comments() -> None:
    project = 'x"""; import os; os.system("id") #\\N{x}\n' + "y" * 180
    req = request_for("rag").model_copy(update={"project": project, "decision_set": "d'\"\\"})
    files = render_app(req)
    for path, text in files.items():
        if path.endswith(".py"):
            tree = ast.parse(text, filename=path)
            attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)]
            assert "system" not in attrs, path
    settings = files["services/common/settings.py"]
    assert max(len(ln) for ln in settings.splitlines()) <= 100
    tomllib.loads(files["pyproject.toml"])
    assert files["README.md"].startswith("# x'''; import os;")


def test_context_names_every_template_it_uses() -> None:
    ctx = app_context(request_for("hipaa_one_region"))
    assert ctx["regions"] == ["us-east-1"] and ctx["images"] == ["serve", "train"]
    used = {p.relative_to(TEMPLATES).as_posix() for p in TEMPLATES.rglob("*.j2")}
    assert "README.md.j2" in used and "docker/python.Dockerfile.j2" in used


def test_pins_are_the_versions_the_jailed_tests_import() -> None:
    """The validators run the generated tests against Keel's own environment: the pins
    the repository ships must be those versions (update them with uv.lock)."""
    from importlib.metadata import version

    for pin in (*RUNTIME_REQUIREMENTS, MLFLOW_REQUIREMENT, *DEV_REQUIREMENTS):
        name, wanted = pin.split("==")
        assert version(name) == wanted, pin


# ------------------------------------------------------------------ the data shape (§2)

_HOUSES = {
    "task": "regression",
    "target": "price",
    "columns": [
        {"name": "area_m2", "type": "number"},
        {"name": "city", "type": "category", "categories": ["paris", "lyon"]},
        {"name": "has_garden", "type": "boolean"},
        {"name": "price", "type": "number"},
    ],
}


def test_a_stated_data_spec_shapes_the_schema_the_request_model_and_the_gate() -> None:
    form = {**FORMS["kinesis_online_one_region"], "data": _HOUSES}
    files = render_app(request_from(form, "houses"))
    schema = files["services/common/schema.py"]
    assert 'TASK = "regression"' in schema and 'TARGET = "price"' in schema
    assert 'METRIC = "r2"' in schema and "SCHEMA_STATED = True" in schema
    tree = ast.parse(schema)
    features = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and ast.unparse(n.target) == "FEATURES"
    )
    assert ast.literal_eval(features) == ("area_m2", "city", "has_garden")
    app = files["services/serve/app.py"]
    for name in ("area_m2", "city", "has_garden"):
        assert f'alias="{name}"' in app
    assert "churned" not in "".join(files.values())
    assert "Ridge" in files["services/train/model.py"]
    assert "MIN_SCORE = 0.3" in files["services/common/settings.py"]


def test_without_a_data_spec_the_default_schema_is_stated_and_the_sample_called_synthetic() -> None:
    files = render_app(request_for("batch_training"))
    schema = files["services/common/schema.py"]
    assert "SCHEMA_STATED = False" in schema and 'TARGET = "churned"' in schema
    assert "No data schema was stated" in schema and "synthetic" in schema
    assert "LogisticRegression" in files["services/train/model.py"]
    assert "samples/sample.csv" not in files


def test_a_sample_csv_is_shipped_and_landed() -> None:
    sample = "area_m2,city,has_garden,price\n50,paris,true,300000\n80,lyon,false,250000\n"
    form = {**FORMS["empty_form"], "data": {**_HOUSES, "sample_csv": sample}}
    files = render_app(request_from(form, "houses-csv"))
    assert files["samples/sample.csv"] == sample
    assert "SAMPLE_CSV" in files["services/common/sample.py"]


@pytest.mark.parametrize(
    ("case", "registry"),
    [("rag", "mlflow"), ("streaming_features", "sagemaker"), ("batch_training", "json")],
)
def test_the_registry_is_the_one_the_plan_names(case: str, registry: str) -> None:
    files = render_app(request_for(case))
    assert f'REGISTRY = "{registry}"' in files["services/common/settings.py"]
    pins = files["requirements.txt"].splitlines()
    assert (MLFLOW_REQUIREMENT in pins) == (registry == "mlflow")
    if registry == "mlflow":
        text = files["services/common/registry.py"]
        assert 'serialization_format="cloudpickle"' in text and "sqlite:///" in text
        assert (
            'setdefault("MLFLOW_DISABLE_TELEMETRY", "true")' in files["services/common/settings.py"]
        )
