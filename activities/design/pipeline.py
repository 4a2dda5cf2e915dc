"""The activities of ``DesignPipeline`` (workflows/design.py), one per I/O node.

Each is declared under its reference in ``keel.design.steps``. Big things (the generated
repository, the validation report, the archive) go to the artifact store and history
keeps their digests. Codegen and validators call ``activities.design.codegen`` and
``activities.design.validators``, imported when first run so the worker starts without
their heavier dependencies loaded.
"""

from __future__ import annotations

import asyncio
import io
import time
import zipfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import SecretStr
from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating
from activities.llm import LLM_CONNECTION_ERROR, LLM_SERVER_ERROR, LLM_TIMEOUT, LLMGateway
from keel.design import steps
from keel.design.agents import agent_recovery_prompt, read_agent_reply
from keel.design.coverage import IntakeSnapshot
from keel.design.critics import load_prices
from keel.design.errors import DesignError
from keel.design.intake import (
    ReplyReading,
    intake_schema,
    merge_readings,
    quoted_reply,
    read_reply,
    recovery_prompt,
)
from keel.design.intake_rules import merge_with_rules, read_rules
from keel.design.patterns import PatternCatalog, load_patterns
from keel.design.policy import PolicySettings
from keel.design.reasons import prompt_pack_hash
from keel.design.steps import (
    AgentInput,
    AgentOutput,
    AgentRun,
    CodegenInput,
    CodegenOutput,
    IntakeInput,
    IntakeOutput,
    LoadInput,
    LoadOutput,
    PersistInput,
    PersistOutput,
    ValidateInput,
    ValidateOutput,
)
from keel.design.validation import tree_digest
from keel.digest import digest_bytes, digest_json
from keel.llm import LLMMessage, LLMRequest, LLMResponse
from keel.retry import is_retryable_status
from store import design as design_store
from store import design_git
from store.artifacts import ArtifactStore
from store.design_policy import PolicyFileError, read_policy
from store.refs import ref_index_for

#: Whole seconds between heartbeats of a long step (codegen, validators).
HEARTBEAT_EVERY_S = 5.0
#: A fixed timestamp for the archive's entries, so one repository is one digest.
ZIP_TIME = (2020, 1, 1, 0, 0, 0)
#: Where a codegen model's answer is recorded by node key, next to the artifacts.
CODEGEN_REFS_DIR = "refs/design-codegen"
#: The most tokens one intake reply may take: the whole schema filled fits well under it.
INTAKE_MAX_TOKENS = 768
#: Each intake call's limit: the reply and the re-ask fit the activity's 3 minutes.
INTAKE_CALL_TIMEOUT_S = 80.0
#: Gateway failures that mean the intake model could not be reached (or kept failing).
UNREACHABLE = frozenset({LLM_CONNECTION_ERROR, LLM_TIMEOUT, LLM_SERVER_ERROR})
#: The most tokens one planner or critic reply may take.
AGENT_MAX_TOKENS = 2048
#: Each agent call's limit: the reply and the re-ask fit the activity's 3 minutes.
AGENT_CALL_TIMEOUT_S = 80.0
#: The Claude model of ``codegen="anthropic"`` when ``codegen_model`` is empty.
ANTHROPIC_DEFAULT_MODEL = "claude-sonnet-4-6"


