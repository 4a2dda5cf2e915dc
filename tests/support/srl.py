"""SRL test data shared by the collection tests, the fault tests and the history
recorder: tasks that swap the arguments of ``divide`` and the answer that solves them."""

from __future__ import annotations

import json
from typing import Any

#: A well-formed step that real ast-grep turns each :func:`divide_tasks` task into its post.
SWAP_ANSWER = (
    "<think>swap the arguments</think>"
    '<action>{"pattern": "divide($A, $B)", "rewrite": "divide($B, $A)", "language": "python"}'
    '</action><state_update>{"decisions": ["swap"]}</state_update>'
)


def divide_tasks(n: int) -> list[dict[str, Any]]:
    """``n`` one-file Python tasks ``swap-<i>``: swap the two arguments of ``divide``."""
    return [
        {
            "task_id": f"swap-{i}",
            "instruction": "swap the arguments of divide",
            "language": "python",
            "file": "div.py",
            "pre": f"d = divide({i + 10}, 2)\n",
            "post": f"d = divide(2, {i + 10})\n",
            "gold_action": {
                "pattern": "divide($A, $B)",
                "rewrite": "divide($B, $A)",
                "language": "python",
            },
        }
        for i in range(n)
    ]


def tasks_jsonl(tasks: list[dict[str, Any]]) -> bytes:
    """A task file: one JSON object a line."""
    return "".join(json.dumps(t) + "\n" for t in tasks).encode()


#: A two-step expert (issue 39 §3): swap the arguments of ``f``, then rename it to ``g``.
SWAP_F = {"pattern": "f($A, $B)", "rewrite": "f($B, $A)", "language": "python"}
RENAME_F = {"pattern": "f($$$A)", "rewrite": "g($$$A)", "language": "python"}
SWAP_G = {"pattern": "g($A, $B)", "rewrite": "g($B, $A)", "language": "python"}
TWO_STEP_PRE, TWO_STEP_MID, TWO_STEP_POST = "x = f(1, 2)\n", "x = f(2, 1)\n", "x = g(2, 1)\n"


def two_step_task() -> dict[str, Any]:
    """``swap-rename``: the expert swaps ``f``'s arguments (step 1), then renames ``f`` to
    ``g`` (step 2)."""
    return {
        "task_id": "swap-rename",
        "instruction": "Put the arguments of f in the new order, then call g, which replaces f.",
        "language": "python",
        "file": "a.py",
        "pre": TWO_STEP_PRE,
        "post": TWO_STEP_POST,
        "expert": {
            "steps": [
                {"action": {**SWAP_F, "kind": "pattern"}, "text_after": TWO_STEP_MID},
                {"action": {**RENAME_F, "kind": "pattern"}, "text_after": TWO_STEP_POST},
            ]
        },
    }


def answer_with(action: dict[str, Any], think: str = "one step") -> str:
    """A well-formed tag answer proposing ``action``."""
    return (
        f"<think>{think}</think><action>{json.dumps(action)}</action>"
        '<state_update>{"decisions": ["' + think + '"]}</state_update>'
    )
