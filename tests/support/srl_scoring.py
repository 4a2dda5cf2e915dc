"""``srl.apply``'s scoring of one answer, for the reward tests that go through the real
parser, the real jail and the real reward (test_reward_degenerate, test_reward_overwrite,
test_task_tests): the activities on a throwaway store, and one step scored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from activities.llm import LLMGateway
from activities.srl.episode import SrlActivities
from keel.settings import Settings
from keel.srl.rewards import Reward
from keel.srl.state import State
from keel.srl.steps import ApplyInput, Generation, SrlTask
from store.artifacts import LocalArtifactStore
from store.db import get_sessionmaker
from store.files import load_models_config


def scoring_activities(tmp: Path) -> SrlActivities:
    """The SRL activities on a SQLite file and an artifact store under ``tmp``."""
    settings = Settings(data_dir=tmp)
    return SrlActivities(
        sessions=get_sessionmaker(f"sqlite:///{tmp / 'k.db'}"),
        artifacts=LocalArtifactStore(tmp / "a"),
        llm=LLMGateway(load_models_config(settings.models_config)),
        prompts_path=Path(settings.srl_prompts),
    )


async def score(
    acts: SrlActivities, task: SrlTask, raw: str, *, collection: str = "reward"
) -> tuple[Reward, dict[str, Any]]:
    """``srl.apply``'s scoring of the answer ``raw`` at step 1 (parse, jail, re-parse,
    reward): the reward, and the sandbox's result with the file after the step
    (``text_after``)."""
    prompt = acts.artifacts.put_json({"messages": [], "step": 1, "state_tokens": 0})
    inp = ApplyInput(
        collection=collection,
        tasks_digest="blake3:" + "0" * 64,
        task_index=0,
        step=1,
        source="teacher",
        state=State(),
        generation=Generation(raw=raw, model="m", state_before=State(), prompt_digest=prompt),
    )
    record, _ = await acts._score(task, inp, task.pre)
    assert record.reward is not None, record.model_output.format_error
    return record.reward, {**(record.sandbox_result or {}), "text_after": record.text_after}
