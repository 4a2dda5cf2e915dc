"""The step reward against degenerate and adversarial actions, end to end: each answer is
a whole ``<think>/<action>/<state_update>`` text that goes through the real parser
(``parse_step``), real ast-grep in the real jail and the re-parse (``SrlActivities._sandbox``)
and the real reward (``SrlActivities._score``), as ``srl.apply`` runs them.

For every task (the hand tasks of examples/srl/tasks.jsonl in Python, JavaScript,
TypeScript and Java, and three more): every spelling of a correct action (JSON with keys
reordered or spread over lines, a fence, other metavariable names, YAML rules with
``fix`` in several quotings, a different pattern with the same result) scores exactly the
same, 1.0 in ``step_similarity``; every degenerate action (matching nothing, rewriting a
match to itself, deleting every match or the whole file (an ``overwrite``: see
test_reward_overwrite.py), a rule without fix, a broken
rule, the wrong language, the gold text echoed in ``<think>`` beside a bad action)
scores strictly less, in ``step_similarity`` and in ``total``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from activities.srl.episode import SrlActivities
from keel.srl.prompts import gold_answer
from keel.srl.rewards import DEGENERATE_EFFECTS, DEGENERATE_FRACTION, PARTIAL_CAP
from keel.srl.state import State
from keel.srl.step import Language, action_text
from keel.srl.steps import ApplyInput, Generation, SrlTask
from tests.srl.conftest import HAND_TASKS
from tests.support.srl_scoring import score, scoring_activities

pytestmark = pytest.mark.timeout(300)

EXTRA_TASKS: list[dict[str, Any]] = [
    {
        "task_id": "py-haskey",
        "instruction": "`dict.has_key` is gone in Python 3: test membership with `in` instead",
        "language": "python",
        "file": "keys.py",
        "pre": "if d.has_key(k):\n    x = d.has_key(j)\n",
        "post": "if k in d:\n    x = j in d\n",
        "gold_action": {"pattern": "$D.has_key($K)", "rewrite": "$K in $D", "language": "python"},
    },
    {
        "task_id": "ts-logger",
        "instruction": "Log through `logger` instead of the old `log` object; `log` is being removed",
        "language": "typescript",
        "file": "log.ts",
        "pre": "log.debug(a, b);\nlog.debug();\n",
        "post": "logger.debug(a, b);\nlogger.debug();\n",
        "gold_action": {
            "pattern": "log.debug($$$ARGS)",
            "rewrite": "logger.debug($$$ARGS)",
            "language": "typescript",
        },
    },
    {
        "task_id": "java-isempty",
        "instruction": "Use `isEmpty()` to test whether the list is empty; it says what it means",
        "language": "java",
        "file": "B.java",
        "pre": "class B {\n  void f(List<String> xs) {\n    if (xs.size() == 0) { return; }\n  }\n}\n",
        "post": "class B {\n  void f(List<String> xs) {\n    if (xs.isEmpty()) { return; }\n  }\n}\n",
        "gold_action": {
            "pattern": "$L.size() == 0",
            "rewrite": "$L.isEmpty()",
            "language": "java",
        },
    },
]
TASKS = [SrlTask.model_validate(t) for t in [*HAND_TASKS, *EXTRA_TASKS]]

#: Other patterns whose result is the expert's too: correct, so as good as the gold.
SAME_RESULT: dict[str, tuple[str, str]] = {
    "py-rename": ("compute($$$ARGS)", "calculate($$$ARGS)"),
    "js-rename": ("oldName($$$X)", "newName($$$X)"),
}
#: Changes that parse and keep the expert's code but are not the expert's result.
PARTIAL = {
    "py-rename": ("compute($A, $B)", "calc($A, $B)"),
    "java-min": ("Math.max($A, $B)", "Math.min($B, $A)"),
    "ts-api": ("parseInt($A)", "Number.parseInt($A, 10)"),
}
ROOT_KIND = {
    "python": "module",
    "javascript": "program",
    "typescript": "program",
    "java": "program",
}
OTHER_LANGUAGE: dict[str, Language] = {
    "python": "javascript",
    "javascript": "typescript",
    "typescript": "javascript",
    "java": "python",
}
ALIAS = {"python": "py", "javascript": "js", "typescript": "ts", "java": "Java"}
_METAVAR = re.compile(r"(\${1,3})([A-Z][A-Z0-9_]*)")


def answer(action: str, think: str = "Rewrite the matches.") -> str:
    return (
        f"<think>{think}</think>\n<action>\n{action}\n</action>\n"
        '<state_update>{"decisions": ["rewrite the matches"]}</state_update>'
    )


def as_json(pattern: str, rewrite: str, language: str, **dumps: Any) -> str:
    return json.dumps({"pattern": pattern, "rewrite": rewrite, "language": language}, **dumps)


def renamed(text: str) -> str:
    """Every metavariable under another name (``$A`` -> ``$ZA9``)."""
    return _METAVAR.sub(lambda m: f"{m.group(1)}Z{m.group(2)}9", text)


def never_matching(pattern: str) -> str:
    """The pattern with one name changed, so it matches nothing in the file: the first
    identifier that is called or dereferenced, else the last plain identifier."""
    names = list(re.finditer(r"(?<![\w$])[A-Za-z_]\w*", pattern))
    called = [m for m in names if pattern[m.end() : m.end() + 1] in ("(", ".")]
    m = (called or names)[0 if called else -1]
    return pattern[: m.end()] + "Zz" + pattern[m.end() :]


def yaml_quote(text: str, style: str) -> str:
    if style == "single":
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text)  # a JSON string is a YAML double-quoted scalar


def correct_answers(task: SrlTask) -> dict[str, str]:
    g = task.gold_action
    p, r, lang = g.pattern, g.rewrite, g.language
    forms = {
        "gold replay": gold_answer(g, task.instruction),
        "json": answer(action_text(g)),
        "json keys reordered": answer(json.dumps({"language": lang, "rewrite": r, "pattern": p})),
        "json spread, language alias": answer(as_json(p, r, ALIAS[lang], indent=4)),
        "json fenced": answer("```json\n" + as_json(p, r, lang) + "\n```"),
        "json other metavariables": answer(as_json(renamed(p), renamed(r), lang)),
        "yaml fix, single quotes": answer(
            f"id: t\nlanguage: {lang}\nrule:\n  pattern: {yaml_quote(p, 'single')}\n"
            f"fix: {yaml_quote(r, 'single')}\n"
        ),
        "yaml fix, double quotes, envelope, keys reordered": answer(
            f"fix: {yaml_quote(renamed(r), 'double')}\nseverity: warning\n"
            f"message: {yaml_quote(task.instruction, 'double')}\n"
            f"rule: {{pattern: {yaml_quote(renamed(p), 'double')}}}\n"
            f"language: {ALIAS[lang]}\nid: a-longer-rule-id\n"
        ),
        "yaml fix template, block scalars": answer(
            f"id: t\nlanguage: {lang}\nrule:\n  pattern: |-\n    {p}\n"
            f"fix:\n  template: |-\n    {r}\n"
        ),
    }
    alt = SAME_RESULT.get(task.task_id)
    if alt is not None:
        forms["another pattern, same result"] = answer(as_json(alt[0], alt[1], lang))
    return forms


def degenerate_answers(task: SrlTask) -> dict[str, tuple[str, set[str]]]:
    """Answers that must lose to every correct one, with the effects each may have."""
    g = task.gold_action
    p, r, lang = g.pattern, g.rewrite, g.language
    gold = action_text(g)
    noop, failed = {"noop"}, {"failed"}
    lost = {"destructive", "unparseable"}
    forms = {
        "never matches": (answer(as_json(never_matching(p), r, lang)), noop),
        "identity rewrite": (answer(as_json(p, p, lang)), noop),
        "identity rewrite as yaml": (
            answer(
                f"id: t\nlanguage: {lang}\nrule:\n  pattern: {yaml_quote(p, 'single')}\n"
                f"fix: {yaml_quote(p, 'double')}\n"
            ),
            noop,
        ),
        "rule without fix": (
            answer(f"id: t\nlanguage: {lang}\nrule:\n  pattern: {yaml_quote(p, 'single')}\n"),
            noop,
        ),
        "delete every match": (answer(as_json(p, "", lang)), lost),
        "delete the whole file": (
            answer(f"id: t\nlanguage: {lang}\nrule:\n  kind: {ROOT_KIND[lang]}\nfix: ''\n"),
            {"overwrite"},
        ),
        "broken rule": (
            answer(
                f"id: t\nlanguage: {lang}\nrule:\n  kind: no_such_kind\nfix: {yaml_quote(r, 'single')}\n"
            ),
            failed,
        ),
        "gold action in the wrong language": (answer(as_json(p, r, OTHER_LANGUAGE[lang])), failed),
        "gold rule in the wrong language": (
            answer(
                f"id: t\nlanguage: {OTHER_LANGUAGE[lang]}\nrule:\n"
                f"  pattern: {yaml_quote(p, 'single')}\nfix: {yaml_quote(r, 'single')}\n"
            ),
            failed,
        ),
        "gold echoed in think, identity action": (
            answer(as_json(p, p, lang), think=f"The expert would write {gold}"),
            noop,
        ),
        "gold echoed in think, never-matching action": (
            answer(as_json(never_matching(p), r, lang), think=gold),
            noop,
        ),
    }
    return forms


@pytest.fixture(scope="module")
def acts(tmp_path_factory: pytest.TempPathFactory) -> SrlActivities:
    return scoring_activities(tmp_path_factory.mktemp("reward"))


@pytest.mark.parametrize("task", TASKS, ids=[t.task_id for t in TASKS])
async def test_correct_spellings_tie_above_every_degenerate_action(
    acts: SrlActivities, task: SrlTask
) -> None:
    correct = {name: await score(acts, task, raw) for name, raw in correct_answers(task).items()}
    similarity = {name: r.step_similarity for name, (r, _) in correct.items()}
    total = {name: r.total for name, (r, _) in correct.items()}
    # Every correct action, however spelled, scores 1.0 and the same total.
    assert similarity == dict.fromkeys(correct, 1.0)
    assert len(set(total.values())) == 1, total
    for name, (r, sandbox) in correct.items():
        assert r.verified and r.effect == "equivalent", (name, r, sandbox)
        assert sandbox["reparses"] is True
    best_total = min(total.values())

    degenerate = {
        name: (await score(acts, task, raw), effects)
        for name, (raw, effects) in degenerate_answers(task).items()
    }
    for name, ((r, sandbox), effects) in degenerate.items():
        assert r.format_ok and not r.verified, (name, r)
        assert r.step_similarity is not None and r.step_similarity < 1.0, (name, r)
        assert r.total < best_total, (name, r.total, best_total)
        assert r.effect in effects, (name, r.effect, sandbox)
        assert r.effect in DEGENERATE_EFFECTS
        assert r.step_similarity <= DEGENERATE_FRACTION, (name, r)
        # Still above a malformed answer.
        assert r.total > -1.0

    wrong, sandbox = degenerate["gold action in the wrong language"][0]
    assert sandbox["ok"] is False and sandbox["error"] == (
        f"not applied: the action's language is {OTHER_LANGUAGE[task.language]}, "
        f"the task's is {task.language}"
    )
    # The wrong-language gold text is the expert's text: 1.0 before the effect counts.
    assert wrong.text_similarity == 1.0 and wrong.step_similarity == DEGENERATE_FRACTION
    # The echoed gold text does not help: the think tag is not the action.
    echoed = degenerate["gold echoed in think, identity action"][0][0]
    identity = degenerate["identity rewrite"][0][0]
    assert echoed.step_similarity == identity.step_similarity

    partial = PARTIAL.get(task.task_id)
    if partial is not None:
        r, sandbox = await score(acts, task, answer(as_json(*partial, task.language)))
        assert r.effect == "partial", (r, sandbox)
        assert r.step_similarity is not None and 0 < r.step_similarity < PARTIAL_CAP
        assert r.total < best_total


async def test_a_malformed_answer_is_minus_one(acts: SrlActivities) -> None:
    task = TASKS[0]
    prompt = acts.artifacts.put_json({"messages": [], "step": 1, "state_tokens": 0})
    inp = ApplyInput(
        collection="reward",
        tasks_digest="blake3:" + "0" * 64,
        task_index=0,
        step=1,
        source="teacher",
        state=State(),
        generation=Generation(
            raw=f"<think>{action_text(task.gold_action)}</think>",
            model="m",
            state_before=State(),
            prompt_digest=prompt,
        ),
    )
    record, outcome = await acts._score(task, inp, task.pre)
    assert record.reward is not None
    assert (record.reward.total, record.reward.step_similarity) == (-1.0, -1.0)
    assert record.reward.effect == "malformed" and not outcome.format_ok
