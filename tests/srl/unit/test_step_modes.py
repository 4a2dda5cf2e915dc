"""Step modes: ``expert_prefix`` (the paper's, default) starts step n from the file after the
expert's steps 1..n-1 and shows them in the state; ``free_running`` goes on from the
episode's own last file. Feedback derived from the expert's file stays out of the prompt
unless asked for.

The step-order case (issue 39 §3): the expert swaps the arguments of ``f``, then renames it
to ``g``; the model does the expert's step 2 first (a rename, correct in itself)."""

from __future__ import annotations

from typing import Any

from activities.srl.scoring import _feedback
from keel.srl.expert import Expert, ExpertStep
from keel.srl.rewards import combine
from keel.srl.step import PatternAction, parse_rule_action
from keel.srl.steps import CollectionOptions, SrlTask

SWAP = PatternAction(pattern="f($A, $B)", rewrite="f($B, $A)", language="python")
RENAME = parse_rule_action("id: r\nlanguage: python\nrule:\n  pattern: f($$$A)\nfix: g($$$A)\n")
PRE = "x = f(1, 2)\n"
MID = "x = f(2, 1)\n"  # after the expert's step 1 (swap)
POST = "x = g(2, 1)\n"  # after its step 2 (rename)
RENAMED_FIRST = "x = g(1, 2)\n"  # the model's rename done first, on PRE

TASK = SrlTask(
    task_id="swap-rename",
    instruction="Put the arguments of f in the new order, then call g, which replaces f.",
    language="python",
    file="a.py",
    pre=PRE,
    post=POST,
    expert=Expert(
        steps=[ExpertStep(action=SWAP, text_after=MID), ExpertStep(action=RENAME, text_after=POST)]
    ),
)


def _score(step: int, action: Any, before: str, after: str) -> Any:
    expert, expert_post = TASK.expert_at(step)
    return combine(
        action=action,
        expert=expert,
        pre=before,
        result_text=after,
        gold_post=expert_post,
        final_post=TASK.post,
        reparses=True,
        language="python",
    )


def test_the_default_is_the_papers_expert_prefix_without_expert_feedback() -> None:
    options = CollectionOptions()
    assert (options.step_mode, options.expert_feedback) == ("expert_prefix", False)


def test_an_expert_prefix_step_starts_after_the_experts_earlier_steps() -> None:
    assert [TASK.prefix_text(n) for n in (1, 2, 3)] == [PRE, MID, MID]
    assert TASK.expert_step_count == 2
    first, second = TASK.prefix_state(1), TASK.prefix_state(2)
    assert first.goals == [TASK.instruction] and first.history == []
    # Step 2's state shows the expert's step 1, never an outcome of the model's own.
    assert second.goals == [TASK.instruction]
    assert second.history == ["step 1 (expert): applied `f($A, $B)` -> `f($B, $A)`"]


def test_a_task_without_an_expert_action_runs_free() -> None:
    plain = SrlTask(
        task_id="t", instruction="do it", language="python", file="a.py", pre=PRE, post=POST
    )
    assert plain.expert_step_count == 0
    assert plain.step_mode("expert_prefix") == "free_running"
    assert TASK.step_mode("expert_prefix") == "expert_prefix"
    gold = plain.model_copy(update={"gold_action": SWAP})
    assert gold.expert_step_count == 1 and gold.prefix_text(2) == PRE


def test_the_experts_step_2_done_first_before_and_after() -> None:
    # Step 1, either mode: the rename done first is compared with the expert's step 1
    # (the swap) and its file: Keel's reward labels it destructive (it removed `f`, which
    # the file after the expert's step 1 keeps), 0.1 x text similarity; the paper's
    # reward is the canonical texts' ratio.
    step1 = _score(1, RENAME, PRE, RENAMED_FIRST)
    assert step1.effect == "destructive" and not step1.verified
    assert round(step1.step_similarity, 4) == 0.0775
    assert round(step1.paper_reward, 4) == 0.8387

    # Before (free running, today's only mode): step 2 goes on from the model's own file,
    # with the expert-derived feedback of step 1 in its prompt.
    free_feedback = _feedback(1, {"ok": True, "reparses": True}, True, False, "destructive")
    assert free_feedback == "step 1: applied but it removed code the goal keeps"
    swap_g = PatternAction(pattern="g($A, $B)", rewrite="g($B, $A)", language="python")
    free2 = _score(2, swap_g, RENAMED_FIRST, POST)
    assert (free2.effect, free2.step_similarity, free2.verified) == ("equivalent", 1.0, True)

    # After (expert_prefix, the default): step 2 starts from the expert's step-1 file
    # (MID), not the model's; the model's rename there is the expert's step 2.
    assert TASK.prefix_text(2) == MID != RENAMED_FIRST
    prefix2 = _score(2, RENAME, TASK.prefix_text(2), POST)
    assert (prefix2.effect, prefix2.step_similarity, prefix2.verified) == ("equivalent", 1.0, True)
    assert prefix2.paper_reward == 1.0


def test_expert_derived_feedback_only_when_asked() -> None:
    ok = {"ok": True, "reparses": True}
    for verified, effect in ((True, "equivalent"), (False, "destructive"), (False, "partial")):
        line = _feedback(1, ok, True, verified, effect, expert=False)
        assert line == "step 1: applied; the file changed"
    assert _feedback(1, ok, True, True, "equivalent") == (
        "step 1: applied; the file now matches the goal"
    )
    assert "does not match the goal yet" in _feedback(1, ok, True, False, "partial")
    # What the jail saw is said either way.
    assert "matched nothing" in _feedback(1, ok, False, False, "noop", expert=False)
    bad = {"ok": True, "reparses": False}
    assert "does not parse" in _feedback(1, bad, True, False, "unparseable", expert=False)
    failed = {"ok": False, "error": "boom", "reparses": False}
    assert "the action failed: boom" in _feedback(1, failed, False, False, "failed", expert=False)
