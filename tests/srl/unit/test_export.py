"""The trainer's columns of a step (keel.srl.export): TRL's chat, the completion, the
gold replay's think text (the expert's reasoning, else one from the instruction)."""

from __future__ import annotations

from typing import Any

from keel.srl.expert import Expert, ExpertStep, expert_steps
from keel.srl.export import all_tests_passed, derived_think, trainer_columns, with_think
from keel.srl.prompts import gold_answer
from keel.srl.rewards import Reward
from keel.srl.step import PatternAction, parse_step
from keel.srl.steps import SrlTask
from keel.srl.trajectory import ModelOutput, StepRecord

SWAP = PatternAction(pattern="f($A, $B)", rewrite="f($B, $A)", language="python")
CHAT = [{"role": "system", "content": "sys"}, {"role": "user", "content": "do it"}]


def _record(raw: str, think: str = "", step: int = 1, tests: float | None = None) -> dict:
    reward = Reward(
        format_ok=True, verified=True, step_similarity=1.0, text_similarity=1.0, total=2.0,
        tests_passed=tests, paper_reward=1.0,
    )  # fmt: skip
    return StepRecord(
        task_id="t",
        step=step,
        prompt={"messages": CHAT, "step": step, "state_tokens": 9},
        state_before={"goals": ["swap the two arguments of f"]},
        model_output=ModelOutput(raw=raw, think=think, logprobs=[-0.5, -0.1]),
        reward=reward,
        expert_action=SWAP.model_dump(mode="json"),
    ).model_dump(mode="json")


def _task(**kw: Any) -> SrlTask:
    return SrlTask(
        task_id="t",
        instruction="The arguments of f are the wrong way round: swap them.",
        language="python",
        file="a.py",
        pre="x = f(1, 2)\n",
        post="x = f(2, 1)\n",
        **kw,
    )


def test_a_models_row_is_the_chat_sent_then_its_answer() -> None:
    raw = '<think>swap</think><action>{"pattern": "f($A, $B)"}</action><state_update>{}</state_update>'
    cols = trainer_columns(_record(raw, think="swap"), source="teacher")
    answer = [{"role": "assistant", "content": raw}]
    assert cols["prompt"] == CHAT and cols["completion"] == answer
    assert cols["messages"] == CHAT + answer
    assert (cols["think"], cols["think_source"], cols["reward"]) == ("swap", "model", 2.0)
    assert cols["logprobs"] == [-0.5, -0.1] and cols["token_ids"] is None
    assert '"state_tokens": 9' in cols["prompt_json"]


def test_tests_passed_is_null_without_tests_else_whether_all_passed() -> None:
    assert all_tests_passed(None) is None
    assert all_tests_passed(1.0) is True and all_tests_passed(0.5) is False
    cols = trainer_columns(_record("x", tests=0.5), source="teacher")
    assert (cols["tests_passed"], cols["tests_passed_fraction"]) == (False, 0.5)


def test_a_gold_replay_thinks_the_experts_reasoning_where_the_expert_set_has_it() -> None:
    raw = gold_answer(SWAP, "swap")
    expert = Expert(steps=[ExpertStep(action=SWAP, text_after="x = f(2, 1)\n", think="f's order")])
    cols = trainer_columns(_record(raw), source="gold_replay", task=_task(expert=expert))
    assert (cols["think"], cols["think_source"]) == ("f's order", "expert")
    step = parse_step(cols["completion"][0]["content"])
    assert step.think == "f's order" and step.action == SWAP


def test_a_gold_replay_without_reasoning_thinks_from_the_tasks_instruction() -> None:
    raw = gold_answer(SWAP, "swap")
    with_task = trainer_columns(_record(raw), source="gold_replay", task=_task())
    assert with_task["think_source"] == "instruction"
    assert "The arguments of f are the wrong way round" in with_task["think"]
    assert "Expert action for this task." not in with_task["completion"][0]["content"]
    # Without the task file: the goal the record's state starts from.
    alone = trainer_columns(_record(raw), source="gold_replay")
    assert "swap the two arguments of f" in alone["think"]
    # Not a constant: another instruction, another think text.
    assert derived_think("rename g", 1, None) != derived_think("rename h", 1, None)


def test_with_think_replaces_the_first_block_or_puts_one_in_front() -> None:
    assert (
        with_think("<think>a</think><action>x</action>", "b")
        == "<think>b</think><action>x</action>"
    )
    assert with_think("<action>x</action>", "b") == "<think>b</think><action>x</action>"
    assert with_think("<think>a</think>", "c</think>") == "<think>c</ think></think>"


def test_an_expert_step_keeps_the_reasoning_of_the_step_it_came_from() -> None:
    record = StepRecord(
        task_id="t",
        step=1,
        prompt={},
        state_before={},
        model_output=ModelOutput(raw="x", think="  swap f's arguments ", action=SWAP.model_dump()),
        reward=Reward(format_ok=True, verified=True, step_similarity=1.0, total=2.0),
        text_digest="d1",
    )
    steps = expert_steps([record], {"d1": "x = f(2, 1)\n"})
    assert steps is not None and steps[0].think == "swap f's arguments"
