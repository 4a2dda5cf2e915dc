"""The state an episode's prompt shows: small states pass as they are, a large one is
trimmed to the 800-token budget (the heuristic counter, which overestimates)."""

from __future__ import annotations

from pathlib import Path

from activities.llm import LLMGateway
from activities.srl.episode import STATE_BUDGET, SrlActivities
from keel.settings import Settings
from keel.srl.state import State, heuristic_count_tokens, render
from store.artifacts import LocalArtifactStore
from store.db import get_sessionmaker
from store.files import load_models_config


def acts(tmp_path: Path) -> SrlActivities:
    settings = Settings(data_dir=tmp_path)
    return SrlActivities(
        sessions=get_sessionmaker(f"sqlite:///{tmp_path / 'k.db'}"),
        artifacts=LocalArtifactStore(tmp_path / "a"),
        llm=LLMGateway(load_models_config(settings.models_config)),
        prompts_path=settings.srl_prompts,
    )


async def test_small_state_is_kept_and_a_large_one_trimmed(tmp_path: Path) -> None:
    a = acts(tmp_path)
    small = State(goals=["rename f to g"])
    kept, tokens = await a._fit(small, "teacher")
    assert kept == small and tokens == heuristic_count_tokens(render(small))

    long = "x" * 230
    big = State(
        goals=[f"goal {i} {long}" for i in range(8)],
        decisions=[f"decision {i} {long}" for i in range(8)],
        hypotheses=[f"hypothesis {i} {long}" for i in range(8)],
        history=[f"step {i} {long}" for i in range(3)],
    )
    assert heuristic_count_tokens(render(big)) > STATE_BUDGET
    fitted, tokens = await a._fit(big, "teacher")
    assert tokens <= STATE_BUDGET and tokens == heuristic_count_tokens(render(fitted))
    assert len(fitted.history) <= 1  # history is summarised first
    assert fitted.goals  # goals go last
