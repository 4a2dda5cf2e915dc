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
