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
    assert expert.step(2) == steps[1] and expert.step(3) is None and expert.step(0) is None
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
