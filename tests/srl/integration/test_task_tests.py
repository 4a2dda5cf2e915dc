"""A task's tests in the real jail, as ``srl.apply`` scores a step (parse, ast-grep in the
jail, re-parse, the task's tests in the jail, reward): a synthetic Python rename task's
generated checks pass on the gold action's file (``tests_passed`` 1.0, the reward adds
0.5), fail on actions that break the code (only the calls renamed, a call deleted), and
a task without tests has ``tests_passed`` ``None`` (and the reward no test term)."""

from __future__ import annotations

import json

import pytest

from activities.srl.checks import run_task_tests
from activities.srl.episode import SrlActivities
from keel.srl.checks import TaskTest
from keel.srl.export import all_tests_passed
from keel.srl.prompts import gold_answer
from keel.srl.rewards import REWARD_VERSION
from keel.srl.steps import SrlTask
from keel.srl.synth import TEMPLATES, SourceFile
from tests.srl.conftest import HAND_TASKS
from tests.support.srl_scoring import score, scoring_activities

pytestmark = pytest.mark.timeout(300)

SOURCE = """def scale(x, k):
    return x * k


def total(items):
    return sum(scale(i, 2) for i in items)


print(scale(3, 4))
"""


def rename_task() -> SrlTask:
    source = SourceFile(path="calc.py", text=SOURCE, license="MIT", language="python")
    for seed in range(50):
        synth = TEMPLATES["python"]["rename"](source, seed)
        if "`scale`" in synth.instruction:
            return SrlTask.model_validate_json(synth.model_dump_json())
    raise AssertionError("no seed renames scale")


def answer(action: dict[str, str]) -> str:
    return (
        f"<think>Do it.</think>\n<action>\n{json.dumps(action)}\n</action>\n"
        '<state_update>{"decisions": ["edit"]}</state_update>'
    )


@pytest.fixture(scope="module")
def acts(tmp_path_factory: pytest.TempPathFactory) -> SrlActivities:
    return scoring_activities(tmp_path_factory.mktemp("task-tests"))


async def test_gold_action_passes_the_tasks_tests(acts: SrlActivities) -> None:
    task = rename_task()
    assert [t.name for t in task.tests] == ["compiles", "names_kept", "calls_kept"]
    assert task.gold_action is not None
    reward, sandbox = await score(acts, task, gold_answer(task.gold_action, task.instruction))
    assert sandbox["text_after"] == task.post and reward.verified
    assert reward.tests_passed == 1.0 and all_tests_passed(reward.tests_passed) is True
    assert [t["passed"] for t in sandbox["tests"]] == [True, True, True]
    assert sandbox["tests_error"] is None
    # similarity 1 + verified 1 + 0.5·tests_passed 1.0
    assert reward.total == 2.5 and reward.reward_version == REWARD_VERSION


@pytest.mark.parametrize(
    ("action", "passed"),
    [
        # Only the calls renamed: the definition keeps the old name (NameError at run).
        ({"pattern": "scale($$$A)", "rewrite": "scale_renamed($$$A)"}, [True, False, True]),
        # The module-level call deleted.
        ({"pattern": "print($$$A)", "rewrite": "pass"}, [True, False, False]),
    ],
)
async def test_a_destructive_action_fails_them(
    acts: SrlActivities, action: dict[str, str], passed: list[bool]
) -> None:
    task = rename_task()
    reward, sandbox = await score(acts, task, answer({**action, "language": "python"}))
    assert sandbox["ok"] and sandbox["text_after"] not in (task.pre, task.post)
    assert [t["passed"] for t in sandbox["tests"]] == passed
    assert reward.tests_passed == pytest.approx(sum(passed) / 3)
    assert all_tests_passed(reward.tests_passed) is False
    assert not reward.verified


async def test_a_task_without_tests_has_none(acts: SrlActivities) -> None:
    task = SrlTask.model_validate(next(t for t in HAND_TASKS if t["language"] == "python"))
    assert task.tests == [] and task.gold_action is not None
    reward, sandbox = await score(acts, task, gold_answer(task.gold_action, task.instruction))
    assert reward.verified and reward.tests_passed is None
    assert all_tests_passed(reward.tests_passed) is None
    assert "tests" not in sandbox
    assert reward.total == 2.0  # similarity 1 + verified 1, no test term


async def test_a_test_that_hangs_or_exits_fails_in_the_jail() -> None:
    tests = [
        TaskTest(name="ok", source="assert 'scale' in SOURCE and FILE == 'calc.py'"),
        TaskTest(name="exits", source="raise SystemExit(0)"),
        TaskTest(name="raises", source="assert False, 'no'"),
    ]
    fraction, report = await run_task_tests(tests, SOURCE, "calc.py")
    assert fraction == pytest.approx(1 / 3)
    assert [t["passed"] for t in report["tests"]] == [True, False, False]
    assert report["tests"][2]["error"] == "AssertionError: no"
    hang = [*tests[:1], TaskTest(name="hangs", source="while True:\n    pass\n")]
    fraction, report = await run_task_tests(hang, SOURCE, "calc.py")
    assert fraction == 0.0 and report["tests_error"]


async def test_generated_checks_hold_on_pre_and_post_in_the_jail() -> None:
    # One task per Python template (the jail's interpreter, not the host's evaluation).
    from tests.srl.unit.test_checks import ALL_TEMPLATES

    source = SourceFile(path="all.py", text=ALL_TEMPLATES, license="MIT", language="python")
    seen = 0
    for template in TEMPLATES["python"].values():
        task = template(source, 0)
        assert task.tests, task.template
        for text in (task.pre, task.post):
            fraction, report = await run_task_tests(task.tests, text, task.file)
            assert fraction == 1.0, (task.template, report)
        seen += 1
    assert seen == len(TEMPLATES["python"]) == 7
