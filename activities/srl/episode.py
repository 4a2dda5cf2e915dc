"""The activities of an SRL episode: ``srl.window``, ``srl.generate`` and ``srl.apply``.

``srl.generate`` asks the step's source for an answer (the gold replay, the teacher
through the LLM gateway, or the actor pool); ``srl.apply`` parses it, applies the action
in the jail, re-parses the result, scores it (``activities.srl.scoring``), merges the state
and writes the step row.
Writing is idempotent by (collection, ``<task_id>#<step>``): a retried ``srl.apply``
finds the row and returns the outcome stored in it, so a step is never counted twice.

A collection run again reuses what it recorded: ``srl.window`` records the collection's
identity (source, model, sampling) on the first run and refuses a run naming others;
``srl.generate`` looks the step's row up first and, when it is there, returns its stored
outcome without asking any model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.actors import ActorPool, ActorRequestError
from activities.heartbeat import heartbeating
from activities.llm import LLMGateway
from activities.srl.jail import GroupedRuns, JailRuns
from activities.srl.scoring import StepScoring, _outcome_of
from activities.srl.tokens import HEURISTIC, PromptTokenizer, tokenizer_for
from keel.llm import LLMMessage, LLMRequest, ModelNotAllowedError, UnknownModelError
from keel.srl.batch import EPISODES, EpisodesInput, EpisodesResult
from keel.srl.fit import PromptFit, fit_prompt, focus_line
from keel.srl.prompts import PromptPack, gold_answer, parse_prompt_pack, step_messages
from keel.srl.state import (
    State,
    StateUpdate,
    fit_budget,
    heuristic_count_tokens,
    merge,
    render,
)
from keel.srl.step import step_schema
from keel.srl.steps import (
    APPLY,
    ERROR_SRL_IDENTITY,
    ERROR_SRL_TASKS,
    GENERATE,
    WINDOW,
    ApplyInput,
    GenerateInput,
    Generation,
    SrlTask,
    StepOutcome,
    TasksInvalid,
    WindowInput,
    WindowTasks,
    goal_update,
    parse_tasks,
)
from keel.srl.trajectory import Sampling, StepRecord, StepRow, step_key
from sandbox import SandboxConfig, SandboxLimits
from store.artifacts import ArtifactNotFound, ArtifactStore, GroupedPuts
from store.srl_steps import get_step, insert_step, record_identity

log = logging.getLogger(__name__)

#: A teacher call's own limit, inside srl.generate's 3 minutes: a server that answers one
#: request at a time (llama.cpp) queues a collection's window of episodes, and at the
#: gateway's default 60 s the later ones timed out while the server still worked on them,
#: so each retry queued again (the embedded model, window 8: 4 of 100 steps in 10 min).
TEACHER_CALL_TIMEOUT_S = 170.0
#: Tokens of the rendered state (the plan's 400-800 budget: its upper end).
STATE_BUDGET = 800
_TASK_FILES_CACHED = 4
_CALL_GATES_KEPT = 64
HEARTBEAT_EVERY_S = 2.0
T = TypeVar("T")


def tasks_invalid(message: str) -> ApplicationError:
    return ApplicationError(message, type=ERROR_SRL_TASKS, non_retryable=True)


class SrlActivities(StepScoring):
    """The episode's activities bound to the store, the sandbox, the gateway and the pool.

    ``actors`` is called once, on the first actor step, so a worker that never runs an
    actor collection never reads the actor config.
    """

    def __init__(
        self,
        *,
        sessions: sessionmaker[Session],
        artifacts: ArtifactStore,
        llm: LLMGateway,
        prompts_path: Path,
        sandbox_config: SandboxConfig | None = None,
        sandbox_limits: SandboxLimits | None = None,
        actors: Callable[[], ActorPool] | None = None,
    ) -> None:
        self.sessions = sessions
        self.artifacts = artifacts
        # A step's artifacts, written with the other episodes' (one sync per group).
        self.puts = GroupedPuts(artifacts)
        self.llm = llm
        self.prompts_path = prompts_path
        self.sandbox_config = sandbox_config
        self.sandbox_limits = sandbox_limits
        self._actors_factory = actors
        self._actors: ActorPool | None = None
        self._actors_lock = asyncio.Lock()
        self._pack: PromptPack | None = None
        self._task_files: OrderedDict[str, list[SrlTask]] = OrderedDict()
        self._call_gates: OrderedDict[str, tuple[int, asyncio.Semaphore]] = OrderedDict()
        #: The jail runs of every batch on this worker, grouped across batches.
        self.grouped_runs = GroupedRuns(sandbox_limits, sandbox_config)

    def all(self) -> list[Callable[..., Any]]:
        return [self.window, self.generate, self.apply, self.episodes]

    def call_gate(self, collection: str, calls: int) -> asyncio.Semaphore:
        """The model calls a collection's batches may have in flight on this worker."""
        held = self._call_gates.get(collection)
        if held is None or held[0] != calls:
            held = (calls, asyncio.Semaphore(calls))
            self._call_gates[collection] = held
        self._call_gates.move_to_end(collection)
        while len(self._call_gates) > _CALL_GATES_KEPT:  # the collections least recently run
            self._call_gates.popitem(last=False)
        return held[1]

    # -- inputs ----------------------------------------------------------------------
    def tasks(self, digest: str) -> list[SrlTask]:
        cached = self._task_files.get(digest)
        if cached is not None:
            self._task_files.move_to_end(digest)
            return cached
        try:
            data = self.artifacts.get_bytes(digest)
        except ArtifactNotFound:
            raise tasks_invalid(f"task file {digest} is not in the artifact store") from None
        try:
            tasks = parse_tasks(data)
        except TasksInvalid as e:
            raise tasks_invalid(f"{digest}: {e}") from None
        self._task_files[digest] = tasks
        while len(self._task_files) > _TASK_FILES_CACHED:
            self._task_files.popitem(last=False)
        return tasks

    def task(self, digest: str, index: int) -> SrlTask:
        tasks = self.tasks(digest)
        if index >= len(tasks):
            raise tasks_invalid(f"task {index} is past the end of {digest} ({len(tasks)} tasks)")
        return tasks[index]

    def text(self, task: SrlTask, digest: str | None) -> str:
        if digest is None:
            return task.pre
        return self.artifacts.get_bytes(digest).decode("utf-8")

    def pack(self) -> PromptPack:
        if self._pack is None:
            self._pack = parse_prompt_pack(self.prompts_path.read_text(encoding="utf-8"))
        return self._pack

    # -- activities ------------------------------------------------------------------
    @activity.defn(name=WINDOW.name)
    async def window(self, inp: WindowInput) -> WindowTasks:
        digest = inp.tasks_digest
        if digest is None:
            digest = await asyncio.to_thread(self._store_file, inp.tasks_file or "")
        tasks = await asyncio.to_thread(self.tasks, digest)
        if inp.identity is not None:
            identity = inp.identity.model_copy(
                update={"tasks_digest": inp.identity.tasks_digest or digest}
            )
            stored, _ = await asyncio.to_thread(record_identity, self.sessions, identity)
            mismatch = stored.mismatch(identity)
            if mismatch is not None:
                raise ApplicationError(mismatch, type=ERROR_SRL_IDENTITY, non_retryable=True)
        return WindowTasks(
            tasks_digest=digest,
            task_count=len(tasks),
            task_ids=[t.task_id for t in tasks[inp.start : inp.start + inp.count]],
        )

    def _store_file(self, path: str) -> str:
        """A task file named by path (``temporal workflow start``): into the store."""
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise tasks_invalid(f"cannot read task file {path}: {e.strerror or e}") from None
        try:
            parse_tasks(data)
        except TasksInvalid as e:
            raise tasks_invalid(f"{path}: {e}") from None
        return self.artifacts.put_bytes(data)

    @activity.defn(name=GENERATE.name)
    async def generate(self, inp: GenerateInput) -> Generation:
        recorded = await asyncio.to_thread(self._recorded, inp)
        if recorded is not None:
            return recorded
        gen = await heartbeating(self._generate(inp), every_s=HEARTBEAT_EVERY_S)
        return gen.model_copy(update={"sampling": _sampling(inp)})

    @activity.defn(name=EPISODES.name)
    async def episodes(self, inp: EpisodesInput) -> EpisodesResult:
        from activities.srl.batch import run_episodes

        return await heartbeating(run_episodes(self, inp), every_s=HEARTBEAT_EVERY_S)

    async def answer(self, inp: GenerateInput, gate: asyncio.Semaphore) -> Generation:
        """``srl.generate``'s answer inside a batch: the recorded step, or the source's
        answer with at most ``gate``'s calls in flight."""
        recorded = await asyncio.to_thread(self._recorded, inp)
        if recorded is not None:
            return recorded
        async with gate:
            gen = await self._generate(inp, in_batch=True)
        return gen.model_copy(update={"sampling": _sampling(inp)})

    def _recorded(self, inp: GenerateInput) -> Generation | None:
        """The step as an earlier run recorded it (a collection run again), or None."""
        task = self.task(inp.tasks_digest, inp.task_index)
        key = step_key(task.task_id, inp.step, inp.sample)
        row = get_step(self.sessions, inp.collection, key)
        if row is None:
            return None
        record = StepRecord.model_validate_json(row.record_json)
        mode = task.step_mode(inp.step_mode)
        if (record.step_mode or "free_running") != mode:
            # Its state and file came from the other mode: not this run's step.
            raise ApplicationError(
                f"collection {inp.collection!r} recorded step {key} in step mode "
                f"{record.step_mode or 'free_running'!r}; this run asks for {mode!r}. "
                "Use another collection id for another step mode",
                type=ERROR_SRL_IDENTITY,
                non_retryable=True,
            )
        out = record.model_output
        prompt = self.artifacts.put_json(record.prompt)
        return Generation(
            raw=out.raw,
            model=row.model,
            state_before=State.model_validate(record.state_before),
            endpoint=out.endpoint or "",
            prompt_digest=prompt,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
            finish_reason=out.finish_reason,
            cost_usd=out.cost_usd,
            structured=out.structured,
            sampling=record.sampling,
            recorded=_outcome_of(record, key, task).model_copy(update={"recorded": False}),
        )

    async def _generate(self, inp: GenerateInput, in_batch: bool = False) -> Generation:
        task = self.task(inp.tasks_digest, inp.task_index)
        state, messages, prompt, structured = await self._prompt(task, inp)
        if inp.source == "gold_replay":
            return _gold_generation(task, inp.step, state, prompt)
        if inp.source == "teacher":
            # A batch's calls share its activity: each names its step as well.
            step = f"/{step_key(task.task_id, inp.step, inp.sample)}" if in_batch else ""
            return await self._ask_teacher(task, inp, messages, structured, state, prompt, step)
        return await self._ask_actors(inp, messages, state, prompt)

    async def _prompt(
        self, task: SrlTask, inp: GenerateInput
    ) -> tuple[State, list[dict[str, str]], str, bool]:
        """The step's state (fitted), its messages (fitted to the model's context), the
        prompt's digest in the artifact store, and whether the teacher answers in JSON."""
        if task.step_mode(inp.step_mode) == "expert_prefix":
            # The paper's step n: the file and state after the expert's steps 1..n-1.
            text, state = task.prefix_text(inp.step), task.prefix_state(inp.step)
        else:
            text = self.text(task, inp.text_digest)
            state = inp.state if inp.state.goals else merge(inp.state, _goal(task))
        state, state_tokens = await self._fit(state, inp.source)
        structured = inp.source == "teacher" and await self._structured(inp.model)
        pack, rendered_state = self.pack(), render(state)

        messages_for = step_messages(
            pack,
            language=task.language,
            file=task.file_name,
            state=rendered_state,
            structured=structured,
        )

        fit = await self._fit_prompt(task, inp, text, messages_for)
        messages = fit.messages if fit is not None else messages_for(text, task.instruction)
        prompt = await self.puts.put_json(
            {
                "messages": messages,
                "step": inp.step,
                "state_tokens": state_tokens,
                **({"fit": _fit_facts(fit)} if fit is not None else {}),
            },
        )
        return state, messages, prompt, structured

    async def _ask_teacher(
        self,
        task: SrlTask,
        inp: GenerateInput,
        messages: list[dict[str, str]],
        structured: bool,
        state: State,
        prompt: str,
        key_suffix: str = "",
    ) -> Generation:
        """The teacher's answer through the LLM gateway."""
        started = time.monotonic()
        info = activity.info()
        response = await self.llm.call(
            LLMRequest(
                model=inp.model,
                messages=[LLMMessage.model_validate(m) for m in messages],
                params={
                    "temperature": inp.temperature,
                    "max_tokens": inp.max_tokens,
                    "seed": inp.seed,
                    **({"top_p": inp.top_p} if inp.top_p != 1.0 else {}),
                },
                # Where the model's server decodes against a schema, the answer is the
                # step's JSON form by construction; elsewhere the tags, parsed as before.
                json_mode=structured,
                json_schema=step_schema(task.language) if structured else None,
                schema_name="srl_step",
                timeout_s=TEACHER_CALL_TIMEOUT_S,
            ),
            call_key=f"{info.workflow_run_id}/{info.activity_id}/{info.attempt}{key_suffix}",
            workflow_id=info.workflow_id,
            meter=activity.metric_meter(),
        )
        return Generation(
            raw=_with_think(response.content, response.reasoning),
            model=response.model_name,
            state_before=state,
            prompt_digest=prompt,
            latency_s=time.monotonic() - started,
            prompt_tokens=response.usage.prompt_tokens,
            completion_tokens=response.usage.completion_tokens,
            finish_reason=response.finish_reason,
            cost_usd=response.cost_usd,
            structured=response.structured != "none",
        )

    async def _ask_actors(
        self, inp: GenerateInput, messages: list[dict[str, str]], state: State, prompt: str
    ) -> Generation:
        """An answer from the actor pool."""
        pool = await self.actors()
        try:
            gen = await pool.generate(
                messages,
                max_tokens=inp.max_tokens,
                temperature=inp.temperature,
                seed=inp.seed,
                top_p=inp.top_p if inp.top_p != 1.0 else None,
            )
        except ActorRequestError as e:  # the actor refused this request: asking again won't help
            raise ApplicationError(str(e), type="SrlActorRefused", non_retryable=True) from None
        # NoHealthyActor propagates: retried with backoff (OPTIONS) until one is back.
        return Generation(
            raw=gen.text,
            model=gen.model,
            endpoint=gen.endpoint,
            state_before=state,
            prompt_digest=prompt,
            token_ids=gen.token_ids,
            logprobs=gen.logprobs,
            latency_s=gen.latency_s,
            prompt_tokens=gen.prompt_tokens,
            completion_tokens=gen.completion_tokens,
            finish_reason=gen.finish_reason,
        )

    async def _structured(self, model: str) -> bool:
        """Whether ``model``'s server decodes against a JSON Schema, as the gateway will
        ask it (configs/models.yaml ``structured_output``, or what LiteLLM knows of an
        unconfigured model string); a name it refuses is the gateway's error to report."""
        try:
            _, spec = await asyncio.to_thread(self.llm.resolve, model)
        except (UnknownModelError, ModelNotAllowedError):
            return False
        return spec.structured_output != "none"

    async def _context(self, inp: GenerateInput) -> tuple[int, PromptTokenizer] | None:
        """The step's model's context length and tokenizer: a teacher's from
        configs/models.yaml (``context_length``, ``tokenizer``), the actor pool's smallest
        ``max_model_len`` (counted by the heuristic, which overestimates); None where it is
        unknown (a gold replay, a model without ``context_length``)."""
        if inp.source == "teacher":
            try:
                _, spec = await asyncio.to_thread(self.llm.resolve, inp.model)
            except (UnknownModelError, ModelNotAllowedError):
                return None
            if spec.context_length is None:
                return None
            return spec.context_length, await asyncio.to_thread(tokenizer_for, spec)
        if inp.source == "actor":
            pool = await self.actors()
            lengths = [e.max_model_len for e in pool.config.endpoints if e.max_model_len]
            return (min(lengths), HEURISTIC) if lengths else None
        return None

    async def _fit_prompt(
        self,
        task: SrlTask,
        inp: GenerateInput,
        text: str,
        messages_for: Callable[[str, str], list[dict[str, str]]],
    ) -> PromptFit | None:
        """The step's messages cut to the model's context less ``max_tokens``
        (``keel.srl.fit``), or None where the context is unknown. A prompt pack too long
        for the model whatever is cut is the configuration's fault: not retried."""
        context = await self._context(inp)
        if context is None:
            return None
        length, tokenizer = context
        _, goal = task.expert_at(inp.step)
        fit = await asyncio.to_thread(
            fit_prompt,
            messages_for,
            code=text,
            instruction=task.instruction,
            language=task.language,
            count=tokenizer.count_messages,
            budget=length - inp.max_tokens,
            focus=focus_line(text, goal),
        )
        if not fit.fits:
            raise ApplicationError(
                f"the prompt does not fit model {inp.model or inp.source!r}'s context of "
                f"{length} tokens with max_tokens {inp.max_tokens}, even with no code: "
                f"{fit.prompt_tokens} tokens ({tokenizer.name}). Lower --max-tokens or use "
                "a model with a larger context",
                type="SrlPromptTooLong",
                non_retryable=True,
            )
        return fit

    async def _fit(self, state: State, source: str) -> tuple[State, int]:
        """The state within ``STATE_BUDGET`` tokens, and its size.

        The heuristic counter overestimates, so a state it finds small enough fits. Only a
        larger one is measured with the serving model's tokenizer (the actor pool's
        endpoints: llama.cpp and vLLM offer one); the heuristic, scaled to that measure,
        then guides the trimming.
        """
        rendered = render(state)
        guess = heuristic_count_tokens(rendered)
        if guess <= STATE_BUDGET:
            return state, guess
        counter = heuristic_count_tokens
        if source == "actor":
            served = await (await self.actors()).count_tokens(rendered)
            if served is not None:
                ratio = served / guess

                def counter(text: str) -> int:
                    return math.ceil(heuristic_count_tokens(text) * ratio)

        fitted = fit_budget(state, STATE_BUDGET, counter)
        return fitted, counter(render(fitted))

    async def actors(self) -> ActorPool:
        """The worker's actor pool, started (first health check) on first use."""
        async with self._actors_lock:
            if self._actors is None:
                if self._actors_factory is None:
                    raise ApplicationError(
                        "this worker has no actor pool (configs/vllm_actors.yaml, "
                        "KEEL_SRL_ACTORS_CONFIG)",
                        type="SrlNoActors",
                        non_retryable=True,
                    )
                pool = self._actors_factory()
                await pool.start()
                self._actors = pool
            return self._actors

    @activity.defn(name=APPLY.name)
    async def apply(self, inp: ApplyInput) -> StepOutcome:
        return await heartbeating(self._apply(inp), every_s=HEARTBEAT_EVERY_S)

    async def _apply(self, inp: ApplyInput, jail: JailRuns | None = None) -> StepOutcome:
        """Score, record and count the step; ``jail`` as :meth:`_score` takes it."""
        task = self.task(inp.tasks_digest, inp.task_index)
        key = step_key(task.task_id, inp.step, inp.sample)
        text_digest = inp.text_digest
        if task.step_mode(inp.step_mode) == "expert_prefix":
            text = task.prefix_text(inp.step)
            text_digest = (
                None if text == task.pre else await self.puts.put_bytes(text.encode("utf-8"))
            )
        else:
            text = self.text(task, inp.text_digest)
        record, outcome = await self._score(task, inp, text, text_digest, jail)
        row = StepRow.from_record(
            record,
            collection=inp.collection,
            source=inp.source,
            model=inp.generation.model,
            language=task.language,
            template=task.template,
        )
        stored, recorded = await asyncio.to_thread(insert_step, self.sessions, row)
        meter = activity.metric_meter()
        if not recorded:
            # A retry of a step already written: the stored row is the step's truth.
            outcome = _outcome_of(StepRecord.model_validate_json(stored.record_json), key, task)
        if recorded:
            attrs = {"source": inp.source, "model": inp.generation.model}
            meter.create_counter("keel_srl_steps", "SRL steps recorded").add(1, attrs)
            if outcome.verified:
                meter.create_counter("keel_srl_verified_steps", "SRL verified steps").add(1, attrs)
            if outcome.sandbox_failed:
                meter.create_counter(
                    "keel_srl_sandbox_failures", "SRL actions the sandbox failed to apply"
                ).add(1, {"language": task.language})
        return outcome.model_copy(update={"recorded": recorded})


