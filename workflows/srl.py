"""``SRLCollection`` and ``SRLEpisode``: SRL trajectory collection as durable workflows.

A collection runs its tasks as child ``SRLEpisode`` workflows (id
``srl/<collection>/<task_id>``, ``~s<k>`` appended for sample ``k`` >= 1 of ``samples``),
at most ``window`` in flight, and continues as new after ``per_run`` tasks, so a
10,000-task collection keeps every run's history small. Each sample has its own seed
(``keel.srl.trajectory.sample_seed``).
An episode repeats two activities until the action is verified or the step cap:

1. ``srl.generate``: the state rendered into the prompt, one answer from the source
   (gold replay, the teacher through the LLM gateway, or the actor pool);
2. ``srl.apply``: parse, apply in the sandbox, re-parse, reward, merge the state, and
   write the step row (idempotent by collection and ``<task_id>#<step>``).

The answer is in the history between the two, so a worker lost during ``srl.apply``
replays the same answer: the step is recorded once and never lost (docs/srl.md).

A collection run again under the same id resumes: ``srl.window`` refuses a run naming
another source, model or sampling, and ``srl.generate`` answers a step already recorded
with its stored outcome (``Generation.recorded``, no model call), which the episode takes
without ``srl.apply`` (patch ``srl-resume-recorded``).

Step modes (patch ``srl-step-mode``): by default (``expert_prefix``, the paper's) step n
starts from the file after the expert's steps 1..n-1, which its state shows, and the
episode takes the expert's number of steps; ``free_running`` goes on from the episode's
own last file until verified. The activities read the mode; the episode passes it on.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from keel.access import READERS_SIGNAL
    from keel.progress import RunProgress
    from keel.srl.batch import EPISODES, EpisodesInput
    from keel.srl.state import State
    from keel.srl.steps import (
        APPLY,
        COLLECTION_TYPE,
        EPISODE_TYPE,
        GENERATE,
        WINDOW,
        ApplyInput,
        CollectionInput,
        CollectionProgress,
        CollectionResult,
        CollectionTotals,
        EpisodeInput,
        EpisodeResult,
        GenerateInput,
        Generation,
        StepOutcome,
        WindowInput,
    )
    from keel.srl.trajectory import StepMode, episode_id, sample_seed
    from workflows.common import SRL_EPISODES_STEP_TIMEOUT, call
    from workflows.readers import ProgressMemo, upsert_readers

#: A step ``srl.generate`` found recorded is taken as it is, without ``srl.apply``.
RESUME_PATCH = "srl-resume-recorded"
#: Step modes: the episode asks its activities for ``step_mode`` (by default the paper's
#: ``expert_prefix``) and ``expert_feedback``; a run from before (no marker) runs free, with
#: the expert-derived feedback, as it did.
STEP_MODE_PATCH = "srl-step-mode"
#: A collection with ``batch`` > 0 runs its episodes ``batch`` at a time in ``srl.episodes``
#: activities (keel/srl/batch.py) instead of a child workflow each.
BATCH_PATCH = "srl-batched-episodes"


@workflow.defn(name=EPISODE_TYPE)
class SRLEpisode:
    """One task: steps until the action is verified or ``max_steps``."""

    @workflow.init
    def __init__(self, inp: EpisodeInput) -> None:
        self._totals = CollectionTotals(episodes=1)
        self._step = 0

    @workflow.query(name="progress")
    def progress(self) -> CollectionTotals:
        return self._totals

    @workflow.run
    async def run(self, inp: EpisodeInput) -> EpisodeResult:
        if workflow.patched(STEP_MODE_PATCH):
            step_mode, expert_feedback = inp.step_mode, inp.expert_feedback
        else:
            step_mode, expert_feedback = "free_running", True
        state = State()
        text_digest: str | None = None
        verified = False
        for step in range(1, inp.max_steps + 1):
            self._step = step
            generation = await _generate(inp, step, state, text_digest, step_mode)
            reused = generation.recorded is not None and workflow.patched(RESUME_PATCH)
            if reused and generation.recorded is not None:
                outcome = generation.recorded
            else:
                outcome = await _apply(
                    inp, step, generation, text_digest, step_mode, expert_feedback
                )
            self._totals = self._totals.plus(CollectionTotals.of_step(outcome, reused=reused))
            state, text_digest = outcome.state, outcome.text_digest
            if outcome.done:
                verified = outcome.verified
                break
        if verified:
            self._totals = self._totals.plus(CollectionTotals(verified_episodes=1))
        return EpisodeResult(
            task_id=inp.task_id, steps=self._step, verified=verified, totals=self._totals
        )


async def _generate(
    inp: EpisodeInput, step: int, state: State, text_digest: str | None, step_mode: StepMode
) -> Generation:
    """``srl.generate``: the step's answer from the episode's source."""
    return await call(
        GENERATE,
        GenerateInput(
            collection=inp.collection,
            tasks_digest=inp.tasks_digest,
            task_index=inp.task_index,
            step=step,
            source=inp.source,
            model=inp.model,
            state=state,
            text_digest=text_digest,
            temperature=inp.temperature,
            max_tokens=inp.max_tokens,
            seed=inp.seed + step,
            top_p=inp.top_p,
            sample=inp.sample,
            step_mode=step_mode,
        ),
        summary=f"step {step}: {inp.source} proposes an action",
    )


async def _apply(
    inp: EpisodeInput,
    step: int,
    generation: Generation,
    text_digest: str | None,
    step_mode: StepMode,
    expert_feedback: bool,
) -> StepOutcome:
    """``srl.apply``: the answer applied in the sandbox, rewarded and recorded."""
    return await call(
        APPLY,
        ApplyInput(
            collection=inp.collection,
            tasks_digest=inp.tasks_digest,
            task_index=inp.task_index,
            step=step,
            source=inp.source,
            state=generation.state_before,
            text_digest=text_digest,
            generation=generation,
            sample=inp.sample,
            step_mode=step_mode,
            expert_feedback=expert_feedback,
        ),
        summary=f"step {step}: sandbox, reward, record",
    )


@workflow.defn(name=COLLECTION_TYPE)
class SRLCollection:
    """Tasks ``offset..offset+per_run`` of a task file as episodes, then continue as new."""

    @workflow.init
    def __init__(self, inp: CollectionInput) -> None:
        self._inp = inp
        self._task_count = inp.task_count
        self._totals = inp.totals
        self._done = inp.offset * inp.samples
        self._in_flight = 0
        self._modes = False
        # Episodes done of all, in the run's progress memo (GET /runs reads it).
        self._memo = ProgressMemo()

    @workflow.signal(name=READERS_SIGNAL)
    def refresh_readers(self) -> None:
        """Set ``KeelReaders`` from the access memo (``keel migrate-search-attributes``)."""
        upsert_readers()

    @workflow.query(name="progress")
    def progress(self) -> CollectionProgress:
        return CollectionProgress(
            collection=self._inp.collection,
            task_count=self._task_count,
            done=self._done,
            in_flight=self._in_flight,
            totals=self._totals,
            runs=self._inp.offset // self._inp.per_run + 1,
            samples=self._inp.samples,
        )

    @workflow.run
    async def run(self, inp: CollectionInput) -> CollectionResult:
        # A run from before step modes starts its episodes without one (free running).
        self._modes = workflow.patched(STEP_MODE_PATCH)
        self._memo.start()
        self._show()
        window = await call(
            WINDOW,
            WindowInput(
                tasks_digest=inp.tasks_digest,
                tasks_file=inp.tasks_file,
                start=inp.offset,
                count=inp.per_run,
                identity=inp.identity(),
            ),
            summary=f"tasks from {inp.offset}",
        )
        self._task_count = window.task_count
        self._show()
        if inp.batch and workflow.patched(BATCH_PATCH):
            await self._batches(inp, window.tasks_digest, window.task_ids)
        else:
            await self._episodes(inp, window.tasks_digest, window.task_ids)
        end = inp.offset + len(window.task_ids)
        if end < window.task_count:
            workflow.continue_as_new(
                inp.model_copy(
                    update={
                        "offset": end,
                        "totals": self._totals,
                        "tasks_digest": window.tasks_digest,
                        "tasks_file": None,
                        "task_count": window.task_count,
                    }
                )
            )
        return CollectionResult(
            collection=inp.collection,
            tasks_digest=window.tasks_digest,
            task_count=window.task_count,
            totals=self._totals,
        )

    async def _episodes(self, inp: CollectionInput, digest: str, task_ids: list[str]) -> None:
        """Run the episodes (``samples`` a task) with at most ``window`` in flight, in task
        and sample order."""
        pending: set[asyncio.Task[EpisodeResult | None]] = set()
        for child in self._children(inp, digest, task_ids):
            if len(pending) >= inp.window:
                pending = await self._settle(pending)
            pending.add(asyncio.create_task(self._episode(child)))
            self._in_flight = len(pending)
        while pending:
            pending = await self._settle(pending)

    def _children(
        self, inp: CollectionInput, digest: str, task_ids: list[str]
    ) -> list[EpisodeInput]:
        """The run's episodes (``samples`` a task), in task and sample order."""
        children = []
        for i, task_id in enumerate(task_ids):
            for sample in range(inp.samples):
                child = EpisodeInput(
                    collection=inp.collection,
                    tasks_digest=digest,
                    task_index=inp.offset + i,
                    task_id=task_id,
                    source=inp.source,
                    model=inp.model,
                    max_steps=inp.max_steps,
                    temperature=inp.temperature,
                    max_tokens=inp.max_tokens,
                    seed=sample_seed(inp.collection, task_id, sample, inp.seed),
                    top_p=inp.top_p,
                    sample=sample,
                )
                if self._modes:
                    child = child.model_copy(
                        update={"step_mode": inp.step_mode, "expert_feedback": inp.expert_feedback}
                    )
                children.append(child)
        return children

    async def _batches(self, inp: CollectionInput, digest: str, task_ids: list[str]) -> None:
        """Run the episodes ``batch`` at a time in ``srl.episodes``, twice ``window``
        episodes in flight (rounded up to whole batches): ``window`` model calls go on
        (each worker's call gate) while other batches' answers are applied."""
        children = self._children(inp, digest, task_ids)
        most = 2 * math.ceil(inp.window / inp.batch)
        pending: set[asyncio.Task[list[EpisodeResult | None]]] = set()
        for start in range(0, len(children), inp.batch):
            if len(pending) >= most:
                pending = await self._settle_batches(pending)
            batch = children[start : start + inp.batch]
            pending.add(asyncio.create_task(self._batch(batch, inp.window)))
            self._in_flight += len(batch)
        while pending:
            pending = await self._settle_batches(pending)

    async def _settle_batches(
        self, pending: set[asyncio.Task[list[EpisodeResult | None]]]
    ) -> set[asyncio.Task[list[EpisodeResult | None]]]:
        done, rest = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            for result in task.result():
                self._done += 1
                self._in_flight -= 1
                self._totals = self._totals.plus(
                    result.totals
                    if result is not None
                    else CollectionTotals(episodes=1, failed_episodes=1)
                )
        self._show()
        return set(rest)

    async def _batch(self, batch: list[EpisodeInput], calls: int) -> list[EpisodeResult | None]:
        """A batch's results; all ``None`` (failed) when ``srl.episodes`` gave up."""
        first, last = batch[0], batch[-1]
        try:
            result = await call(
                EPISODES,
                EpisodesInput(episodes=batch, calls=calls),
                summary=f"{len(batch)} episodes: tasks {first.task_id}..{last.task_id}",
                start_to_close=SRL_EPISODES_STEP_TIMEOUT * first.max_steps,
            )
        except ActivityError as err:
            workflow.logger.warning(
                "episodes %s..%s failed: %s", first.task_id, last.task_id, err.cause or err
            )
            return [None] * len(batch)
        return list(result.results)

    async def _settle(
        self, pending: set[asyncio.Task[EpisodeResult | None]]
    ) -> set[asyncio.Task[EpisodeResult | None]]:
        done, rest = await workflow.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            result = task.result()
            self._done += 1
            self._totals = self._totals.plus(
                result.totals
                if result is not None
                else CollectionTotals(episodes=1, failed_episodes=1)
            )
        self._in_flight = len(rest)
        self._show()
        return set(rest)

    def _show(self) -> None:
        """Episodes done of all (tasks, or tasks times samples), in the progress memo."""
        samples = self._inp.samples
        count = self._task_count
        self._memo.show(
            RunProgress(
                done=self._done,
                total=None if count is None else count * samples,
                unit="tasks" if samples == 1 else "episodes",
            )
        )

    async def _episode(self, child: EpisodeInput) -> EpisodeResult | None:
        """One episode's result, or ``None`` when it failed (counted, the collection goes on)."""
        try:
            result: EpisodeResult = await workflow.execute_child_workflow(
                EPISODE_TYPE,
                child,
                id=episode_id(child.collection, child.task_id, child.sample),
                result_type=EpisodeResult,
                execution_timeout=timedelta(hours=6),
                static_summary=f"task {child.task_id}"
                + (f" sample {child.sample}" if child.sample else ""),
            )
        except ChildWorkflowError as err:
            workflow.logger.warning("episode %s failed: %s", child.task_id, err.cause or err)
            return None
        return result
