"""Batched episodes: a collection whose episodes run ``batch`` at a time in one activity
(``srl.episodes``) instead of one child ``SRLEpisode`` workflow each
(``CollectionOptions.batch`` > 0, in keel/srl/steps.py: ``srl collect --batch``, the
API's ``batch``).

A child workflow per episode costs a workflow start, two activities a step and their
workflow tasks, each a round trip through the server; at volume (10,000 tasks) that and
three jail runs a step are most of a collection's time. ``srl.episodes`` runs a batch's
episodes side by side in one activity, step by step: the step's answers (at most
``calls`` model calls in flight on a worker), then every answer of the step applied
together (one jail run per distinct action and language, not three per step), and the
step rows written in one transaction. Each row is written when its step is done, keyed
as an episode's is (``<task_id>#<step>``), so a batch retried after a lost worker finds
every step its first attempt recorded and asks no model for it; an answer the worker had
received but not yet recorded is asked again (an episode's child workflow keeps that
answer in its history; a batch does not).

Pure models: no I/O.
"""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from keel.refs import ActivityRef
from keel.srl.steps import MAX_PER_RUN, MAX_WINDOW, EpisodeInput, EpisodeResult


class EpisodesInput(BaseModel):
    """Input of ``srl.episodes``: the batch's episodes and the model calls allowed in
    flight (per worker and collection)."""

    model_config = ConfigDict(extra="forbid")

    episodes: list[EpisodeInput] = Field(min_length=1, max_length=MAX_PER_RUN)
    calls: int = Field(default=8, ge=1, le=MAX_WINDOW)


class EpisodesResult(BaseModel):
    """Each episode's result, in the input's order; ``None`` for one that failed (a step
    the source refused for good: counted as a failed episode, as a failed child is)."""

    model_config = ConfigDict(extra="forbid")

    results: list[EpisodeResult | None]


#: The episodes of one batch, their steps recorded as they end (activities/srl/batch.py).
EPISODES: Final = ActivityRef("srl.episodes", EpisodesInput, EpisodesResult)
