"""Design fixtures: the repository renderer and validators, or test stand-ins for them
while those modules are not in this tree (they land from a parallel branch)."""

from __future__ import annotations

import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from keel.design.critics import CostEstimate
from keel.design.planner import Plan

# Every call of the stand-in renderer, so a test can count codegen runs.
RENDER_CALLS: list[str] = []


def _standin_render_repo(
    plan: Plan,
    constraints: Any,
    *,
    project: str,
    decision_set: str,
    rationale_md: str,
    cost: CostEstimate,
    policy: Any,
) -> dict[str, str]:
    RENDER_CALLS.append(f"{project}/{decision_set}")
    files = {
        "README.md": f"# {project} {decision_set}\n\n{rationale_md}\n",
        "reports/cost.json": cost.model_dump_json(),
    }
    for choice in plan.choices:
        files[f"infra/{choice.capability.value}/main.tf"] = f"# {choice.pattern_id}\n"
    return files


class _StandinReport:
    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def model_dump(self, mode: str = "python") -> dict[str, Any]:
        return {
            "validators": [
                {"name": "files", "status": "passed", "summary": f"{len(self.files)} files"},
                {"name": "checkov", "status": "not_run", "summary": "stand-in"},
            ]
        }


async def _standin_validate_repo(files: dict[str, str], *, sandbox_config: Any = None) -> Any:
    return _StandinReport(files)


@pytest.fixture
def codegen_modules() -> Iterator[str]:
    """``real`` when activities/design/codegen.py and validators.py exist, else installs
    stand-ins for this test (and removes them after)."""
    RENDER_CALLS.clear()
    have = all(
        importlib.util.find_spec(f"activities.design.{m}") is not None
        for m in ("codegen", "validators")
    )
    if have:
        yield "real"
        return
    codegen = types.ModuleType("activities.design.codegen")
    codegen.render_repo = _standin_render_repo  # type: ignore[attr-defined]
    validators = types.ModuleType("activities.design.validators")
    validators.validate_repo = _standin_validate_repo  # type: ignore[attr-defined]
    sys.modules["activities.design.codegen"] = codegen
    sys.modules["activities.design.validators"] = validators
    try:
        yield "stand-in"
    finally:
        sys.modules.pop("activities.design.codegen", None)
        sys.modules.pop("activities.design.validators", None)
