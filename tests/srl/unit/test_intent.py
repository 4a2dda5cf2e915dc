"""keel.srl.intent: task instructions state intent and never give the gold action away;
the example tasks and 300 synthetic tasks leak nothing, and a task that leaks is refused
where tasks are loaded (parse_tasks) and made (synth)."""

from __future__ import annotations

import importlib
import inspect
import itertools
import json
from typing import Any

import pytest
from pydantic import ValidationError

from keel.srl import synth, synth_clike
from keel.srl.errors import InstructionLeak
from keel.srl.intent import instruction_leaks
from keel.srl.step import parse_rule_action
from keel.srl.steps import SrlTask, TasksInvalid, parse_tasks
from keel.srl.synth import SourceFile, SynthTask, synthesise
from tests.srl.conftest import EXAMPLE_TASKS, HAND_TASKS, tasks_jsonl

RENAME = {"pattern": "compute($A, $B)", "rewrite": "calculate($A, $B)", "language": "python"}
PRE = "x = compute(1, 2)\ny = compute(3, 4)\n"


def leaks(instruction: str, action: Any = RENAME, pre: str = PRE) -> list[str]:
    return instruction_leaks(instruction, [action], pre)


def test_an_intent_leaks_nothing() -> None:
    for intent in (
        "Rename the function `compute` to `calculate` at every call site; the old name is "
        "deprecated.",
        "Call `calculate` instead of `compute(1, 2)` and `compute(3, 4)`.",
        "Use `Number.parseInt` instead of the global `parseInt`.",
        "Make it cost $5, not $10.",  # a dollar sign is not a metavariable
    ):
        assert leaks(intent) == [], intent


@pytest.mark.parametrize(
    ("instruction", "fragment"),
    [
        ("rewrite `compute($A, $B)` as `calculate($A, $B)`", "$A, $B"),
        ("rewrite compute( $A ,  $B ) as something", "metavariable"),
        ("wrap it: `$$$ARGS`", "$$$ARGS"),
        ("ignore the rest: `f($_)`", "$_"),
        ("apply\nrule:\n  pattern: compute(1, 2)\nfix: calculate(1, 2)", "rule text"),
        ('use {"pattern": "x", "rewrite": "y"}', "rule text"),
    ],
)
def test_metavariables_and_rule_text_leak(instruction: str, fragment: str) -> None:
    found = leaks(instruction)
    assert found and any(fragment in f for f in found), found


def test_the_gold_pattern_or_rewrite_template_leaks_unless_it_is_plain_code() -> None:
    literal = {"pattern": "log.close()", "rewrite": "if log is not None:\n    log.close()"}
    pre = "log.close()\n"
    # Quoting the code to change is fine; spelling the new code out is the answer.
    assert leaks("Only run `log.close()` when `log` is not None.", literal, pre) == []
    found = leaks("Turn it into `if log is not None:   log.close()`.", literal, pre)
    assert found == [f"it has the gold action's rewrite template {literal['rewrite']!r}"]
    # A new name alone is fine.
    rename = {"pattern": "old", "rewrite": "new_name"}
    assert leaks("Rename `old` to `new_name` everywhere.", rename, "old()\n") == []
    # A rule's pattern and fix count as well.
    rule = parse_rule_action(
        "id: r\nlanguage: python\nrule:\n  any:\n    - pattern: compute($X, 1)\nfix: calc($X)\n"
    )
    assert any("pattern" in f for f in leaks("do `compute($X, 1)`", rule))


def test_a_leaking_task_is_refused_when_loaded() -> None:
    leaky = {**HAND_TASKS[0], "instruction": "rewrite `compute($A, $B)` as `calculate($A, $B)`"}
    with pytest.raises(ValidationError, match="instruction gives the expert action away"):
        SrlTask.model_validate(leaky)
    with pytest.raises(TasksInvalid, match=r"line 2: .*gives the expert action away.*\$A"):
        parse_tasks(tasks_jsonl([HAND_TASKS[1], leaky]))
    # Without an expert action there is nothing to give away: a commit message may say $HOME.
    record = {**leaky, "gold_action": None, "instruction": "Read $HOME, not ~"}
    assert SrlTask.model_validate(record).gold_action is None


