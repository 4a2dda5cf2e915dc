"""Codegen (§21.1 node 9): an approved plan to a repository, as a ``{path: text}`` map.

The embedded default is :func:`render_request`, deterministic (same request, same bytes):
the local model is too small to write a repository. Two providers share
:class:`CodeGenProvider`: :class:`LiteLLMProvider` (any model in the models config) and
:class:`AnthropicProvider` (the ``anthropic`` SDK) ask a model for a JSON object of files
and check it in the same call, so a bad answer fails the activity attempt, never the
workflow. Every path is checked by :func:`check_paths`: relative, no ``..``, no
backslashes or control characters.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from activities.design.app import render_app
from activities.design.infra import render_infra
from keel.design.codegen import CodeGenRequest
from keel.design.reasons import rationale_json
from keel.llm import LLMMessage, LLMRequest

if TYPE_CHECKING:
    from activities.llm import LLMGateway

#: Caps on what a model may hand back, checked before anything is written.
MAX_FILES = 200
MAX_FILE_BYTES = 256 * 1024
_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")
_SAFE_NAME = re.compile(r"[^a-z0-9]+")


class CodeGenError(ValueError):
    """A provider's output is not a usable repository (bad path, not a file map, too big)."""


class CodeGenProvider(Protocol):
    async def generate(self, request: CodeGenRequest) -> dict[str, str]: ...


def check_paths(files: Mapping[str, str]) -> dict[str, str]:
    """Return ``files`` (sorted by path) if every path is a safe relative POSIX path.

    Raises:
        CodeGenError: naming each bad path and why.
    """
    problems: list[str] = []
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, at most {MAX_FILES}")
    for path, text in files.items():
        if not isinstance(path, str) or not isinstance(text, str):
            problems.append(f"{path!r}: path and content must be strings")
            continue
        if not path or path.startswith("/") or _BAD_CHARS.search(path):
            problems.append(f"{path!r}: not a relative path")
            continue
        if any(seg in ("", ".", "..") for seg in path.split("/")):
            problems.append(f"{path!r}: '.' / '..' segments and empty names are not allowed")
            continue
        if len(text.encode()) > MAX_FILE_BYTES:
            problems.append(f"{path!r}: larger than {MAX_FILE_BYTES} bytes")
    if problems:
        raise CodeGenError("; ".join(problems))
    return {p: files[p] for p in sorted(files)}


def _slug(text: str) -> str:
    return _SAFE_NAME.sub("-", text.lower()).strip("-") or "project"


# ---------------------------------------------------------------------------- templates

_TF_WORKFLOW = """\
name: terraform
on:
  pull_request:
    paths: ["infra/**"]
permissions:
  contents: read
jobs:
  validate:
    runs-on: ubuntu-24.04
    steps:
      - uses: actions/checkout@v4
      - uses: hashicorp/setup-terraform@v3
        with:
          terraform_version: "1.9.5"
      - name: Format
        working-directory: infra
        run: terraform fmt -check -recursive
      - name: Validate (root and every capability module, every region)
        working-directory: infra
        run: |
          terraform init -backend=false
          terraform validate
"""


def render_request(req: CodeGenRequest) -> dict[str, str]:
    """The generated repository as ``{path: text}``, sorted by path; deterministic.

    Terraform (:func:`activities.design.infra.render_infra`: a module per chosen capability,
    instantiated in every region), the application (:func:`activities.design.app.render_app`:
    pipeline packages per capability with their pytest suite, a Dockerfile per container
    service, CI, the README with its architecture diagram and the Design Rationale), and
    ``reports/`` (rationale, cost, policy, plan).
    """
    plan = req.plan
    # The infrastructure (root, providers per region, backend, foundation and one module
    # per capability) from configs/design/templates/terraform.
    files: dict[str, str] = dict(render_infra(req))
    files[".github/workflows/terraform.yml"] = _TF_WORKFLOW
    # The application (services, tests, images, CI, README) from configs/design/templates/app.
    files.update(render_app(req, infra_paths=sorted(files)))
    files["reports/rationale.json"] = _json(rationale_json(list(req.reason_cards)))
    files["reports/cost.json"] = _json(req.cost.model_dump(mode="json"))
    files["reports/policy.json"] = _json(req.policy.model_dump(mode="json"))
    files["reports/plan.json"] = _json(
        {"project": req.project, "decision_set": req.decision_set, **plan.model_dump(mode="json")}
    )
    return check_paths(files)


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# ----------------------------------------------------------------------- model providers