class DesignActivities:
    """The design activities bound to the store, the artifact store and the gateway."""

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        artifacts: ArtifactStore,
        llm: LLMGateway,
        config_dir: Path,
        sandbox_config: Any = None,
        anthropic_api_key: SecretStr | None = None,
        anthropic_base_url: str = "",
        repos_dir: Path | None = None,
        policy_path: Path | None = None,
    ) -> None:
        self.repos_dir = repos_dir
        self.policy_path = policy_path or config_dir / "policy.yaml"
        self.sessions = sessions
        self.anthropic_api_key = anthropic_api_key
        self.anthropic_base_url = anthropic_base_url
        self.artifacts = artifacts
        self.llm = llm
        self.config_dir = config_dir
        self.sandbox_config = sandbox_config

    def all(self) -> list[Any]:
        return [
            self.load,
            self.intake_extract,
            self.agent,
            self.codegen,
            self.validate,
            self.persist,
        ]

    def _catalog(self) -> PatternCatalog:
        """The pattern catalogue the plan was made from (BOM comments, Dockerfiles)."""
        return load_patterns(_yaml(self.config_dir / "patterns.yaml"))

    @activity.defn(name=steps.LOAD.name)
    def load(self, inp: LoadInput) -> LoadOutput:
        """Patterns, prices and prompts from ``configs/design``, and the previous set."""
        try:
            catalog = load_patterns(_yaml(self.config_dir / "patterns.yaml"))
            prices = load_prices(_yaml(self.config_dir / "prices.yaml"))
        except (DesignError, OSError, yaml.YAMLError) as exc:
            raise ApplicationError(
                f"configs/design is not usable: {exc}",
                type=steps.ERROR_DESIGN_CONFIG,
                non_retryable=True,
            ) from None
        prompts = {
            p.stem: p.read_text(encoding="utf-8")
            for p in sorted((self.config_dir / "prompts").glob("*.md"))
        }
        policy = self._policy()
        previous = None
        if inp.previous_decision_set:
            previous = design_store.load_previous(
                self.sessions, inp.project, inp.previous_decision_set
            )
        return LoadOutput(
            catalog=catalog,
            prices=prices,
            prompts=prompts,
            prompt_pack=prompt_pack_hash(prompts),
            previous=previous,
            agent_model=self._capable_model(inp.model),
            policy=policy,
            policy_source=str(self.policy_path),
        )

    def _policy(self) -> PolicySettings:
        """The organisation's policy file; a missing default file is the defaults, a bad
        one (or a named one that is missing) is final (``DesignConfigInvalid``)."""
        path = self.policy_path
        try:
            return read_policy(path, missing_ok=path == self.config_dir / "policy.yaml")
        except PolicyFileError as exc:
            raise ApplicationError(
                str(exc), type=steps.ERROR_DESIGN_CONFIG, non_retryable=True
            ) from None

    def _capable_model(self, model: str) -> str | None:
        """The decision set's model name if the models config marks it capable."""
        try:
            name, spec = self.llm.models.resolve(model)
        except Exception:
            return None
        return name if spec.capable else None

    @activity.defn(name=steps.AGENT.name)
    async def agent(self, inp: AgentInput) -> AgentOutput:
        """A planner or critic agent (issue 24 §4): one schema-constrained call through the
        gateway, re-asked once with the problems when the reply is not the agent's schema.
        A reply that still does not fit is returned as ``reply=None`` with the problems
        (the rules decide alone); a model that cannot be reached fails (retried)."""
        info = activity.info()
        messages = [
            LLMMessage(role="system", content=inp.system_prompt),
            LLMMessage(role="user", content=inp.message),
        ]
        first = await self._agent_call(inp, messages, f"{inp.key}/{info.attempt}")
        reply, problems = read_agent_reply(inp.agent, first.content)
        tokens, latency = first.usage.total_tokens, first.latency_ms
        if reply is not None:
            return AgentOutput(
                reply=reply, model=first.model_name, tokens_total=tokens, latency_ms=int(latency)
            )
        again = [
            *messages,
            LLMMessage(role="assistant", content=quoted_reply(first.content)),
            LLMMessage(role="user", content=agent_recovery_prompt(inp.agent, problems)),
        ]
        second = await self._agent_call(inp, again, f"{inp.key}/{info.attempt}/reask")
        reply, second_problems = read_agent_reply(inp.agent, second.content)
        return AgentOutput(
            reply=reply,
            problems=second_problems,
            reasked=True,
            model=second.model_name,
            tokens_total=tokens + second.usage.total_tokens,
            latency_ms=int(latency + second.latency_ms),
        )

    async def _agent_call(
        self, inp: AgentInput, messages: list[LLMMessage], call_key: str
    ) -> LLMResponse:
        return await self._json_call(
            _json_request(
                inp.model,
                messages,
                inp.json_schema,
                f"design_{inp.agent}",
                max_tokens=AGENT_MAX_TOKENS,
                timeout_s=AGENT_CALL_TIMEOUT_S,
            ),
            call_key,
        )

    async def _json_call(self, req: LLMRequest, call_key: str) -> LLMResponse:
        """``req`` through the gateway, as this activity's call (its workflow, its meter)."""
        return await self.llm.call(
            req,
            call_key=call_key,
            workflow_id=activity.info().workflow_id,
            meter=activity.metric_meter(),
        )

    @activity.defn(name=steps.INTAKE_EXTRACT.name)
    async def intake_extract(self, inp: IntakeInput) -> IntakeOutput:
        """Free text to the Constraint Schema: one call with the schema (the gateway sends
        it in the form the model's server takes, ``ModelSpec.structured_output``), and
        where the reply does not fit, one re-ask quoting the problems. What still does
        not fit is kept field by field (``keel.design.intake``): the fields that validate
        stay, the rest go to ``snapshot.unfit`` and become questions. Only a model that
        cannot be reached fails here (``DesignModelUnreachable``, retried as any model
        failure, its message naming the model and its address).

        The rules reader (``keel.design.intake_rules``) reads the same text beside the
        model, and its values fill the fields the model left empty and replace those the
        text contradicts: region codes, volumes, latency and budgets are never asked about
        when the paragraph states them. Merged here, in the activity, so recorded
        histories replay unchanged."""
        info = activity.info()
        messages = [
            LLMMessage(role="system", content=inp.system_prompt),
            LLMMessage(role="user", content=inp.text),
        ]
        first = await self._intake_call(inp, messages, f"{inp.key}/{info.attempt}")
        reading = read_reply(first.content)
        if reading.fits:
            return _first_reading(inp.text, reading, first)
        again = [
            *messages,
            LLMMessage(role="assistant", content=quoted_reply(first.content)),
            LLMMessage(role="user", content=recovery_prompt(reading.problems)),
        ]
        try:
            second = await self._intake_call(inp, again, f"{inp.key}/{info.attempt}/reask")
        except ApplicationError as err:
            # The model answered once: what fits of that answer beats failing the session.
            activity.logger.warning("intake re-ask failed, keeping the first reply: %s", err)
            return _first_reading(inp.text, reading, first, reasked=True)
        return _reasked_reading(inp.text, reading, first, second)

    async def _intake_call(
        self, inp: IntakeInput, messages: list[LLMMessage], call_key: str
    ) -> LLMResponse:
        req = _json_request(
            inp.model,
            messages,
            intake_schema(),
            "constraint_schema",
            max_tokens=INTAKE_MAX_TOKENS,
            timeout_s=INTAKE_CALL_TIMEOUT_S,
        )
        try:
            return await self._json_call(req, call_key)
        except ApplicationError as err:
            raise self._model_failure(inp.model, err) from None

    def _model_failure(self, model: str, err: ApplicationError) -> ApplicationError:
        """The gateway's failure in words a user can act on: which model, at which
        address, what to check. Retryable as the gateway said."""
        try:
            name, spec = self.llm.models.resolve(model)
        except Exception:
            return err
        where = spec.api_base or f"{spec.litellm_model}'s provider"
        said = err.message.rstrip(".")
        if err.type in UNREACHABLE:
            message = (
                f"the intake model {name!r} ({spec.litellm_model}) at {where} did not "
                f"answer ({said}). Check that its server is running and answers at that "
                "address (the embedded model starts with `keel up`), or point "
                "configs/models.yaml (KEEL_MODELS_CONFIG) at a model that does; then start "
                "a new session."
            )
            kind = steps.ERROR_DESIGN_MODEL_UNREACHABLE
        else:
            message = (
                f"the intake model {name!r} ({spec.litellm_model}) at {where} refused the "
                f"call ({said}). Check the model's entry in configs/models.yaml "
                "(KEEL_MODELS_CONFIG) and its API key on the worker; then start a new session."
            )
            kind = err.type or "LLMError"
        details = {**(err.details[0] if err.details and isinstance(err.details[0], dict) else {})}
        details.update({"model_name": name, "api_base": spec.api_base, "error": err.type})
        return ApplicationError(
            message,
            details,
            type=kind,
            non_retryable=err.non_retryable,
            next_retry_delay=err.next_retry_delay,
        )

    @activity.defn(name=steps.CODEGEN.name)
    async def codegen(self, inp: CodegenInput) -> CodegenOutput:
        """The repository of the plan by the chosen provider, stored as one JSON files map.

        A model's answer is recorded under the node's idempotency key (a reference in the
        artifact store) as soon as it is checked: a retry of this activity, after a worker
        was lost once the model had answered, takes the recorded answer instead of paying
        for the model again. The node's ``agent_runs`` row (provider, model, time) is then
        written before the activity returns.
        """
        from activities.design.codegen import CodeGenRequest, render_request

        started = time.monotonic()
        request = CodeGenRequest(
            project=inp.project,
            decision_set=inp.decision_set,
            plan=inp.plan,
            constraints=inp.constraints,
            rationale_md=inp.rationale_md,
            cost=inp.cost,
            policy=inp.policy,
            catalog=self._catalog(),
        )
        reused = False
        if inp.codegen == "template":
            files: dict[str, str] = await heartbeating(
                asyncio.to_thread(render_request, request), every_s=HEARTBEAT_EVERY_S
            )
            digest = self.artifacts.put_json(files)
        else:
            index = ref_index_for(self.artifacts, CODEGEN_REFS_DIR)
            ref = digest_bytes(inp.key.encode())
            recorded = await asyncio.to_thread(index.get, ref)
            if recorded is not None and self.artifacts.exists(recorded):
                files, digest, reused = self.artifacts.get_json(recorded), recorded, True
            else:
                files = await heartbeating(self._generate(inp, request), every_s=HEARTBEAT_EVERY_S)
                digest = self.artifacts.put_json(files)
                await asyncio.to_thread(index.put, ref, digest)
        output = CodegenOutput(
            files_digest=digest,
            file_count=len(files),
            file_digests={p: digest_bytes(t.encode()) for p, t in sorted(files.items())},
        )
        run = AgentRun(
            key=inp.key,
            agent="codegen",
            provider=inp.codegen,
            model=inp.codegen_model,
            input_digest=digest_json({"plan": inp.key}),
            output={"files": output.file_count, "digest": digest, "reused_answer": reused},
            latency_ms=int((time.monotonic() - started) * 1000),
        )
        # Written here, not only by persist, so a paid model answer shows in agent_runs
        # even when the run fails later (validators, a lost version race).
        await asyncio.to_thread(
            design_store.record_agent_run, self.sessions, inp.project, inp.decision_set, run
        )
        return output

    async def _generate(self, inp: CodegenInput, request: Any) -> dict[str, str]:
        """One model answer by the provider ``inp.codegen`` names, checked
        (``parse_file_map``), or a typed ``ApplicationError``."""
        from activities.design.codegen import AnthropicProvider, CodeGenError, LiteLLMProvider

        info = activity.info()
        try:
            if inp.codegen == "litellm":
                return await LiteLLMProvider(
                    self.llm,
                    model=inp.codegen_model,
                    call_key=f"{inp.key}/{info.attempt}",
                    workflow_id=info.workflow_id,
                ).generate(request)
            key = self.anthropic_api_key.get_secret_value() if self.anthropic_api_key else ""
            if not key:
                raise ApplicationError(
                    "codegen 'anthropic' needs KEEL_ANTHROPIC_API_KEY on the worker",
                    type=steps.ERROR_DESIGN_CONFIG,
                    non_retryable=True,
                )
            provider = AnthropicProvider(
                api_key=key,
                model=inp.codegen_model or ANTHROPIC_DEFAULT_MODEL,
                base_url=self.anthropic_base_url or None,
            )
            try:
                return await provider.generate(request)
            except Exception as exc:
                raise _anthropic_error(exc) from None
            finally:
                await provider.aclose()
        except CodeGenError as exc:
            raise ApplicationError(
                f"the model's answer is not a usable repository: {str(exc)[:2000]}",
                type=steps.ERROR_DESIGN_CODEGEN,
            ) from None

    @activity.defn(name=steps.VALIDATE.name)
    async def validate(self, inp: ValidateInput) -> ValidateOutput:
        """The validators on the stored repository; the report goes to the store.

        With ``ship``, the tree validated is the tree that ships: the generated files,
        the workflow's ``extra_files`` and the SBOM, stored as one files map whose digest
        persist archives unchanged (so the archive is byte for byte what was validated).
        """
        from activities.design.validators import add_sbom, validate_repo

        files = self.artifacts.get_json(inp.files_digest)
        tree_files_digest = tree = None
        if inp.ship:
            files = await add_sbom({**files, **inp.extra_files})
            tree_files_digest = self.artifacts.put_json(files)
            tree = tree_digest(files)
        # validate_repo heartbeats itself, naming the validator that runs.
        report = await validate_repo(files, sandbox_config=self.sandbox_config, only=inp.only)
        dumped = report.model_dump(mode="json")
        if tree is not None:
            dumped["tree_digest"] = tree
        summary = _validator_summary(dumped)
        return ValidateOutput(
            report_digest=self.artifacts.put_json(dumped),
            summary=summary,
            tree_files_digest=tree_files_digest,
            tree_digest=tree,
            tree_file_count=len(files) if inp.ship else 0,
        )

    @activity.defn(name=steps.PERSIST.name)
    def persist(self, inp: PersistInput) -> PersistOutput:
        """The decision set's commit in the project's git repository, its rows and its
        repository's archive, once per key."""
        archive = None
        size = None
        repository: dict[str, str] = dict(inp.report_files)
        if inp.tree_files_digest is not None:
            # The validated tree, exactly: nothing is added after validation.
            repository = self.artifacts.get_json(inp.tree_files_digest)
            data = _zip(repository)
            archive, size = self.artifacts.put_bytes(data), len(data)
        elif inp.files_digest is not None:
            files: dict[str, str] = self.artifacts.get_json(inp.files_digest)
            validation: dict[str, str] = {}
            if inp.validation_digest is not None:
                validation = self.artifacts.get_json(inp.validation_digest).get("files", {})
            repository = {**files, **validation, **inp.report_files}
            data = _zip(repository)
            archive, size = self.artifacts.put_bytes(data), len(data)
        commit = self._commit(inp, repository)
        try:
            version, inserted = design_store.persist(
                self.sessions, inp, archive_digest=archive, archive_size=size, git_commit=commit
            )
        except design_store.VersionConflict as exc:
            raise ApplicationError(
                str(exc), type=steps.ERROR_DESIGN_CONFLICT, non_retryable=True
            ) from None
        # Read back, not rebuilt: a retried persist returns the event the first one wrote.
        completed = design_store.stored_event(
            self.sessions,
            inp.project,
            inp.decision_set,
            steps.event_key(len(inp.events), steps.EVENT_RUN_COMPLETE),
        )
        return PersistOutput(
            version=version,
            archive_digest=archive,
            inserted_events=inserted,
            completed=completed,
            git_commit=commit,
        )

    def _commit(self, inp: PersistInput, repository: dict[str, str]) -> str | None:
        """Commit the decision set to its project's repository (none without a
        ``repos_dir``); the commit id. Before the rows, so run-complete can name it; a
        retry finds the tagged commit and makes no second one."""
        if self.repos_dir is None:
            return None
        version = design_store.version_after(self.sessions, inp.project, inp.decision_set, inp.key)
        message = (
            f"decision set {inp.decision_set} v{version}: {inp.status}\n\n"
            f"project: {inp.project}\n"
            f"previous decision set: {inp.parent or '-'}\n"
            f"persist key: {inp.key}\n"
        )
        try:
            return design_git.commit_decision_set(
                self.repos_dir,
                inp.project,
                inp.decision_set,
                {**repository, "plan.md": inp.summary_md},
                message=message,
                parent_decision_set=inp.parent,
            )
        except design_git.GitError as exc:
            raise ApplicationError(str(exc), type="DesignGitFailed") from None


