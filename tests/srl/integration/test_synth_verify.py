"""``verified_synth_tasks`` with the real jail and real ast-grep: at least 300 verified
tasks over Python (standard library) and JavaScript (files inside installed PyPI
packages), each gold action checked again here with bare ast-grep."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from activities.srl.data import PARSE_EXTENSIONS
from activities.srl.synth import PERMISSIVE, verified_synth_tasks, verify_tasks
from keel.srl.step import PatternAction
from keel.srl.synth import SourceFile, SynthTask, synthesise

pytestmark = pytest.mark.timeout(600)

AST_GREP = str(Path(sys.executable).parent / "ast-grep")


def bare_astgrep(task: SynthTask, workdir: Path) -> str:
    """The task's gold action run by ast-grep outside the jail: an independent check."""
    path = workdir / f"{task.task_id}{PARSE_EXTENSIONS[task.language]}"
    path.write_text(task.pre, encoding="utf-8")
    action = task.gold_action
    proc = subprocess.run(
        [
            AST_GREP,
            "run",
            "--pattern",
            action.pattern,
            "--rewrite",
            action.rewrite,
            "--lang",
            action.language,
            "--update-all",
            str(path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    return path.read_text(encoding="utf-8")


def test_at_least_300_verified_tasks_across_python_and_javascript(tmp_path: Path) -> None:
    outcome = asyncio.run(
        verified_synth_tasks(
            languages=["python", "javascript", "typescript"], limit=300, seeds=range(8)
        )
    )
    tasks = outcome.tasks
    assert len(tasks) >= 300
    assert outcome.verified_by_language["python"] >= 1
    assert outcome.verified_by_language["javascript"] >= 1
    assert sum(outcome.verified_by_language.values()) == len(tasks)
    assert len({t.task_id for t in tasks}) == len(tasks)
    # Provenance of every task: a licensed file of a named package, its sha256.
    for task in tasks:
        assert task.license in PERMISSIVE and task.package and task.file
        assert len(task.source_sha256) == 64
    assert {t.license for t in tasks if t.language == "python"} == {"PSF-2.0"}
    # Every kept gold action reproduces its post-text with bare ast-grep too, and the
    # Python ones parse.
    for task in tasks:
        assert bare_astgrep(task, tmp_path) == task.post, task.task_id
        if task.language == "python":
            ast.parse(task.post)
    # The account: templates that refused files are counted per reason; the time is
    # measured per jail run.
    assert outcome.candidates >= len(tasks)
    assert all(n > 0 for reasons in outcome.refused.values() for n in reasons.values())
    assert outcome.jail_runs >= len(tasks) and outcome.seconds > 0


def _task(template: str, pre: str, post: str, pattern: str, rewrite: str) -> SynthTask:
    return SynthTask(
        task_id=f"python-{template}-test",
        template=template,
        instruction="test",
        language="python",
        file="t.py",
        package="test",
        license="MIT",
        source_sha256="0" * 64,
        seed=0,
        pre=pre,
        post=post,
        gold_action=PatternAction(pattern=pattern, rewrite=rewrite, language="python"),
        tags=[],
    )


def test_the_jail_refuses_wrong_predictions_and_unparseable_results() -> None:
    pre = "x = foo(1)\ny = foo(2)\n"
    good = _task("good", pre, "x = bar(1)\ny = bar(2)\n", "foo($A)", "bar($A)")
    # The prediction misses the second call: ast-grep rewrites both.
    wrong = _task("wrong", pre, "x = bar(1)\ny = foo(2)\n", "foo($A)", "bar($A)")
    # Predicted right, but the result does not parse.
    broken = _task("broken", pre, "x = foo(1\ny = foo(2\n", "foo($A)", "foo($A")
    nothing = _task("nothing", pre, "x = 1\n", "nomatch($A)", "$A")
    kept, refused, runs = asyncio.run(verify_tasks([good, wrong, broken, nothing]))
    assert [t.template for t in kept] == ["good"]
    assert refused == {
        "wrong": {"post_mismatch": 1},
        "broken": {"reparse_failed": 1},
        "nothing": {"no_match": 1},
    }
    assert runs >= 4


def test_explicit_sources_and_the_refusal_account() -> None:
    text = (
        "def helper(a, b):\n    return a + b\n\n\n"
        "def main():\n    if helper(1, 2) == None:\n        return helper(3, 4)\n"
    )
    src = SourceFile(path="pkg/m.py", text=text, license="MIT", language="python", package="p")
    outcome = asyncio.run(verified_synth_tasks(languages=["python"], limit=50, sources=[src]))
    expected = synthesise([src], [0])
    assert 0 < len(outcome.tasks) <= len(expected.tasks)
    assert {t.task_id for t in outcome.tasks} <= {t.task_id for t in expected.tasks}
    assert outcome.notes and "python" in outcome.notes[0]
    not_applicable = {
        k: v["not_applicable"] for k, v in outcome.refused.items() if "not_applicable" in v
    }
    assert not_applicable == expected.refused
