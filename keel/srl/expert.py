"""Expert trajectories: the verified steps of a collection, kept step by step, as the
expert an actor's steps are scored against (the SRL paper's step-wise reward compares an
actor's step n with the expert's step n).

A dataset record has a ``pre`` and a ``post`` but no action. The teacher proposes actions
on such tasks; the sandbox verifies them against ``post``; the verified episodes become
expert trajectories (``srl expert``), written into the task file as each task's
``expert``; an actor or teacher collection over that file is scored step by step. Pure:
records and file texts come in, models go out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from keel.srl.step import Action, PatternAction, RuleAction
from keel.srl.trajectory import StepRecord

#: Steps an expert trajectory may have (the episode step cap).
MAX_EXPERT_STEPS = 20

_ACTION: TypeAdapter[PatternAction | RuleAction] = TypeAdapter(Action)


class ExpertStep(BaseModel):
    """One step of an expert trajectory: the action, and the file after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    action: Action
    text_after: str = Field(max_length=200_000)
    #: The reasoning of the step that became this one (its think text; ``None`` where
    #: none was kept): a gold replay's exported completion thinks it (docs/srl-export.md).
    think: str | None = Field(default=None, max_length=20_000)


class Expert(BaseModel):
    """A task's expert trajectory and where it came from (collection, source, model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[ExpertStep] = Field(min_length=1, max_length=MAX_EXPERT_STEPS)
    collection: str = ""
    source: str = ""
    model: str = ""


def expert_steps(
    records: Sequence[StepRecord], texts: Mapping[str, str]
) -> list[ExpertStep] | None:
    """The expert steps of one episode, or ``None`` when it did not end verified.

    ``records`` are the episode's steps (any order); ``texts`` maps each record's
    ``text_digest`` to the file it names. Kept: the steps that changed the file (a
    malformed answer, a failed action or one that matched nothing is no step of the
    expert's), in order; the last one's file is the task's ``post``.
    """
    ordered = sorted(records, key=lambda r: r.step)
    if not ordered or ordered[-1].reward is None or not ordered[-1].reward.verified:
        return None
    steps: list[ExpertStep] = []
    before: str | None = None  # the text digest before this step (None: the task's pre)
    for record in ordered:
        digest = record.text_digest
        action = record.model_output.action
        if digest is not None and digest != before and action is not None:
            try:
                parsed = _ACTION.validate_python(action)
            except ValidationError:
                return None  # a record this version cannot read: no expert from it
            think = record.model_output.think.strip()[:20_000] or None
            steps.append(ExpertStep(action=parsed, text_after=texts[digest], think=think))
        before = digest
    return steps or None
