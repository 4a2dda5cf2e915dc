"""Every history in ``tests/mrp/histories`` replays against today's workflow code."""

from __future__ import annotations

import pytest

from tests.mrp.histories import HISTORIES, replay

NAMES = sorted(p.stem for p in HISTORIES.glob("*.json"))


def test_histories_are_there() -> None:
    assert "mrp_windows_per_cpu" in NAMES


@pytest.mark.parametrize("name", NAMES)
async def test_mrp_history_replays(name: str) -> None:
    assert await replay(name, (HISTORIES / f"{name}.json").read_text()) is None
