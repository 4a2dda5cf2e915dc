"""A task may lack a gold action (one made from a dataset record, ``srl tasks``); a
gold_replay step of such a task fails at once, not retried, naming the task."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from activities.llm import LLMGateway
from activities.srl.episode import SrlActivities
from keel.settings import Settings
from keel.srl.state import State
from keel.srl.steps import ERROR_SRL_TASKS, GenerateInput, SrlTask, TasksInvalid, parse_tasks
from store.artifacts import LocalArtifactStore
from store.db import get_sessionmaker
from store.files import load_models_config

LINE = {
    "task_id": "commitpackft-0123456789abcdef",
    "instruction": "Use math.pi",
    "language": "python",
    "file": "geo.py",
    "pre": "def area(r):\n    return 3.14 * r * r\n",
    "post": "import math\n\n\ndef area(r):\n    return math.pi * r * r\n",
}


def test_a_task_may_lack_a_gold_action_but_must_be_an_edit() -> None:
    task = SrlTask.model_validate(LINE)
    assert task.gold_action is None
    assert SrlTask.model_validate({**LINE, "gold_action": None}) == task
    with pytest.raises(ValidationError, match="post equals pre"):
        SrlTask.model_validate({**LINE, "post": LINE["pre"]})
    with pytest.raises(TasksInvalid, match=r"line 2: .*post equals pre"):
        parse_tasks(
            (
                task.model_dump_json()
                + "\n"
                + SrlTask.model_construct(
                    **{**LINE, "task_id": "b", "post": LINE["pre"]}
                ).model_dump_json()
            ).encode()
        )


async def test_gold_replay_of_a_task_without_a_gold_action_fails_naming_it(
    tmp_path: Path,
) -> None:
    settings = Settings(data_dir=tmp_path)
    artifacts = LocalArtifactStore(tmp_path / "a")
    acts = SrlActivities(
        sessions=get_sessionmaker(f"sqlite:///{tmp_path / 'k.db'}"),
        artifacts=artifacts,
        llm=LLMGateway(load_models_config(settings.models_config)),
        prompts_path=settings.srl_prompts,
    )
    task = SrlTask.model_validate(LINE)
    digest = artifacts.put_bytes(task.model_dump_json().encode() + b"\n")
    inp = GenerateInput(
        collection="c1",
        tasks_digest=digest,
        task_index=0,
        step=1,
        source="gold_replay",
        state=State(),
    )
    with pytest.raises(ApplicationError) as err:
        await acts._generate(inp)
    assert err.value.non_retryable and err.value.type == ERROR_SRL_TASKS
    assert task.task_id in str(err.value) and "no gold action" in str(err.value)