SYSTEM_PROMPT = (
    "You write small, working code repositories. Answer with one JSON object and nothing "
    "else: keys are relative file paths (no leading '/', no '..'), values are the full file "
    "texts. Include a FastAPI service under services/, pytest tests under tests/ that pass, "
    "Terraform for AWS under infra/ (one module per capability in "
    "infra/modules/<capability>/ with variables.tf, main.tf and outputs.tf, and a root "
    "infra/main.tf instantiating each module once per region), GitHub Actions under "
    ".github/workflows/, a README.md and reports/."
)


def user_prompt(request: CodeGenRequest) -> str:
    """The request as the model sees it: the plan, constraints, cost and policy as JSON."""
    body = {
        "project": request.project,
        "decision_set": request.decision_set,
        "constraints": request.constraints.model_dump(mode="json", exclude_none=True),
        "plan": {
            "cloud": request.plan.cloud.value,
            "regions": request.plan.regions,
            "workloads": [w.value for w in request.plan.workloads],
            "choices": {c.capability.value: c.pattern_id for c in request.plan.choices},
        },
        "monthly_usd": request.cost.monthly_usd,
        "policy_overall": request.policy.overall,
    }
    return "Write the repository for this design:\n" + json.dumps(body, sort_keys=True)


_FENCE = re.compile(r"^```(?:json)?\s*\n(.*)\n```\s*$", re.S)


def parse_file_map(text: str) -> dict[str, str]:
    """A model's answer to a checked ``{path: text}`` map (a ```json fence is allowed).

    Raises:
        CodeGenError: not JSON, not an object of strings, or a bad path.
    """
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1)
    try:
        data = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise CodeGenError(f"the answer is not JSON: {exc.msg} at {exc.pos}") from None
    if isinstance(data, dict) and isinstance(data.get("files"), dict):
        data = data["files"]
    if not isinstance(data, dict) or not data:
        raise CodeGenError("the answer is not a non-empty JSON object of files")
    bad = [k for k, v in data.items() if not isinstance(v, str)]
    if bad:
        raise CodeGenError(f"file contents must be strings: {', '.join(map(repr, bad[:5]))}")
    return check_paths(data)


class LiteLLMProvider:
    """Any model of the models config, through :meth:`LLMGateway.call` (recorded, scrubbed)."""

    def __init__(
        self,
        gateway: LLMGateway,
        *,
        model: str = "",
        max_tokens: int = 8192,
        timeout_s: float = 300.0,
        call_key: str = "design.codegen",
        workflow_id: str | None = None,
    ) -> None:
        self.gateway = gateway
        self.model = model
        self.max_tokens = max_tokens
        self.timeout_s = timeout_s
        self.call_key = call_key
        self.workflow_id = workflow_id

    async def generate(self, request: CodeGenRequest) -> dict[str, str]:
        response = await self.gateway.call(
            LLMRequest(
                model=self.model,
                messages=[
                    LLMMessage(role="system", content=SYSTEM_PROMPT),
                    LLMMessage(role="user", content=user_prompt(request)),
                ],
                params={"max_tokens": self.max_tokens, "temperature": 0},
                json_mode=True,
                timeout_s=self.timeout_s,
            ),
            call_key=self.call_key,
            workflow_id=self.workflow_id,
            meter=None,
        )
        return parse_file_map(response.content)


class AnthropicProvider:
    """Claude through the ``anthropic`` SDK (Messages API).

    The SDK's own retries are off (``max_retries=0``): Temporal retries the activity.
    ``base_url`` points it at another Anthropic-compatible server.
    """

    def __init__(
        self,
        *,
        api_key: str,
        model: str = "claude-sonnet-4-6",
        base_url: str | None = None,
        max_tokens: int = 16000,
        timeout_s: float = 300.0,
    ) -> None:
        import anthropic

        self.model = model
        self.max_tokens = max_tokens
        self._client = anthropic.AsyncAnthropic(
            api_key=api_key, base_url=base_url, max_retries=0, timeout=timeout_s
        )

    async def generate(self, request: CodeGenRequest) -> dict[str, str]:
        message = await self._client.messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            system=SYSTEM_PROMPT,
            messages=[{"role": "user", "content": user_prompt(request)}],
        )
        text = "".join(
            getattr(block, "text", "") for block in message.content if block.type == "text"
        )
        if message.stop_reason == "max_tokens":
            raise CodeGenError(f"the answer was cut at max_tokens ({self.max_tokens})")
        return parse_file_map(text)

    async def aclose(self) -> None:
        await self._client.close()


__all__ = [
    "AnthropicProvider",
    "CodeGenError",
    "CodeGenProvider",
    "CodeGenRequest",
    "LiteLLMProvider",
    "check_paths",
    "parse_file_map",
    "render_request",
]