def _anthropic_error(exc: Exception) -> Exception:
    """An Anthropic SDK failure as Temporal should retry it (``keel.retry``: a 4xx other
    than 408, 409, 425 and 429 is final, the rest retry). Anything else (a
    ``CodeGenError``) passes unchanged."""
    import anthropic

    if isinstance(exc, anthropic.APIStatusError):
        status = exc.status_code
        return ApplicationError(
            f"Anthropic API: HTTP {status}",
            type="DesignCodegenProvider",
            non_retryable=not is_retryable_status(status),
        )
    if isinstance(exc, anthropic.APIError):
        return ApplicationError(
            f"Anthropic API: {type(exc).__name__}", type="DesignCodegenProvider"
        )
    return exc


def _validator_summary(report: dict[str, Any]) -> dict[str, str]:
    """``name -> status`` of each validator in the report's list of results."""
    out: dict[str, str] = {}
    for value in report.values():
        if isinstance(value, list):
            for item in value:
                if isinstance(item, dict) and "name" in item and "status" in item:
                    out[str(item["name"])] = str(item["status"])
    return out


def _json_request(
    model: str,
    messages: list[LLMMessage],
    schema: dict[str, Any],
    schema_name: str,
    *,
    max_tokens: int,
    timeout_s: float,
) -> LLMRequest:
    """A deterministic (temperature 0) call answered as JSON of ``schema``."""
    return LLMRequest(
        model=model,
        messages=messages,
        params={"temperature": 0, "max_tokens": max_tokens},
        json_mode=True,
        json_schema=schema,
        schema_name=schema_name,
        timeout_s=timeout_s,
    )


