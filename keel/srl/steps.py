"""SRL collections and episodes as a workflow sees them: inputs, results, activity models
and references.

``workflows/srl.py`` runs ``SRLCollection`` (windows of ``SRLEpisode`` children, continued
as new) and ``SRLEpisode`` (generate → apply, until verified or the step cap); the
activities in ``activities/srl/`` implement each reference under the same name. Pure
models: no I/O. A task list is a JSONL file of :class:`SrlTask` lines in the artifact
store, named by its digest, so no history carries the code itself.
"""

from __future__ import annotations

from typing import Final

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from keel.problems import problems
from keel.refs import ActivityRef
from keel.srl.checks import TaskTest, check_tests
from keel.srl.expert import Expert
from keel.srl.intent import instruction_leaks
from keel.srl.state import State, StateUpdate, merge
from keel.srl.step import Language, PatternAction, RuleAction
from keel.srl.trajectory import Sampling, Source, StepMode, check_id

#: The workflow types (workflows/srl.py), named here so clients and the API need no
#: workflow module.
COLLECTION_TYPE: Final = "SRLCollection"
EPISODE_TYPE: Final = "SRLEpisode"

MAX_STEPS: Final = 20
MAX_WINDOW: Final = 200
MAX_PER_RUN: Final = 1000
MAX_FILE_CHARS: Final = 200_000
MAX_SAMPLES: Final = 64
#: The ApplicationError type of a task file (or task) that cannot be used: not retried.
ERROR_SRL_TASKS: Final = "SrlTasksInvalid"
#: The ApplicationError type of a re-run naming another source, model or sampling than the
#: collection was recorded with: not retried.
ERROR_SRL_IDENTITY: Final = "SrlCollectionMismatch"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SrlTask(BaseModel):
    """One refactoring task of a collection: a file, what to do, and the expert action.

    A ``keel.srl.synth.SynthTask`` line is one (its other fields are ignored here and
    stay in the task file). ``gold_action`` is ``None`` for a task made from a dataset
    record (``srl tasks``): the record has the post-text, not the action that makes it,
    so such a task cannot be gold-replayed. ``post`` must differ from ``pre``, a gold
    action be in the task's language, and the instruction state intent: it must not give
    the gold action or an expert step's action away (:mod:`keel.srl.intent`).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    task_id: str
    instruction: str = Field(min_length=1, max_length=4000)
    language: Language
    file: str = Field(min_length=1, max_length=512)
    pre: str = Field(max_length=MAX_FILE_CHARS)
    post: str = Field(max_length=MAX_FILE_CHARS)
    gold_action: PatternAction | None = None
    #: The expert trajectory (``srl expert`` writes it from a verified collection): an
    #: actor's step n is scored against the expert's step n, and its result against the
    #: file after that step. ``None``: the gold action against ``post``, as before.
    expert: Expert | None = None
    template: str | None = Field(None, max_length=64)
    #: Python checks the jail runs on the file after each action (keel.srl.checks):
    #: ``tests_passed`` in the reward is the fraction that pass; empty: no tests, and
    #: ``tests_passed`` is ``None``.
    tests: list[TaskTest] = Field(default_factory=list)

    @field_validator("task_id")
    @classmethod
    def _id(cls, value: str) -> str:
        return check_id(value, "task id")

    @field_validator("tests")
    @classmethod
    def _tests(cls, value: list[TaskTest]) -> list[TaskTest]:
        check_tests(value)
        return value

    @model_validator(mode="after")
    def _a_change_in_the_task_language(self) -> SrlTask:
        # An unchanged file would verify a do-nothing action; an expert action in another
        # language would never be applied (actions run in the task's language only).
        if self.pre == self.post:
            raise ValueError("post equals pre: a task must ask for a change")
        if self.gold_action is not None and self.gold_action.language != self.language:
            raise ValueError(
                f"gold_action.language {self.gold_action.language!r} is not the task's "
                f"language {self.language!r}"
            )
        if self.expert is not None:
            if self.expert.steps[-1].text_after != self.post:
                raise ValueError("expert: its last step's file is not the task's post")
            if any(s.action.language != self.language for s in self.expert.steps):
                raise ValueError("expert: a step's action is not in the task's language")
        # The instruction states intent; the action it is scored against is the answer.
        actions: list[PatternAction | RuleAction] = [
            *([self.gold_action] if self.gold_action is not None else []),
            *(s.action for s in (self.expert.steps if self.expert is not None else [])),
        ]
        if actions:
            leaks = instruction_leaks(self.instruction, actions, self.pre)
            if leaks:
                raise ValueError(
                    "instruction gives the expert action away ("
                    + "; ".join(leaks)
                    + "): say what to change and why, as a person would ask"
                )
        return self

    def expert_at(self, step: int) -> tuple[PatternAction | RuleAction | None, str]:
        """The expert's action for ``step`` and the file after it: the expert trajectory's
        step (its last one past its end), else the gold action (or none) and ``post``."""
        if self.expert is not None:
            n = min(step, len(self.expert.steps))
            at = self.expert.steps[n - 1]
            return at.action, at.text_after
        return self.gold_action, self.post

    @property
    def expert_step_count(self) -> int:
        """How many steps the expert took: the expert trajectory's, 1 for a gold action,
        0 for a task without an expert action (a dataset record's)."""
        if self.expert is not None:
            return len(self.expert.steps)
        return 1 if self.gold_action is not None else 0

    def step_mode(self, asked: StepMode) -> StepMode:
        """The mode an episode of this task runs in: ``expert_prefix`` needs an expert
        action; a task without one (nothing to prefix) runs free."""
        return asked if self.expert_step_count else "free_running"

    def prefix_text(self, step: int) -> str:
        """The file after the expert's steps ``1..step-1`` (``pre`` at step 1; past the
        expert's end, the file after its last step but one), where an ``expert_prefix``
        step starts."""
        if self.expert is None or step <= 1:
            return self.pre
        n = min(step, len(self.expert.steps))
        return self.pre if n <= 1 else self.expert.steps[n - 2].text_after

    def prefix_state(self, step: int) -> State:
        """The state an ``expert_prefix`` step starts from: the goal, and the expert's
        steps ``1..step-1`` in the history (the newest 3 kept, as any history)."""
        lines: list[str] = []
        if self.expert is not None:
            count = min(step, len(self.expert.steps)) - 1
            lines = [
                f"step {k + 1} (expert): {action_summary(s.action)}"
                for k, s in enumerate(self.expert.steps[:count])
            ]
        return merge(State(), goal_update(self.instruction).model_copy(update={"history": lines}))

    @property
    def file_name(self) -> str:
        """The file's name in the sandbox workspace (its base name: one file a task)."""
        return base_name(self.file)


def goal_update(instruction: str) -> StateUpdate:
    """A task's goal as the state's first update: its instruction, cut to the state's
    256 characters a goal."""
    return StateUpdate(goals=[instruction[:256]])


def base_name(file: str) -> str:
    """A task file's name in the sandbox workspace: its base name (one file a task)."""
    return file.replace("\\", "/").rsplit("/", 1)[-1] or "file"


def action_summary(action: PatternAction | RuleAction) -> str:
    """One line naming what an action does: ``pattern -> rewrite``, or a rule's YAML with
    its lines joined (the state cuts it to 256 characters)."""
    if isinstance(action, PatternAction):
        return f"applied `{action.pattern}` -> `{action.rewrite}`"
    return "applied the rule " + " ".join(action.yaml_text.split())


class TasksInvalid(ValueError):
    """A task file line that is not an :class:`SrlTask` (the message names the line)."""


def parse_tasks(data: bytes) -> list[SrlTask]:
    """The tasks of a JSONL task file; a bad line is named by its number, a repeated task
    id too (a step key is ``<task_id>#<step>``: two tasks with one id would share rows)."""
    tasks: list[SrlTask] = []
    seen: set[str] = set()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TasksInvalid(f"task file is not UTF-8: {e}") from None
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = SrlTask.model_validate_json(line)
        except ValidationError as e:
            raise TasksInvalid(f"task file line {n}: {problems(e, root='line')}") from None
        if task.task_id in seen:
            raise TasksInvalid(f"task file line {n}: task id {task.task_id!r} repeats")
        seen.add(task.task_id)
        tasks.append(task)
    return tasks


def check_source(tasks: list[SrlTask], source: str) -> None:
    """Refuse, before anything starts, a gold replay of tasks that have no expert action
    (``srl tasks`` makes such tasks from dataset records): every episode would fail."""
    if source != "gold_replay":
        return
    missing = [t.task_id for t in tasks if t.gold_action is None and t.expert is None]
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise TasksInvalid(
            f"gold_replay replays each task's expert action, and {len(missing)} of "
            f"{len(tasks)} tasks have none ({', '.join(missing[:3])}{more}): collect them "
            "with --source teacher or actor, then `srl expert` makes the expert set"
        )


class Generation(_Model):
    """What the model (or the gold replay) answered for one step."""

    raw: str
    model: str
    state_before: State = Field(description="the state the prompt showed (goals seeded)")
    endpoint: str = ""
    prompt_digest: str = Field(
        description="the prompt (messages, step, state size) in the artifact store: the code "
        "it shows stays out of the history"
    )
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    latency_s: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    #: Why the model stopped (``length``: cut at ``max_tokens``; such an answer that does
    #: not parse is recorded as truncated, not malformed).
    finish_reason: str | None = None
    cost_usd: float | None = None
    sampling: Sampling | None = Field(
        None, description="sample, seed and sampling parameters this answer was drawn with"
    )
    recorded: StepOutcome | None = Field(
        None,
        description="the step was already recorded (a collection run again): its stored "
        "outcome, no model called; the episode goes on from it without srl.apply",
    )
    #: The server was asked to decode against the step's JSON Schema (the JSON form).
    structured: bool = False


class CollectionTotals(_Model):
    """Counters of a collection so far (carried across continue-as-new)."""

    episodes: int = 0
    steps: int = 0
    verified_steps: int = 0
    verified_episodes: int = 0
    format_errors: int = 0
    sandbox_failures: int = 0
    failed_episodes: int = 0
    reused_steps: int = Field(
        default=0, description="steps found recorded by an earlier run: no model call"
    )

    @classmethod
    def of_step(cls, outcome: StepOutcome, *, reused: bool) -> CollectionTotals:
        """One step's counts (an episode's child workflow and a batch count alike)."""
        return cls(
            steps=1,
            verified_steps=int(outcome.verified),
            format_errors=int(not outcome.format_ok),
            sandbox_failures=int(outcome.sandbox_failed),
            reused_steps=int(reused),
        )

    def plus(self, other: CollectionTotals) -> CollectionTotals:
        return CollectionTotals(
            **{k: getattr(self, k) + getattr(other, k) for k in CollectionTotals.model_fields}
        )


class CollectionOptions(_Model):
    """Who answers and how much at once: what ``srl collect``, ``POST /srl/collections``
    and ``temporal workflow start`` all take, with the same bounds.

    ``batch`` > 0 runs the episodes ``batch`` at a time in ``srl.episodes`` activities
    (keel/srl/batch.py), ``window`` then bounding the model calls in flight on each
    worker and twice that many episodes in flight; 0 (the default, and every run from
    before) runs each episode as a child ``SRLEpisode`` workflow. The trade: batches are
    faster at volume (no workflow start and two activities a step), but an answer a
    worker received and had not yet recorded is asked again after that worker is lost
    (a child keeps it in its history)."""

    source: Source = "gold_replay"
    model: str = Field(default="", max_length=200)
    max_steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    window: int = Field(default=8, ge=1, le=MAX_WINDOW)
    per_run: int = Field(default=200, ge=1, le=MAX_PER_RUN)
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    max_tokens: int = Field(default=512, ge=16, le=8192)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    samples: int = Field(
        default=1, ge=1, le=MAX_SAMPLES, description="rollouts per task, each with its own seed"
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="base of every sample's seed")
    step_mode: StepMode = Field(
        default="expert_prefix",
        description="expert_prefix (the paper's): step n starts from the file after the "
        "expert's steps 1..n-1, shown in the state, and the episode takes the expert's "
        "number of steps; free_running: step n starts from the episode's own last file, "
        "until verified (a task without an expert action always runs free)",
    )
    expert_feedback: bool = Field(
        default=False,
        description="let feedback derived from the expert's file ('the file now matches "
        "the goal', 'removed code the goal keeps', 'does not match the goal yet') into the "
        "state the next prompt shows; off: only what the jail saw (failed, unchanged, "
        "does not parse, changed)",
    )
    batch: int = Field(
        default=0,
        ge=0,
        le=MAX_PER_RUN,
        description="episodes per srl.episodes activity; 0: a child workflow per episode",
    )


class CollectionIdentity(_Model):
    """What a collection's recorded steps were drawn with, kept once in SQL: a run naming
    another source, model or sampling under the same id is refused, since its steps would
    be reused for answers it did not ask for. ``tasks_digest`` is the first run's file
    (another file is accepted: tasks are matched by id)."""

    collection: str
    source: Source
    model: str = ""
    tasks_digest: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int = 0

    def mismatch(self, other: CollectionIdentity) -> str | None:
        """A sentence naming what differs (both values), or None when ``other`` may reuse
        this collection's steps."""
        fields = ("source", "model", "temperature", "top_p", "max_tokens", "seed")
        diff = [f for f in fields if getattr(self, f) != getattr(other, f)]
        if not diff:
            return None
        was = ", ".join(f"{f} {getattr(self, f)!r}" for f in diff)
        now = ", ".join(f"{f} {getattr(other, f)!r}" for f in diff)
        return (
            f"collection {self.collection!r} was recorded with {was}; this run names {now}. "
            "Use another collection id for another source, model or sampling"
        )


class CollectionInput(CollectionOptions):
    """Input of ``SRLCollection``: which tasks, who answers, and how much at once.

    The tasks are a JSONL file of :class:`SrlTask` lines: ``tasks_digest`` names one in
    the artifact store (``srl collect`` and the API put it there), or ``tasks_file`` a path
    the worker reads (for ``temporal workflow start`` with plain JSON; the first window
    stores it, and the collection goes on by its digest). ``source`` says who proposes
    each step: ``gold_replay`` (the task's gold action, passed through the same parser,
    sandbox and rewards: the expert source, never a model's precision), ``teacher``
    (``model`` from configs/models.yaml through the LLM gateway) or ``actor`` (the actor
    pool of configs/vllm_actors.yaml, scored against the expert). ``offset``,
    ``task_count`` and ``totals`` are the collection's own bookkeeping across
    continue-as-new; a caller leaves them out.
    """

    collection: str
    tasks_digest: str | None = Field(None, pattern=r"^blake3:[0-9a-f]{64}$")
    tasks_file: str | None = Field(None, min_length=1, max_length=1000)
    offset: int = Field(default=0, ge=0)
    task_count: int | None = Field(default=None, ge=0)
    totals: CollectionTotals = Field(default_factory=CollectionTotals)

    @field_validator("collection")
    @classmethod
    def _id(cls, value: str) -> str:
        return check_id(value, "collection")

    @model_validator(mode="after")
    def _one_task_source(self) -> CollectionInput:
        if (self.tasks_digest is None) == (self.tasks_file is None):
            raise ValueError("give exactly one of tasks_digest and tasks_file")
        return self

    def identity(self, tasks_digest: str = "") -> CollectionIdentity:
        return CollectionIdentity(
            collection=self.collection,
            source=self.source,
            model=self.model,
            tasks_digest=tasks_digest or self.tasks_digest or "",
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=self.max_tokens,
            seed=self.seed,
        )


class CollectionResult(_Model):
    collection: str
    tasks_digest: str
    task_count: int
    totals: CollectionTotals


class CollectionProgress(_Model):
    """What the ``progress`` query returns: the totals so far and where the run is."""

    collection: str
    task_count: int | None = Field(description="None until the first window read the tasks")
    done: int
    in_flight: int
    totals: CollectionTotals
    runs: int = Field(description="workflow runs so far (continue-as-new adds one)")
    samples: int = Field(default=1, description="episodes per task (done counts episodes)")


class EpisodeInput(_Model):
    collection: str
    tasks_digest: str
    task_index: int = Field(ge=0)
    task_id: str
    source: Source
    model: str = ""
    max_steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0
    top_p: float = 1.0
    sample: int = Field(default=0, ge=0)
    # Left out (an input of a run from before step modes): free running, with the
    # expert-derived feedback, as then.
    step_mode: StepMode = "free_running"
    expert_feedback: bool = True


class EpisodeResult(_Model):
    task_id: str
    steps: int
    verified: bool
    totals: CollectionTotals


class WindowInput(_Model):
    tasks_digest: str | None = None
    tasks_file: str | None = None
    start: int = Field(ge=0)
    count: int = Field(ge=1, le=MAX_PER_RUN)
    identity: CollectionIdentity | None = Field(
        None, description="recorded on the first run, checked on every later one"
    )


class WindowTasks(_Model):
    """Task ids ``start..start+count`` of the task file, by index (ids only: the code
    stays out of the history), with the file's digest and its number of tasks."""

    tasks_digest: str
    task_count: int
    task_ids: list[str]


class GenerateInput(_Model):
    collection: str
    tasks_digest: str
    task_index: int
    step: int = Field(ge=1)
    source: Source
    model: str = ""
    state: State
    text_digest: str | None = Field(None, description="the file now; None: the task's pre")
    temperature: float = 0.0
    max_tokens: int = 512
    seed: int = 0
    top_p: float = 1.0
    sample: int = Field(default=0, ge=0)
    #: ``expert_prefix``: the file and state are the expert's prefix (``state`` and
    #: ``text_digest`` are not read). Left out: free running, as before step modes.
    step_mode: StepMode = "free_running"


class ApplyInput(_Model):
    collection: str
    tasks_digest: str
    task_index: int
    step: int = Field(ge=1)
    source: Source
    state: State
    text_digest: str | None = None
    generation: Generation
    sample: int = Field(default=0, ge=0)
    step_mode: StepMode = "free_running"
    #: Left out (a run from before this setting): the expert-derived feedback, as then.
    expert_feedback: bool = True


class StepOutcome(_Model):
    """What one applied step changed: the reward signals, the new state and file."""

    step_key: str
    format_ok: bool
    applied: bool
    verified: bool
    reward_total: float
    state: State
    text_digest: str | None
    done: bool
    recorded: bool = Field(description="False when the row was already there (a retry)")
    sandbox_failed: bool = False


Generation.model_rebuild()

WINDOW: Final = ActivityRef("srl.window", WindowInput, WindowTasks)
GENERATE: Final = ActivityRef("srl.generate", GenerateInput, Generation)
APPLY: Final = ActivityRef("srl.apply", ApplyInput, StepOutcome)
