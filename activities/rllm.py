"""Activities of the ``RllmApp`` workflow: load, generate, Python blocks, stats.

Each is one step the workflow's history names: ``rllm.load`` reads, parses and resolves
the app and checks its ``llm_params`` against what LiteLLM accepts for the model;
``rllm.generate`` makes one model call through the LLM gateway and checks the answer
against the schema (an invalid answer is a result, not an error); ``rllm.block`` runs
one Python block in the nsjail sandbox; ``rllm.record_stats`` stores a run's record.

Every ``.rllm`` failure leaves an activity as a non-retryable ``ApplicationError`` whose
``type`` is the error class name and whose first detail is the error payload, so the
workflow can fail with exactly that payload.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.llm import LLMGateway, load_litellm_async, qualify_model
from keel.llm import LLMMessage, LLMRequest, ModelsConfig, ModelSpec, UnknownModelError
from keel.rllm.contracts import block_failed
from keel.rllm.deps import ResolvedApp, resolve
from keel.rllm.errors import (
    LLMParamValidationError,
    MetadataValidationError,
    ParseError,
    PythonBlockExecutionError,
    RllmError,
)
from keel.rllm.model import RllmProgram
from keel.rllm.output import check_output
from keel.rllm.params import LLM_PARAMS_SCHEMA
from keel.rllm.parser import parse_text
from keel.rllm.run import (
    BLOCK,
    GENERATE,
    LOAD,
    RECORD_STATS,
    BlockRequest,
    BlockResult,
    GenerateRequest,
    GenerateResult,
    LoadedApp,
    LoadRequest,
    RllmAttempt,
    error_type_and_payload,
    resolve_model_name,
)
from keel.rllm.stats import RllmRunRecord
from sandbox import SandboxConfig, SandboxError, SandboxLimits, default_config
from sandbox.python_block import PythonBlockResult, run_python_block_async
from store.files import load_rllm_app
from store.rllm_stats import record_run


def rllm_failure(err: RllmError) -> ApplicationError:
    """The non-retryable ``ApplicationError`` that carries ``err``'s payload."""
    kind, payload = error_type_and_payload(err)
    return ApplicationError(err.message, payload, type=kind, non_retryable=True)


def bundle_loader(files: dict[str, str]) -> Callable[[Path], RllmProgram]:
    """A loader for :func:`keel.rllm.deps.resolve` that reads from a file bundle.

    Paths reach it relative to the bundle's root, as :func:`keel.rllm.run.bundle_files`
    keys them (the root is given relative, so children's paths are built the same way).
    """

    def loader(path: Path) -> RllmProgram:
        key = Path(os.path.normpath(path)).as_posix()
        text = files.get(key)
        if text is None:
            raise ParseError(
                f"{key}: not in the files sent with the run (sent: {', '.join(sorted(files))})",
                details={"file": key, "files": sorted(files)},
                recovery_hint="Send every used file in files (runllm does this with "
                "bundle_files), with paths relative to the root app's directory.",
            )
        return parsed(text, key)

    return loader


@functools.lru_cache(maxsize=32)
def _parsed_once(text: str, path: str) -> RllmProgram:
    return parse_text(text, path=path)


def parsed(text: str, path: str) -> RllmProgram:
    """``parse_text(text, path=path)``, parsed once per worker for the same file.

    A worker loads the same app run after run, and parsing (YAML, then each schema
    checked against the JSON Schema meta-schema) was about 15 ms of every run's first
    workflow task. Each caller gets its own copy; errors are not cached (they raise).
    """
    return _parsed_once(text, path).model_copy(deep=True)


def load_resolved(path: str, files: dict[str, str]) -> ResolvedApp:
    """Parse the root app (from ``files`` or the disk) and resolve everything it uses."""
    if files:
        key = Path(os.path.normpath(path)).as_posix()
        if key.startswith("../") or key.startswith("/"):
            raise ParseError(
                f"{path}: a bundled root must be a relative path inside the bundle",
                details={"file": path},
            )
        loader = bundle_loader(files)
        return resolve(loader(Path(key)), path=key, loader=loader)
    return load_rllm_app(path)


def param_issues(
    program: RllmProgram, supported: list[str] | None, litellm_model: str
) -> list[dict[str, str]]:
    """``llm_params`` names that LiteLLM does not accept for ``litellm_model``."""
    if supported is None:
        return [
            {
                "path": "$",
                "message": f"LiteLLM lists no parameters for {litellm_model!r}, so none can "
                "be checked",
            }
        ]
    allowed = set(supported)
    return [
        {"path": f"$.{name}", "message": f"is not accepted by LiteLLM for {litellm_model!r}"}
        for name in sorted(program.llm_params)
        if name not in allowed
    ]


