"""Overwrite attacks on the step reward, end to end, one task per language of
examples/srl/tasks.jsonl (Python, JavaScript, TypeScript, Java): an action that rewrites the
whole file with the expert's result instead of changing the code the task is about.

Each answer goes through the real parser (``parse_step``), real ast-grep in the real jail
(the rewrite, the re-parse and the regions it replaced: ``SrlActivities._sandbox``) and the
real reward (``SrlActivities._score``), as ``srl.apply`` runs them. The attacks:

* a rule on the root node (``kind: module`` / ``kind: program``) whose ``fix`` is the new
  file's text;
* a pattern that is one metavariable (``$A``, which matches the root) rewritten to it;
* a pattern spelling the whole old file rewritten to the new one (one-statement files).

Each reaches the expert's file byte for byte, yet has the effect ``overwrite``, is not
verified and scores below the gold action in Keel's reward (``total``,
``step_similarity``) and in the paper's (``paper_reward``).
"""

from __future__ import annotations

import json

import pytest

from activities.srl.episode import SrlActivities
from keel.srl.prompts import gold_answer
from keel.srl.rewards import OVERWRITE_PAPER_REWARD, REWARD_VERSION
from keel.srl.steps import SrlTask
from tests.srl.conftest import HAND_TASKS
from tests.support.srl_scoring import score, scoring_activities

pytestmark = pytest.mark.timeout(300)

TASKS = [SrlTask.model_validate(t) for t in HAND_TASKS]
LANGUAGES = sorted({t.language for t in TASKS})
#: One task per language (the first of each in the example file).
BY_LANGUAGE = {lang: next(t for t in TASKS if t.language == lang) for lang in LANGUAGES}
ROOT_KIND = {
    "python": "module",
    "javascript": "program",
    "typescript": "program",
    "java": "program",
}


def answer(action: str) -> str:
    return (
        f"<think>Write the file as it should be.</think>\n<action>\n{action}\n</action>\n"
        '<state_update>{"decisions": ["rewrite the file"]}</state_update>'
    )


def attacks(task: SrlTask) -> dict[str, str]:
    lang, post = task.language, task.post
    out = {
        "root rule, fix is the new file": answer(
            f"id: t\nlanguage: {lang}\nrule:\n  kind: {ROOT_KIND[lang]}\nfix: {json.dumps(post)}\n"
        ),
        "root rule inside all, fix is the new file": answer(
            f"id: t\nlanguage: {lang}\nrule:\n  all:\n    - kind: {ROOT_KIND[lang]}\n"
            f"fix: {json.dumps(post)}\n"
        ),
        "one-metavariable pattern, rewrite is the new file": answer(
            json.dumps({"pattern": "$A", "rewrite": post, "language": lang})
        ),
    }
    if task.pre.strip().count("\n") == 0:
        out["old file as pattern, new file as rewrite"] = answer(
            json.dumps({"pattern": task.pre.strip(), "rewrite": post.strip(), "language": lang})
        )
    return out


@pytest.fixture(scope="module")
def acts(tmp_path_factory: pytest.TempPathFactory) -> SrlActivities:
    return scoring_activities(tmp_path_factory.mktemp("overwrite"))


@pytest.mark.parametrize("language", LANGUAGES)
async def test_an_overwrite_scores_below_the_gold_action_in_both_rewards(
    acts: SrlActivities, language: str
) -> None:
    task = BY_LANGUAGE[language]
    assert task.gold_action is not None
    gold, gold_sandbox = await score(acts, task, gold_answer(task.gold_action, task.instruction))
    assert gold.effect == "equivalent" and gold.verified, (gold, gold_sandbox)
    assert gold.paper_reward == 1.0 and gold.reward_version == REWARD_VERSION
    for name, raw in attacks(task).items():
        r, sandbox = await score(acts, task, raw)
        # The attack does reach the expert's file: only how it got there differs.
        assert sandbox["text_after"] == task.post, (name, sandbox)
        assert r.effect == "overwrite" and not r.verified, (name, r, sandbox)
        assert r.total < gold.total, (name, r.total, gold.total)
        assert r.step_similarity is not None and gold.step_similarity is not None
        assert r.step_similarity < gold.step_similarity, (name, r)
        assert r.paper_reward == OVERWRITE_PAPER_REWARD, (name, r)
        assert r.paper_reward < gold.paper_reward
        assert r.total > -1.0  # still above a malformed answer


@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
async def test_no_gold_action_of_the_examples_is_an_overwrite(
    acts: SrlActivities, task: SrlTask
) -> None:
    assert task.gold_action is not None
    r, sandbox = await score(acts, task, gold_answer(task.gold_action, task.instruction))
    assert r.effect == "equivalent" and r.verified and r.total == 2.0, (r, sandbox)
    assert sandbox["replaced"], sandbox  # the regions were listed, none the whole file