def _gold_generation(task: SrlTask, step: int, state: State, prompt: str) -> Generation:
    """The task file's expert action at ``step``, answered as a model would."""
    expert, _ = task.expert_at(step)
    if expert is None:  # a task made from a dataset record (srl tasks)
        raise tasks_invalid(
            f"task {task.task_id} has no gold action: gold_replay replays the task "
            "file's expert actions; collect from this file with a teacher or actors"
        )
    return Generation(
        raw=gold_answer(expert, task.instruction),
        model="gold",
        state_before=state,
        prompt_digest=prompt,
    )


def _fit_facts(fit: PromptFit) -> dict[str, Any]:
    """How the prompt was fitted, kept in the prompt's record."""
    return fit.model_dump(exclude={"messages", "fits"})


def _with_think(content: str, reasoning: str | None) -> str:
    """The answer as the model wrote it: LiteLLM moves a ``<think>`` block out of the
    content into ``reasoning_content``; the step format needs it back in place."""
    if reasoning is None or "<think>" in content:
        return content
    return f"<think>{reasoning}</think>{content}"


def _sampling(inp: GenerateInput) -> Sampling:
    return Sampling(
        sample=inp.sample,
        seed=inp.seed,
        temperature=inp.temperature,
        top_p=inp.top_p,
        max_tokens=inp.max_tokens,
    )


def _goal(task: SrlTask) -> StateUpdate:
    return goal_update(task.instruction)