class RllmActivities:
    """The runner's activities, bound to the gateway, the models config, SQL and the sandbox.

    Args:
        gateway: the worker's LLM gateway; ``rllm.generate`` calls it in-process, so every
            call is logged and metered like ``llm.complete``.
        sessions: the SQL store for ``rllm.record_stats``.
        sandbox_config: the jail configuration for Python blocks (default
            configs/sandbox.yaml); ``block_limits`` overrides its limits for blocks.
    """

    def __init__(
        self,
        gateway: LLMGateway,
        sessions: sessionmaker[Session],
        *,
        sandbox_config: SandboxConfig | None = None,
        block_limits: SandboxLimits | None = None,
    ) -> None:
        self.gateway = gateway
        self.sessions = sessions
        self._sandbox_config = sandbox_config
        self._block_limits = block_limits

    @property
    def models(self) -> ModelsConfig:
        return self.gateway.models

    def sandbox_config(self) -> SandboxConfig:
        return self._sandbox_config or default_config()

    def block_limits(self) -> SandboxLimits:
        return self._block_limits or self.sandbox_config().limits

    # -- rllm.load ------------------------------------------------------------------
    async def _supported_params(self, litellm_model: str) -> list[str] | None:
        litellm = await load_litellm_async()
        model, provider, _, _ = litellm.get_llm_provider(litellm_model)
        params = litellm.get_supported_openai_params(model=model, custom_llm_provider=provider)
        return None if params is None else [str(p) for p in params]

    def _spec(self, model_name: str, key: str) -> ModelSpec:
        """The spec ``model_name`` runs with, checked as the gateway will check it."""
        try:
            return self.gateway.resolve(model_name)[1]
        except UnknownModelError as e:
            raise MetadataValidationError(
                f"{key}: {e}",
                details={"file": key, "model": model_name, "known": sorted(self.models.models)},
                recovery_hint="Name a model of a provider LiteLLM knows "
                "(https://docs.litellm.ai/docs/providers), or one of details.known.",
            ) from None

    async def _check_params(self, program: RllmProgram, model_name: str, key: str) -> list[str]:
        spec = self._spec(model_name, key)
        supported = await self._supported_params(spec.litellm_model)
        if not program.needs_llm:
            return supported or []
        issues = param_issues(program, supported, spec.litellm_model)
        if issues:
            first = issues[0]
            name = first["path"].removeprefix("$.")
            more = f" (and {len(issues) - 1} more)" if len(issues) > 1 else ""
            raise LLMParamValidationError(
                f"{key}: llm_params.{name} {first['message']}{more}"
                if name != "$"
                else f"{key}: {first['message']}",
                details={
                    "file": key,
                    "param": name,
                    "model": model_name,
                    "litellm_model": spec.litellm_model,
                    "supported": supported,
                    "issues": issues,
                },
                expected_schema={
                    **LLM_PARAMS_SCHEMA,
                    "properties": {
                        k: v
                        for k, v in LLM_PARAMS_SCHEMA["properties"].items()
                        if supported is not None and k in supported
                    },
                },
                received_payload=dict(program.llm_params),
                recovery_hint=f"Remove the parameters {spec.litellm_model} does not take "
                "(details.supported lists those it does), or run the app on another model.",
            )
        return supported or []

    @activity.defn(name=LOAD.name)
    async def load(self, req: LoadRequest) -> LoadedApp:
        """Read, parse and resolve the app; check every app's model and ``llm_params``.

        Raises:
            ApplicationError: non-retryable, ``type`` one of ParseError,
                MetadataValidationError, LLMParamValidationError,
                ContextWindowExceededError, DependencyResolutionError.
        """
        try:
            resolved = await asyncio.to_thread(load_resolved, req.path, req.files)
            await load_litellm_async()  # bare model names are qualified by LiteLLM
            root_model = ""
            supported: list[str] = []
            for key, program in resolved.programs.items():
                model_name = resolve_model_name(
                    program.llm, req.model, self.models, qualify=qualify_model
                )
                params = await self._check_params(program, model_name, key)
                if key == resolved.graph.root:
                    root_model, supported = model_name, params
            root_spec = self._spec(root_model, resolved.graph.root)
        except RllmError as e:
            raise rllm_failure(e) from None
        return LoadedApp(
            resolved=resolved,
            path=req.path,
            model=root_model,
            litellm_model=root_spec.litellm_model,
            supported_params=supported,
        )

    # -- rllm.generate --------------------------------------------------------------
    @activity.defn(name=GENERATE.name)
    async def generate(self, req: GenerateRequest) -> GenerateResult:
        """One model call through the gateway, then the answer read and schema-checked.

        JSON mode is always on; the schema goes along for the server to decode against
        where the model's entry says its server can (``structured_output`` in
        configs/models.yaml) and the app did not opt out (``structured_output: false``).

        Raises:
            ApplicationError: the gateway's own errors (``LLM*`` types, retryable or not
                as docs/llm.md says). A schema mismatch is not an error.
        """
        llm_req = LLMRequest(
            model=req.model,
            messages=[LLMMessage(role="user", content=req.prompt)],
            params=dict(req.params),
            json_mode=True,
            json_schema=req.output_schema if req.structured_output else None,
            schema_name=_schema_name(req.app),
            timeout_s=req.timeout_s,
        )
        resp = await self.gateway.complete(llm_req)
        check = check_output(resp.content, req.output_schema)
        attempt = RllmAttempt(
            attempt=req.attempt,
            ok=check.ok,
            errors=[i.line() for i in check.issues],
            raw=resp.content,
            usage=resp.usage,
            latency_ms=resp.latency_ms,
            model_name=resp.model_name,
            finish_reason=resp.finish_reason,
        )
        return GenerateResult(attempt=attempt, check=check)

    # -- rllm.block -----------------------------------------------------------------
    @activity.defn(name=BLOCK.name)
    async def block(self, req: BlockRequest) -> BlockResult:
        """Run one Python block in the nsjail sandbox; never in this process.

        The jail has no network, a read-only filesystem except its workspace, and the
        time and memory limits of ``block_limits``. Only the declared inputs go in and
        only the declared outputs come back.

        Raises:
            ApplicationError: non-retryable ``PythonBlockExecutionError`` when the block
                fails, times out, runs out of memory, or the sandbox cannot start (fail
                closed: the block is then not run at all).
        """
        block = req.block
        try:
            result = await run_python_block_async(
                block.code,
                inputs=req.inputs,
                outputs=block.outputs,
                limits=self.block_limits(),
                config=self.sandbox_config(),
            )
        except SandboxError as e:
            raise rllm_failure(_sandbox_unavailable(req, e)) from None
        except (TypeError, ValueError) as e:
            raise rllm_failure(
                block_failed(block, type(e).__name__, str(e), inputs=req.inputs)
            ) from None
        if not result.ok or result.error is not None:
            raise rllm_failure(self._block_failure(req, result))
        return BlockResult(
            outputs=result.outputs,
            stdout=result.stdout[-4000:],
            stderr=result.stderr[-4000:],
            duration_ms=result.run.duration_ms,
        )

    def _block_failure(
        self, req: BlockRequest, result: PythonBlockResult
    ) -> PythonBlockExecutionError:
        """What a block that failed in the jail did wrong, with the limit it ran into."""
        error = result.error
        kind = error.type if error else "Failed"
        message = error.message if error else "the block failed"
        if kind == "Timeout":
            message += f" (limits: {self.block_limits().wall_time_s} s wall, "
            message += f"{self.block_limits().cpu_time_s} s CPU)"
        elif kind == "MemoryLimitExceeded":
            message += f" (limit: {self.block_limits().memory_mb} MiB for the whole block)"
        return block_failed(
            req.block,
            kind,
            message,
            traceback=(error.traceback if error else "") or result.stderr,
            inputs=req.inputs,
        )

    # -- rllm.record_stats ----------------------------------------------------------
    @activity.defn(name=RECORD_STATS.name)
    async def record_stats(self, record: RllmRunRecord) -> bool:
        """Store one run's record (idempotent by ``run_key``); True when newly written."""
        return await asyncio.to_thread(record_run, self.sessions, record)

    def all(self) -> list[Callable[..., Any]]:
        """The activity callables, for ``Worker(activities=...)``."""
        return [self.load, self.generate, self.block, self.record_stats]


def _sandbox_unavailable(req: BlockRequest, e: SandboxError) -> PythonBlockExecutionError:
    """A block not run because the sandbox cannot start (fail closed)."""
    block = req.block
    return PythonBlockExecutionError(
        f"python block {block.name!r} ({block.stage}) was not run: the sandbox cannot start: {e}",
        details={
            "block": block.name,
            "stage": block.stage,
            "line": block.line,
            "type": "SandboxUnavailable",
            "message": str(e),
        },
        received_payload=dict(req.inputs),
        recovery_hint="Make nsjail work on the worker (docs/sandbox.md: "
        "python -m sandbox checks it); blocks never run outside the sandbox.",
    )


def _schema_name(app: str) -> str:
    """The app's name as a schema name (OpenAI's form wants ``[A-Za-z0-9_-]{1,64}``)."""
    name = "".join(c if c.isalnum() or c in "_-" else "_" for c in app)[:64]
    return name or "answer"
