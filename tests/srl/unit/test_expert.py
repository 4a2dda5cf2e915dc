"""Expert trajectories from recorded steps: only verified episodes, only the steps that
changed the file, in order, each with the file after it."""

from __future__ import annotations

from typing import Any

from keel.srl.expert import Expert, ExpertStep, expert_steps
from keel.srl.rewards import Reward, format_error_reward
from keel.srl.step import PatternAction, RuleAction, parse_rule_action
from keel.srl.trajectory import ModelOutput, StepRecord

SWAP = PatternAction(pattern="f($A, $B)", rewrite="f($B, $A)", language="python")
RENAME = parse_rule_action("id: r\nlanguage: python\nrule:\n  pattern: f($$$A)\nfix: g($$$A)\n")


def _record(
    step: int, action: PatternAction | RuleAction | None, digest: str | None, verified: bool
) -> StepRecord:
    reward: Reward = (
        format_error_reward()
        if action is None
        else Reward(format_ok=True, verified=verified, step_similarity=0.5, total=0.5)
    )
    out: dict[str, Any] = {"raw": "x"}
    if action is None:
        out["format_error"] = "bad_json: x"
    else:
        out["action"] = action.model_dump(mode="json")
    return StepRecord(
        task_id="t",
        step=step,
        prompt={},
        state_before={},
        model_output=ModelOutput(**out),
        reward=reward,
        text_digest=digest,
    )


TEXTS = {"d1": "f(2, 1)\n", "d2": "g(2, 1)\n"}


def test_a_verified_episode_is_kept_step_by_step() -> None:
    records = [
        _record(3, RENAME, "d2", verified=True),
        _record(1, SWAP, "d1", verified=False),
        _record(2, None, "d1", verified=False),  # malformed: carries the file on, no step
    ]
    steps = expert_steps(records, TEXTS)
    assert steps == [
        ExpertStep(action=SWAP, text_after="f(2, 1)\n"),
        ExpertStep(action=RENAME, text_after="g(2, 1)\n"),
    ]
    expert = Expert(steps=steps, collection="c", source="teacher", model="local")
    # The model round-trips through a task file line.
    assert Expert.model_validate_json(expert.model_dump_json()) == expert


def test_an_unverified_episode_gives_no_expert() -> None:
    assert expert_steps([_record(1, SWAP, "d1", verified=False)], TEXTS) is None
    assert expert_steps([_record(1, None, None, verified=False)], TEXTS) is None
    assert expert_steps([], TEXTS) is None


def test_a_step_that_left_the_file_as_it_was_is_no_expert_step() -> None:
    records = [
        _record(1, SWAP, None, verified=False),  # matched nothing: no digest yet
        _record(2, SWAP, "d1", verified=False),
        _record(3, RENAME, "d1", verified=False),  # matched nothing: same digest
        _record(4, RENAME, "d2", verified=True),
    ]
    steps = expert_steps(records, TEXTS)
    assert steps is not None and [s.text_after for s in steps] == ["f(2, 1)\n", "g(2, 1)\n"]


# -- scoring a step against the expert's step n ------------------------------------------
PRE = "x = f(1, 2)\n"
MID = "x = f(2, 1)\n"
POST = "x = g(2, 1)\n"


def _task(**kw: Any) -> Any:
    from keel.srl.steps import SrlTask

    return SrlTask(
        task_id="t",
        instruction="swap then rename",
        language="python",
        file="a.py",
        pre=PRE,
        post=POST,
        **kw,
    )


EXPERT = Expert(
    steps=[ExpertStep(action=SWAP, text_after=MID), ExpertStep(action=RENAME, text_after=POST)]
)


def test_a_task_names_the_experts_step_n_and_its_file() -> None:
    task = _task(expert=EXPERT)
    assert task.expert_at(1) == (SWAP, MID)
    assert task.expert_at(2) == (RENAME, POST)
    assert task.expert_at(5) == (RENAME, POST)  # past its end: the last step
    plain = _task(gold_action=None)
    assert plain.expert_at(1) == (None, POST)


def test_an_expert_must_end_at_post_in_the_tasks_language() -> None:
    import pytest
    from pydantic import ValidationError

    wrong_end = Expert(steps=[ExpertStep(action=SWAP, text_after=MID)])
    with pytest.raises(ValidationError, match="last step's file is not the task's post"):
        _task(expert=wrong_end)
    js = PatternAction(pattern="f($A)", rewrite="g($A)", language="javascript")
    with pytest.raises(ValidationError, match="not in the task's language"):
        _task(expert=Expert(steps=[ExpertStep(action=js, text_after=POST)]))


def test_step_n_is_compared_with_the_experts_step_n() -> None:
    from keel.srl.rewards import combine

    # Step 1 does what the expert's step 1 did: equivalent, but the task is not done yet.
    first = combine(
        action=SWAP,
        expert=SWAP,
        pre=PRE,
        result_text=MID,
        gold_post=MID,
        final_post=POST,
        reparses=True,
        language="python",
    )
    assert (first.step_similarity, first.effect, first.verified) == (1.0, "equivalent", False)
    # Step 2 finishes it as the expert did: equivalent and verified.
    second = combine(
        action=RENAME,
        expert=RENAME,
        pre=MID,
        result_text=POST,
        gold_post=POST,
        final_post=POST,
        reparses=True,
        language="python",
    )
    assert (second.step_similarity, second.verified) == (1.0, True)
    assert second.total > first.total
    # A shortcut to the final file in one step is as good as the expert's first step.
    both = PatternAction(pattern="f($A, $B)", rewrite="g($B, $A)", language="python")
    shortcut = combine(
        action=both,
        expert=SWAP,
        pre=PRE,
        result_text=POST,
        gold_post=MID,
        final_post=POST,
        reparses=True,
        language="python",
    )
    assert (shortcut.step_similarity, shortcut.verified) == (1.0, True)
    # Doing nothing at step 1 scores below the expert-equivalent step.
    noop = combine(
        action=PatternAction(pattern="h($A)", rewrite="k($A)", language="python"),
        expert=SWAP,
        pre=PRE,
        result_text=PRE,
        gold_post=MID,
        final_post=POST,
        reparses=True,
        language="python",
    )
    assert noop.effect == "noop" and noop.total < first.total