def test_the_examples_leak_nothing() -> None:
    tasks = parse_tasks(EXAMPLE_TASKS.read_bytes())  # refuses a leak
    assert len(tasks) == 6
    counted = sum(
        len(instruction_leaks(t.instruction, [t.gold_action] if t.gold_action else [], t.pre))
        for t in tasks
    )
    assert counted == 0
    for line in EXAMPLE_TASKS.read_text().splitlines():
        task = json.loads(line)
        assert "$" not in task["instruction"]
        assert task["gold_action"]["rewrite"] not in task["instruction"]


# -- 300 synthetic tasks ------------------------------------------------------------------
STDLIB = [
    "json", "textwrap", "shlex", "csv", "fnmatch", "glob", "string", "contextlib", "argparse",
    "calendar", "configparser", "difflib", "gettext", "optparse", "pprint", "tarfile",
]  # fmt: skip
#: A file every Python template applies to (``== None`` and ``.get(k, None)`` are rare in
#: the standard library).
PY = """import os
import time


def load(path, default=None):
    start = time.time()
    if path == None:
        return default
    data = cache.get(path, None)
    log.flush()
    return pair(data, start), os.path.join(path, "x")


def main():
    value = load("a")
    return pair(value, 1)
"""


def c_like(language: str, n: int) -> SourceFile:
    """A small file with a few functions (methods in Java) calling each other."""
    names = [f"step{n}x{i}" for i in range(4)]
    if language == "java":
        body = "".join(
            f"  private int {a}(int v) {{ return {b}(v) + 1; }}\n"
            for a, b in itertools.pairwise(names)
        )
        text = f"class C{n} {{\n{body}  private int {names[-1]}(int v) {{ return v; }}\n}}\n"
        path = f"C{n}.java"
    else:
        typed = ": number" if language == "typescript" else ""
        body = "".join(
            f"function {a}(v{typed}) {{ return {b}(v) + 1; }}\n"
            for a, b in itertools.pairwise(names)
        )
        text = (
            f"{body}function {names[-1]}(v{typed}) {{ return v; }}\nconsole.log({names[0]}(1));\n"
        )
        path = f"m{n}.{'ts' if language == 'typescript' else 'js'}"
    return SourceFile(path=path, text=text, license="MIT", language=language, package="t")  # type: ignore[arg-type]


def synthetic_tasks(count: int) -> list[SynthTask]:
    python = [
        SourceFile(
            path=f"{m.replace('.', '_')}.py",
            text=inspect.getsource(importlib.import_module(m)),
            license="PSF-2.0",
            language="python",
            package="stdlib",
        )
        for m in STDLIB
    ]
    python.append(SourceFile(path="m.py", text=PY, license="MIT", language="python"))
    others = [c_like(lang, n) for n in range(12) for lang in ("javascript", "typescript", "java")]
    tasks = synthesise([*python, *others], seeds=range(4)).tasks
    assert len(tasks) >= count, len(tasks)
    return tasks


@pytest.mark.full_tier
def test_300_synthetic_tasks_leak_nothing() -> None:
    tasks = synthetic_tasks(300)  # synth raises InstructionLeak on a leak
    assert {t.language for t in tasks} == {"python", "javascript", "typescript", "java"}
    assert len({t.template for t in tasks}) == len(synth.TEMPLATES["python"])
    found = [
        (t.task_id, leak)
        for t in tasks
        for leak in instruction_leaks(t.instruction, [t.gold_action], t.pre)
    ]
    assert found == [], found[:5]
    # And each loads as a collection task.
    assert len(parse_tasks(tasks_jsonl([t.model_dump(mode="json") for t in tasks]))) == len(tasks)


def test_synth_refuses_to_make_a_leaking_task(monkeypatch: pytest.MonkeyPatch) -> None:
    source = c_like("javascript", 0)
    original = synth_clike._task

    def leaky(source: SourceFile, template: str, seed: int, instruction: str, *rest: Any) -> Any:
        return original(source, template, seed, "rewrite `$X` as `$Y`", *rest)

    monkeypatch.setattr(synth_clike, "_task", leaky)
    with pytest.raises(InstructionLeak, match=r"javascript-rename-.*metavariable"):
        synth_clike.c_like_rename(source, 0)
