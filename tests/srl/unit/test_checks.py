"""A task's tests (keel.srl.checks): validated when a task is made; the checks generated
for the synthetic Python templates hold on the task's pre- and post-text and fail on a
file the refactoring broke. Evaluated here in-process (they are static checks of the
text); tests/srl/integration/test_task_tests.py runs them in the jail."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import pytest
from pydantic import ValidationError

from keel.srl.checks import MAX_TESTS, TaskTest
from keel.srl.steps import SrlTask
from keel.srl.synth import TEMPLATES, SourceFile, SynthTask, synthesise

STDLIB = [
    "json",
    "textwrap",
    "shlex",
    "csv",
    "fnmatch",
    "glob",
    "string",
    "contextlib",
    "argparse",
    "logging",
    "tempfile",
    "shutil",
]
#: Every Python template applies to this file (replace_api, none_comparison and
#: dict_get_default are rare in the standard library).
ALL_TEMPLATES = """import logging
import time


def lookup(table, key):
    value = table.get(key, None)
    if value == None:
        logging.warn("missing %s", key)
    return value


def pair(a, b):
    return (a, b)


def main(config, log):
    started = time.time()
    log.info("start")
    first = pair(lookup(config, "a"), 2)
    second = pair(3, lookup(config, "b"))
    return first, second, started
"""


def passes(task: SynthTask, text: str) -> list[bool]:
    out = []
    for test in task.tests:
        scope: dict[str, Any] = {"SOURCE": text, "FILE": task.file}
        try:
            exec(compile(test.source, test.name, "exec"), scope)
        except Exception:
            out.append(False)
        else:
            out.append(True)
    return out


def src(text: str, path: str) -> SourceFile:
    return SourceFile(path=path, text=text, license="PSF-2.0", language="python")


@pytest.mark.full_tier
def test_every_python_template_gets_checks_that_hold_on_pre_and_post() -> None:
    sources = [src(inspect.getsource(importlib.import_module(m)), f"{m}.py") for m in STDLIB]
    sources.append(src(ALL_TEMPLATES, "all.py"))
    report = synthesise(sources, seeds=[0, 1])
    with_tests = [t for t in report.tasks if t.tests]
    assert len(with_tests) >= 50
    assert {t.template for t in with_tests} == set(TEMPLATES["python"])
    for task in report.tasks:
        assert passes(task, task.pre) == [True] * len(task.tests), task.task_id
        assert passes(task, task.post) == [True] * len(task.tests), task.task_id
        if task.tests:
            assert task.tests[0].name == "compiles" and len(task.tests) >= 2
            # The task file's line keeps them.
            assert SrlTask.model_validate_json(task.model_dump_json()).tests == task.tests


def template_task(template: str, seed: int = 0) -> SynthTask:
    return TEMPLATES["python"][template](src(ALL_TEMPLATES, "all.py"), seed)


@pytest.mark.parametrize(
    ("template", "broken"),
    [
        # rename: only the definition renamed; only the calls renamed; a call deleted.
        ("rename", lambda t: t.pre.replace("def pair(", "def pair_renamed(")),
        ("rename", lambda t: t.post.replace("def pair_renamed(", "def pair(")),
        ("swap_arguments", lambda t: t.post.replace("second = pair(", "second = (")),
        ("wrap_call", lambda t: t.post.replace("second = traced(pair(3, ", "second = (")),
        ("none_comparison", lambda t: t.pre.replace("== None", "is not None")),
        ("dict_get_default", lambda t: t.pre.replace("table.get(key, None)", "table[key]")),
        ("replace_api", lambda t: t.pre.replace("time.time()", "0")),
        ("add_guard", lambda t: t.pre.replace('logging.warn("missing %s", key)', "pass")),
    ],
)
def test_checks_fail_on_a_broken_file(template: str, broken: Any) -> None:
    # The templates that pick a function: the seed that picks `pair`.
    seeds = (s for s in range(50) if "`pair`" in template_task(template, s).instruction)
    task = template_task(template, next(seeds, 0))
    assert task.tests
    text = broken(task)
    assert text not in (task.pre, task.post)
    assert passes(task, text).count(False) >= 1


def test_a_template_without_a_meaningful_check_gets_none() -> None:
    js = SourceFile(
        path="m.js",
        text="function compute(a) { return a; }\ncompute(1);\n",
        license="MIT",
        language="javascript",
    )
    task = TEMPLATES["javascript"]["rename"](js, 0)
    assert task.tests == []


def test_tests_are_validated_when_a_task_is_made() -> None:
    base = template_task("rename").model_dump()
    with pytest.raises(ValidationError, match="does not compile"):
        SrlTask.model_validate({**base, "tests": [{"name": "t", "source": "assert (\n"}]})
    with pytest.raises(ValidationError, match="repeat"):
        SrlTask.model_validate({**base, "tests": [{"name": "t", "source": "pass"}] * 2})
    with pytest.raises(ValidationError, match="at most"):
        SrlTask.model_validate(
            {**base, "tests": [{"name": f"t{i}", "source": "pass"} for i in range(MAX_TESTS + 1)]}
        )
    with pytest.raises(ValidationError, match="test name"):
        SrlTask.model_validate({**base, "tests": [{"name": "a b", "source": "pass"}]})
    with pytest.raises(ValidationError):
        TaskTest.model_validate({"name": "t", "source": "pass", "language": "javascript"})
    task = SrlTask.model_validate({**base, "tests": [{"name": "t", "source": "assert SOURCE"}]})
    assert task.tests[0].language == "python"
    # A task file written before tests: no tests.
    assert SrlTask.model_validate({k: v for k, v in base.items() if k != "tests"}).tests == []
