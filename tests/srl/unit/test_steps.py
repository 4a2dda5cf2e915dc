"""keel.srl.steps and keel.srl.prompts: task files, collection inputs, the prompt pack."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from keel.srl.batch import EPISODES
from keel.srl.prompts import PromptPackInvalid, gold_answer, parse_prompt_pack, render_messages
from keel.srl.step import parse_step
from keel.srl.steps import (
    APPLY,
    ERROR_SRL_TASKS,
    GENERATE,
    MAX_PER_RUN,
    WINDOW,
    CollectionInput,
    SrlTask,
    TasksInvalid,
    parse_tasks,
)
from tests.srl.conftest import EXAMPLE_TASKS, HAND_TASKS, tasks_jsonl
from workflows.common import OPTIONS, SRL_EPISODES_STEP_TIMEOUT

PACK = Path(__file__).resolve().parents[3] / "configs" / "teacher_prompts.yaml"


def test_task_files() -> None:
    tasks = parse_tasks(EXAMPLE_TASKS.read_bytes())
    assert [t.task_id for t in tasks] == [t["task_id"] for t in HAND_TASKS]
    assert tasks[0].file_name == "calc.py"
    # Extra fields (a SynthTask line's provenance) are ignored; blank lines skipped.
    extra = json.dumps({**HAND_TASKS[0], "license": "PSF-2.0", "sha256": "0" * 64})
    assert parse_tasks(f"\n{extra}\n\n".encode())[0].task_id == "py-rename"
    with pytest.raises(TasksInvalid, match="line 2: task id 'py-rename' repeats"):
        parse_tasks(tasks_jsonl([HAND_TASKS[0], HAND_TASKS[0]]))
    with pytest.raises(TasksInvalid, match="line 1: language: "):
        parse_tasks(tasks_jsonl([{**HAND_TASKS[0], "language": "cobol"}]))
    with pytest.raises(TasksInvalid, match="line 1: task_id: Value error"):
        parse_tasks(tasks_jsonl([{**HAND_TASKS[0], "task_id": "a/b"}]))
    with pytest.raises(TasksInvalid, match="not UTF-8"):
        parse_tasks(b"\xff\xfe")


def test_collection_input_needs_exactly_one_task_source() -> None:
    digest = "blake3:" + "0" * 64
    assert CollectionInput(collection="c", tasks_file="/t.jsonl").tasks_digest is None
    for bad in ({}, {"tasks_digest": digest, "tasks_file": "/t.jsonl"}):
        with pytest.raises(ValidationError, match="exactly one of tasks_digest and tasks_file"):
            CollectionInput(collection="c", **bad)
    with pytest.raises(ValidationError, match="collection"):
        CollectionInput(collection="a b", tasks_digest=digest)


def test_collection_input_takes_batch_within_its_bounds() -> None:
    """``batch`` is a collection option (CLI, API, ``temporal workflow start``): 0 by
    default and for an input from before it, 0..MAX_PER_RUN."""
    digest = "blake3:" + "0" * 64
    assert CollectionInput(collection="c", tasks_digest=digest).batch == 0
    old = CollectionInput.model_validate_json(
        json.dumps({"collection": "c", "tasks_digest": digest, "window": 2})
    )
    assert old.batch == 0
    assert CollectionInput(collection="c", tasks_digest=digest, batch=MAX_PER_RUN).batch == 1000
    for bad, says in ((-1, "greater than or equal to 0"), (MAX_PER_RUN + 1, "less than or")):
        with pytest.raises(ValidationError, match=says) as err:
            CollectionInput(collection="c", tasks_digest=digest, batch=bad)
        assert err.value.errors()[0]["loc"] == ("batch",)


def test_every_srl_activity_has_limits_and_episodes_heartbeats() -> None:
    """``call`` takes an activity's limits from OPTIONS: every SRL activity has a row, and
    ``srl.episodes`` (a batch, scheduled with ``max_steps`` times its row's limit) is
    found lost by its heartbeat and not retried for a task file that does not validate."""
    for ref in (WINDOW, GENERATE, APPLY, EPISODES):
        assert ref.name in OPTIONS, ref.name
    row = OPTIONS[EPISODES.name]
    assert row.heartbeat == OPTIONS[APPLY.name].heartbeat is not None
    assert row.start_to_close == SRL_EPISODES_STEP_TIMEOUT
    assert row.retry.non_retryable_error_types == [ERROR_SRL_TASKS]


def test_prompt_pack_renders_and_refuses_unknown_placeholders() -> None:
    pack = parse_prompt_pack(PACK.read_text())
    system, user = render_messages(
        pack, instruction="swap", language="python", file="a.py", code="x = f(1, 2)", state="S"
    )
    assert system["role"] == "system" and '{"pattern": "...",' in system["content"]
    assert "Task: swap" in user["content"] and "x = f(1, 2)" in user["content"]
    with pytest.raises(PromptPackInvalid, match=r"unknown placeholders \['secret'\]"):
        parse_prompt_pack("system: s\nuser: '{code} {secret}'\n")
    with pytest.raises(PromptPackInvalid, match=r"add \{code\}"):
        parse_prompt_pack("system: s\nuser: '{instruction}'\n")
    with pytest.raises(PromptPackInvalid, match="not YAML"):
        parse_prompt_pack("system: [")
    long = render_messages(
        pack, instruction="i", language="python", file="f", code="x" * 30_000, state=""
    )
    assert "# [1 line below cut to fit the model's context]" in long[1]["content"]
    js = render_messages(
        pack, instruction="i", language="javascript", file="f", code="x;\n" * 9_000, state=""
    )
    assert "// [1000 lines below cut to fit the model's context]" in js[1]["content"]


def test_gold_answer_parses_back_to_the_gold_action() -> None:
    task = parse_tasks(EXAMPLE_TASKS.read_bytes())[3]
    assert task.gold_action is not None
    step = parse_step(gold_answer(task.gold_action, task.instruction))
    assert step.action == task.gold_action


def test_a_task_must_ask_for_a_change_in_its_own_language() -> None:
    task = HAND_TASKS[0]
    assert SrlTask.model_validate(task).pre != task["post"]
    with pytest.raises(ValidationError, match="post equals pre: a task must ask for a change"):
        SrlTask.model_validate({**task, "post": task["pre"]})
    with pytest.raises(ValidationError, match=r"gold_action\.language 'java' is not the task's"):
        SrlTask.model_validate({**task, "gold_action": {**task["gold_action"], "language": "java"}})
    with pytest.raises(TasksInvalid, match=r"line 1: .*post equals pre"):
        parse_tasks(tasks_jsonl([{**task, "post": task["pre"]}]))
