"""The SRL actor pool's configuration (``configs/vllm_actors.yaml``) and ``vllm serve`` command lines.

Pure: this module validates text and builds argv lists; ``activities/actors.py`` runs the
pool over HTTP and ``keel actors serve`` starts the processes. See docs/srl-actors.md.
"""

from __future__ import annotations

import re
import shlex
from typing import Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from keel.ids import SHORT_ID_PATTERN
from keel.problems import problems
from keel.srl.errors import ActorsConfigError

NAME_PATTERN = SHORT_ID_PATTERN
# scheme, host (a name, IPv4, or [IPv6]), optional port, path; no query or fragment.
_URL = re.compile(r"^(https?)://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::(\d{1,5}))?(/[^?#\s]*)$")

#: ``vllm serve`` flags :func:`vllm_command` sets from the endpoint's fields; ``extra_args``
#: may not set them again, or the two would disagree about where the actor listens.
MANAGED_FLAGS = (
    "--host",
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--quantization",
    "-q",
    "--max-model-len",
)


class ActorEndpoint(BaseModel):
    """One OpenAI-compatible actor server: in production one ``vllm serve`` per GPU.

    ``base_url`` is where the pool sends requests (``http://host:port/v1``); ``bind_host``
    is the address ``keel actors serve`` makes vLLM listen on (loopback unless set).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN)
    base_url: str
    model: str = Field(min_length=1)
    gpu: int | None = Field(default=None, ge=0)
    port: int = Field(ge=1, le=65535)
    bind_host: str = "127.0.0.1"
    quantization: str | None = Field(default=None, pattern=r"^[a-z0-9_-]+$")
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    max_model_len: int | None = Field(default=None, ge=16)
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("base_url")
    @classmethod
    def _http_v1(cls, v: str) -> str:
        m = _URL.match(v)
        if m is None:
            raise ValueError(
                "must be an http(s) URL like http://127.0.0.1:8001/v1 (no query or fragment)"
            )
        if not m.group(4).rstrip("/").endswith("/v1"):
            raise ValueError("must end in /v1 (the OpenAI-compatible prefix)")
        return v.rstrip("/")

    @field_validator("extra_args")
    @classmethod
    def _no_managed_flags(cls, v: list[str]) -> list[str]:
        for arg in v:
            flag = arg.split("=", 1)[0]
            if flag in MANAGED_FLAGS:
                raise ValueError(
                    f"{flag} is set from the endpoint's own fields "
                    "(port, bind_host, tensor_parallel_size, quantization, max_model_len)"
                )
        return v

    @model_validator(mode="after")
    def _port_matches_url(self) -> Self:
        m = _URL.match(self.base_url)
        url_port = int(m.group(3)) if m is not None and m.group(3) else None
        if url_port is not None and url_port != self.port:
            raise ValueError(f"base_url port {url_port} differs from port {self.port}")
        return self

    @property
    def root_url(self) -> str:
        """The server's root (``base_url`` without ``/v1``), where vLLM has ``/health``."""
        return self.base_url[: -len("/v1")]

    @property
    def gpus(self) -> list[int] | None:
        """The GPUs this actor uses: ``tensor_parallel_size`` of them from ``gpu`` on."""
        if self.gpu is None:
            return None
        return list(range(self.gpu, self.gpu + self.tensor_parallel_size))


class ActorsConfig(BaseModel):
    """The whole actors config: the endpoints and the pool's timings (seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    endpoints: list[ActorEndpoint] = Field(min_length=1)
    health_interval_s: float = Field(default=15.0, gt=0, le=3600)
    retry_dead_after_s: float = Field(default=60.0, gt=0, le=86400)
    request_timeout_s: float = Field(default=120.0, gt=0, le=3600)

    @model_validator(mode="after")
    def _distinct(self) -> Self:
        problems = []
        for label, key in (
            ("name", lambda e: e.name),
            ("base_url", lambda e: e.base_url),
        ):
            seen: set[str] = set()
            for e in self.endpoints:
                k = key(e)
                if k in seen:
                    problems.append(f"two endpoints have {label} {k!r}")
                seen.add(k)
        # Two actors on one GPU would each size its KV cache for the whole card.
        owner: dict[int, str] = {}
        for e in self.endpoints:
            for g in e.gpus or []:
                if g in owner:
                    problems.append(f"GPU {g} is given to both {owner[g]!r} and {e.name!r}")
                owner[g] = e.name
        if problems:
            raise ValueError("; ".join(problems))
        return self


def parse_actors_config(text: str, path: str = "actors config") -> ActorsConfig:
    """Validate the YAML text of an actors config (``path`` names it in messages).

    Raises:
        ActorsConfigError: not YAML, not a mapping, or a field that does not validate;
            the message names each offending key (``endpoints.1.port``).
    """
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ActorsConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ActorsConfigError(f"{path}: expected a mapping with 'endpoints'")
    try:
        return ActorsConfig.model_validate(raw)
    except ValidationError as e:
        raise ActorsConfigError(f"{path}: invalid actors config: {problems(e)}") from None


def vllm_command(endpoint: ActorEndpoint, vllm: str = "vllm") -> list[str]:
    """The ``vllm serve`` argv for ``endpoint`` (the GPU choice is in :func:`vllm_env`)."""
    argv = [
        vllm, "serve", endpoint.model,
        "--host", endpoint.bind_host,
        "--port", str(endpoint.port),
        "--tensor-parallel-size", str(endpoint.tensor_parallel_size),
    ]  # fmt: skip
    if endpoint.quantization is not None:
        argv += ["--quantization", endpoint.quantization]
    if endpoint.max_model_len is not None:
        argv += ["--max-model-len", str(endpoint.max_model_len)]
    return argv + list(endpoint.extra_args)


def vllm_env(endpoint: ActorEndpoint) -> dict[str, str]:
    """Environment for the endpoint's process: ``CUDA_VISIBLE_DEVICES`` when it names a GPU."""
    gpus = endpoint.gpus
    if gpus is None:
        return {}
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


def shell_line(endpoint: ActorEndpoint, vllm: str = "vllm") -> str:
    """The command as one shell line (environment first), for ``--dry-run`` and docs."""
    env = " ".join(f"{k}={v}" for k, v in vllm_env(endpoint).items())
    argv = shlex.join(vllm_command(endpoint, vllm))
    return f"{env} {argv}" if env else argv
