"""``srl.episodes``: a batch of episodes in one activity (keel/srl/batch.py says why).

Each episode runs as ``SRLEpisode`` does, step by step: the answer (``srl.generate``'s:
a step already recorded is taken as it is, without a model call), then, for a new
answer, ``srl.apply``'s scoring and row. The batch's episodes run side by side; their
model calls wait for the collection's call gate on this worker (``calls`` in flight),
and their jail runs are grouped (:class:`activities.srl.jail.GroupedRuns`).

An episode whose step fails for good (an ``ApplicationError`` marked non-retryable: a
task the file lacks, a prompt too long, an actor refusing the request) is a failed
episode, as its child workflow would be, and the others go on. Any other error (a model
or the store down) fails the batch's attempt; the retry finds each step recorded so far
and goes on from there.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from temporalio.exceptions import ApplicationError

from activities.srl.jail import GroupedRuns, JailRuns
from keel.srl.batch import EpisodesInput, EpisodesResult
from keel.srl.state import State
from keel.srl.steps import (
    ApplyInput,
    CollectionTotals,
    EpisodeInput,
    EpisodeResult,
    GenerateInput,
    Generation,
    StepOutcome,
)

log = logging.getLogger(__name__)


class SrlActivities(Protocol):
    """What a batch needs of ``activities.srl.episode.SrlActivities`` (a protocol, so
    this module does not import the one that imports it)."""

    grouped_runs: GroupedRuns

    def call_gate(self, collection: str, calls: int) -> asyncio.Semaphore:
        """The collection's model calls in flight on this worker."""

    async def answer(self, inp: GenerateInput, gate: asyncio.Semaphore) -> Generation:
        """``srl.generate``'s answer: the recorded step, or the source's, under ``gate``."""

    async def _apply(self, inp: ApplyInput, jail: JailRuns | None = None) -> StepOutcome:
        """``srl.apply``'s scoring and row, its jail runs through ``jail``."""


async def run_episodes(acts: SrlActivities, inp: EpisodesInput) -> EpisodesResult:
    """Every episode of ``inp``, side by side; their results in its order."""
    gate = acts.call_gate(inp.episodes[0].collection, inp.calls)
    jail = acts.grouped_runs
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(_episode(acts, ep, gate, jail)) for ep in inp.episodes]
    return EpisodesResult(results=[t.result() for t in tasks])


async def _episode(
    acts: SrlActivities, inp: EpisodeInput, gate: asyncio.Semaphore, jail: GroupedRuns
) -> EpisodeResult | None:
    """One episode as ``SRLEpisode`` runs it; ``None`` when a step failed for good."""
    totals = CollectionTotals(episodes=1)
    state = State()
    text_digest: str | None = None
    verified = False
    steps = 0
    for step in range(1, inp.max_steps + 1):
        steps = step
        try:
            generation = await acts.answer(_generate_input(inp, step, state, text_digest), gate)
            reused = generation.recorded is not None
            if generation.recorded is not None:
                outcome: StepOutcome = generation.recorded
            else:
                outcome = await acts._apply(
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
                        step_mode=inp.step_mode,
                        expert_feedback=inp.expert_feedback,
                    ),
                    jail,
                )
        except ApplicationError as err:
            if not err.non_retryable:
                raise
            log.warning("episode %s failed: %s", inp.task_id, err)
            return None
        totals = totals.plus(CollectionTotals.of_step(outcome, reused=reused))
        state, text_digest = outcome.state, outcome.text_digest
        if outcome.done:
            verified = outcome.verified
            break
    if verified:
        totals = totals.plus(CollectionTotals(verified_episodes=1))
    return EpisodeResult(task_id=inp.task_id, steps=steps, verified=verified, totals=totals)


def _generate_input(
    inp: EpisodeInput, step: int, state: State, text_digest: str | None
) -> GenerateInput:
    """What ``SRLEpisode`` asks ``srl.generate`` for at ``step``."""
    return GenerateInput(
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
        step_mode=inp.step_mode,
    )