def _first_reading(
    text: str, reading: ReplyReading, first: LLMResponse, *, reasked: bool = False
) -> IntakeOutput:
    """The intake from the first reply alone: it fits, or the re-ask failed (``reasked``:
    its problems are kept)."""
    return IntakeOutput(
        snapshot=_checked_by_rules(reading.snapshot, text),
        model=first.model_name,
        tokens_total=first.usage.total_tokens,
        latency_ms=int(first.latency_ms),
        reasked=reasked,
        problems=reading.problems if reasked else [],
    )


def _reasked_reading(
    text: str, reading: ReplyReading, first: LLMResponse, second: LLMResponse
) -> IntakeOutput:
    """The intake after a re-ask: the second reply where it fits, else what fits of the
    two, field by field."""
    second_reading = read_reply(second.content)
    snapshot = (
        second_reading.snapshot if second_reading.fits else merge_readings(reading, second_reading)
    )
    snapshot = _checked_by_rules(snapshot, text)
    if snapshot.unfit:
        activity.logger.warning(
            "intake reply did not fit after a re-ask; asking about %s",
            ", ".join(sorted(snapshot.unfit)),
        )
    return IntakeOutput(
        snapshot=snapshot,
        model=second.model_name,
        tokens_total=first.usage.total_tokens + second.usage.total_tokens,
        latency_ms=int(first.latency_ms + second.latency_ms),
        reasked=True,
        problems=second_reading.problems or reading.problems,
    )


def _checked_by_rules(snapshot: IntakeSnapshot, text: str) -> IntakeSnapshot:
    """The model's reading with the rules' reading of ``text`` laid over it; which source
    gave each field goes to the activity's log (IntakeOutput has no place for it)."""
    merged, source = merge_with_rules(snapshot, read_rules(text))
    if source:
        activity.logger.info(
            "intake fields by source: %s",
            ", ".join(f"{field}={by}" for field, by in sorted(source.items())),
        )
    return merged


def _yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _zip(files: dict[str, str]) -> bytes:
    """A deterministic zip: sorted paths, fixed times, so equal repositories share a key."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(files):
            info = zipfile.ZipInfo(path, date_time=ZIP_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, files[path])
    return buf.getvalue()
