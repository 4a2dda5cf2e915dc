"""SRL fixtures: small hand-checked tasks (one file each, a gold action that real ast-grep
turns into exactly ``post``) and their task file in the artifact store."""

from __future__ import annotations

import json
from typing import Any

import pytest

from keel.settings import Settings
from store.artifacts import artifact_store_from_settings


def _task(
    task_id: str, language: str, file: str, pre: str, post: str, pattern: str, rewrite: str
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "instruction": f"rewrite `{pattern}` as `{rewrite}`",
        "language": language,
        "file": file,
        "pre": pre,
        "post": post,
        "gold_action": {"pattern": pattern, "rewrite": rewrite, "language": language},
        "template": "hand",
    }


HAND_TASKS: list[dict[str, Any]] = [
    _task(
        "py-rename",
        "python",
        "calc.py",
        "x = compute(1, 2)\ny = compute(3, 4)\n",
        "x = calculate(1, 2)\ny = calculate(3, 4)\n",
        "compute($A, $B)",
        "calculate($A, $B)",
    ),
    _task(
        "py-swap",
        "python",
        "div.py",
        "d = divide(10, 2)\n",
        "d = divide(2, 10)\n",
        "divide($A, $B)",
        "divide($B, $A)",
    ),
    _task(
        "py-none",
        "python",
        "none.py",
        "if x == None:\n    pass\n",
        "if x is None:\n    pass\n",
        "$X == None",
        "$X is None",
    ),
    _task(
        "js-rename",
        "javascript",
        "app.js",
        "const v = oldName(1);\nconsole.log(oldName(2));\n",
        "const v = newName(1);\nconsole.log(newName(2));\n",
        "oldName($A)",
        "newName($A)",
    ),
    _task(
        "ts-api",
        "typescript",
        "num.ts",
        "let n: number = parseInt(s);\n",
        "let n: number = Number.parseInt(s);\n",
        "parseInt($A)",
        "Number.parseInt($A)",
    ),
    _task(
        "java-min",
        "java",
        "A.java",
        "class A { int f() { return Math.max(1, 2); } }\n",
        "class A { int f() { return Math.min(1, 2); } }\n",
        "Math.max($A, $B)",
        "Math.min($A, $B)",
    ),
]


def tasks_jsonl(tasks: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(t) + "\n" for t in tasks).encode()


@pytest.fixture
def hand_tasks_digest(settings: Settings) -> str:
    """The hand tasks' file in this test's artifact store."""
    return artifact_store_from_settings(settings).put_bytes(tasks_jsonl(HAND_TASKS))
