"""keel.srl.rewards and keel.srl.canonical: verified, tests, diff size, the effect of an
action, the canonical form of an action, the step-wise similarity, combine.

Actions here come from whole answers through the real parser (``parse_step``); the
sandbox's part is played by the texts it would return, which the integration test
``tests/srl/integration/test_reward_degenerate.py`` gets from real ast-grep in the jail.
"""

from __future__ import annotations

import difflib
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from keel.srl.canonical import CanonicalAction, canonical_action, text_similarity
from keel.srl.rewards import (
    DEGENERATE_EFFECTS,
    DEGENERATE_FRACTION,
    OVERWRITE_PAPER_REWARD,
    PARTIAL_CAP,
    REWARD_VERSION,
    DiffSize,
    Reward,
    RewardWeights,
    combine,
    diff_size,
    effect,
    is_overwrite,
    matches_root_kind,
    paper_action_text,
    paper_reward,
    passed_fraction,
    removes_kept_code,
    step_similarity,
    unified_diff,
    verified,
)
from keel.srl.step import PatternAction, RuleAction, parse_step

PRE = "def f(a, b):\n    return g(a, b)\n"
GOLD = "def f(a, b):\n    return g(b, a)\n"


def test_verified_needs_equal_text_and_reparse() -> None:
    assert verified(GOLD, GOLD, reparses=True)
    assert not verified(GOLD, GOLD, reparses=False)
    assert not verified(GOLD + "\n", GOLD, reparses=True)
    assert not verified(None, GOLD, reparses=True)


def test_passed_fraction() -> None:
    assert passed_fraction(3, 4) == 0.75
    assert passed_fraction(0, 0) is None
    with pytest.raises(ValueError):
        passed_fraction(5, 4)


def test_diff_size_counts_changed_lines_only() -> None:
    assert diff_size(PRE, GOLD) == DiffSize(added=1, removed=1)
    assert diff_size(PRE, PRE).total == 0
    assert diff_size("", "a\nb\n") == DiffSize(added=2, removed=0)
    assert "+    return g(b, a)" in unified_diff(PRE, GOLD, "m.py")


def answer(action: str, think: str = "rewrite it") -> str:
    return (
        f"<think>{think}</think><action>{action}</action>"
        '<state_update>{"decisions": ["rewrite"]}</state_update>'
    )


def parsed(action: str) -> PatternAction | RuleAction:
    return parse_step(answer(action)).action


GOLD_ACTION = PatternAction(pattern="g($A, $B)", rewrite="g($B, $A)", language="python")
GOLD_JSON = '{"pattern": "g($A, $B)", "rewrite": "g($B, $A)", "language": "python"}'

#: The gold action spelled eight ways: every one has the gold's canonical form.
SPELLINGS = [
    GOLD_JSON,
    '{"language": "python", "rewrite": "g($B, $A)", "pattern": "g($A, $B)"}',
    '{\n  "rewrite" :  "g($B,   $A)",\n\t"pattern": "g( $A,\\n $B )", "language": "py"}',
    "```json\n" + GOLD_JSON + "\n```",
    '{"pattern": "g($FIRST, $SECOND)", "rewrite": "g($SECOND, $FIRST)", "language": "python"}',
    "id: swap-g\nlanguage: python\nrule:\n  pattern: g($A, $B)\nfix: g($B, $A)\n",
    "fix: 'g($Y, $X)'\nseverity: warning\nmessage: swap them\nrule:\n  pattern: \"g($X, $Y)\"\n"
    "language: Python\nid: other-id\n",
    "id: t\nlanguage: py\nrule: {pattern: 'g($A,  $B)'}\nfix:\n  template: |\n    g($B, $A)\n",
]


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_of_the_gold_action_has_its_canonical_form(spelling: str) -> None:
    action = parsed(spelling)
    assert canonical_action(action) == canonical_action(GOLD_ACTION)
    assert canonical_action(action) == CanonicalAction(
        language="python", matcher='{"pattern":"g($1,$2)"}', rewrite="g($2,$1)"
    )
    assert text_similarity(action, GOLD_ACTION) == 1.0


def test_canonical_form_keeps_what_carries_meaning() -> None:
    rule = parsed(
        "id: r\nlanguage: js\nmessage: m\n"
        "rule:\n  all:\n    - pattern: foo($$$ARGS, $_, $_X, $$B)\n    - inside: {kind: call_expression}\n"
        "constraints:\n  B: {regex: '^x'}\n  ARGS: {kind: identifier}\n"
        "transform:\n  NEW: {replace: {source: $B, replace: x, by: y}}\n"
        "fix: {template: 'bar($NEW, $$$ARGS)', expandEnd: {regex: ','}}\n"
    )
    canon = canonical_action(rule)
    assert canon.matcher == (
        '{"all":[{"pattern":"foo($$$1,$_,$_,$$2)"},{"inside":{"kind":"call_expression"}}]}'
    )
    assert canon.rewrite == "bar($3,$$$1)"
    assert canon.extras is not None
    assert json.loads(canon.extras) == {
        "constraints": {"2": {"regex": "^x"}, "1": {"kind": "identifier"}},
        "transform": {"3": {"replace": {"source": "$2", "replace": "x", "by": "y"}}},
        "fix": {"expandEnd": {"regex": ","}},
    }
    # Renaming every metavariable consistently changes nothing; the envelope neither.
    renamed = rule.rule["rule"], rule.rule["constraints"], rule.rule["transform"]
    other = RuleAction(
        rule={
            "id": "another",
            "language": "javascript",
            "severity": "error",
            "rule": json.loads(json.dumps(renamed[0]).replace("ARGS", "XS").replace("$$B", "$$Q")),
            "constraints": {"Q": renamed[1]["B"], "XS": renamed[1]["ARGS"]},
            "transform": {"Z": {"replace": {"source": "$Q", "replace": "x", "by": "y"}}},
            "fix": {"template": "bar($Z, $$$XS)", "expandEnd": {"regex": ","}},
        },
        language="javascript",
        yaml_text="",
    )
    assert canonical_action(other) == canon
    # A rule without fix rewrites nothing: not the same as a rewrite to "".
    nofix = parsed("id: r\nlanguage: python\nrule: {pattern: 'g($A, $B)'}\n")
    assert canonical_action(nofix).rewrite is None
    delete = PatternAction(pattern="g($A, $B)", rewrite="", language="python")
    assert text_similarity(nofix, delete) == 0.5  # the matcher equal, the rewrite not


def test_text_similarity_is_the_mean_sequence_matcher_ratio_of_the_parts() -> None:
    action = parsed('{"pattern": "g($A, $B)", "rewrite": "h($A)", "language": "python"}')
    # Canonical rewrites: "h($1)" against "g($2,$1)" (names by first appearance).
    rewrite = difflib.SequenceMatcher(None, "h($1)", "g($2,$1)", autojunk=False).ratio()
    assert text_similarity(action, GOLD_ACTION) == pytest.approx((1.0 + rewrite) / 2)
    assert 0 < text_similarity(action, GOLD_ACTION) < 1


@given(st.from_regex(r"[a-z]{1,4}\(\$[A-Z]{1,3}(, \$[A-Z]{1,3}){0,3}\)", fullmatch=True))
def test_consistent_metavariable_renaming_never_changes_the_canonical_form(pattern: str) -> None:
    names = list(dict.fromkeys(re.findall(r"\$([A-Z]+)", pattern)))
    fresh = {n: f"V{i}Q" for i, n in enumerate(reversed(names))}
    rewrite = "r(" + ", ".join(f"${n}" for n in reversed(names)) + ")"

    def rename(text: str) -> str:
        return re.sub(r"\$([A-Z]+)", lambda m: "$" + fresh[m.group(1)], text)

    a = PatternAction(pattern=pattern, rewrite=rewrite, language="java")
    b = PatternAction(pattern=rename(pattern), rewrite=rename(rewrite), language="java")
    assert canonical_action(a) == canonical_action(b)


@given(st.text(min_size=1, max_size=60), st.text(max_size=60))
def test_text_similarity_bounds(p: str, r: str) -> None:
    a = PatternAction(pattern=p, rewrite=r, language="python")
    score = text_similarity(a, GOLD_ACTION)
    assert 0.0 <= score <= 1.0
    assert (score == 1.0) == (canonical_action(a) == canonical_action(GOLD_ACTION))


def test_removes_kept_code_counts_tokens_pre_and_gold_share() -> None:
    pre = "x = compute(1, 2)\ny = compute(3, 4)\n"
    gold = "x = calculate(1, 2)\ny = calculate(3, 4)\n"
    assert removes_kept_code(pre, "x = \ny = \n", gold)  # every match deleted
    assert removes_kept_code(pre, "x = calculate(1)\ny = calculate(3, 4)\n", gold)
    assert not removes_kept_code(pre, gold, gold)
    # Half-way there: 'compute' goes, which the expert does not keep.
    assert not removes_kept_code(pre, "x = calculate(1, 2)\ny = compute(3, 4)\n", gold)


def test_effect_of_each_kind_of_result() -> None:
    assert effect(pre=PRE, result_text=GOLD, gold_post=GOLD, reparses=True) == "equivalent"
    assert effect(pre=PRE, result_text=GOLD, gold_post=GOLD, reparses=False) == "unparseable"
    assert effect(pre=PRE, result_text=PRE, gold_post=GOLD, reparses=True) == "noop"
    assert effect(pre=PRE, result_text=None, gold_post=GOLD, reparses=False) == "failed"
    assert (
        effect(pre=PRE, result_text=GOLD, gold_post=GOLD, reparses=True, applied_language_ok=False)
        == "failed"
    )
    deleted = "def f(a, b):\n    return \n"
    assert effect(pre=PRE, result_text=deleted, gold_post=GOLD, reparses=True) == "destructive"
    renamed = "def f(a, b):\n    return h(b, a)\n"  # 'g', which the expert keeps, is gone
    assert effect(pre=PRE, result_text=renamed, gold_post=GOLD, reparses=True) == "destructive"
    other = "def f(a, b):\n    return g(b, a, 0)\n"
    assert effect(pre=PRE, result_text=other, gold_post=GOLD, reparses=True) == "partial"


def test_step_similarity_by_effect() -> None:
    near = PatternAction(pattern="g($A, $B)", rewrite="g($B, $A, 0)", language="python")
    text = text_similarity(near, GOLD_ACTION)
    assert 0.9 < text < 1.0
    assert step_similarity(near, GOLD_ACTION, "equivalent") == 1.0
    assert step_similarity(near, GOLD_ACTION, "partial") == PARTIAL_CAP * text
    for kind in DEGENERATE_EFFECTS:
        assert step_similarity(near, GOLD_ACTION, kind) == DEGENERATE_FRACTION * text
        assert step_similarity(GOLD_ACTION, GOLD_ACTION, kind) == DEGENERATE_FRACTION
    assert step_similarity(None, GOLD_ACTION, "malformed") == -1.0
    assert step_similarity(near, None, "partial") is None
    # Even the gold's own text can't earn a degenerate action more than 0.1, nor a
    # partial one 1.0.
    assert step_similarity(GOLD_ACTION, GOLD_ACTION, "partial") == PARTIAL_CAP


def test_combine_weights() -> None:
    perfect = combine(
        action=parsed(SPELLINGS[5]),
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        language="python",
        tests_passed=1.0,
    )
    assert perfect.verified and perfect.format_ok and perfect.effect == "equivalent"
    assert perfect.step_similarity == 1.0 and perfect.text_similarity == 1.0
    assert perfect.total == 1.0 + 1.0 + 0.5
    noisy = combine(
        action=GOLD_ACTION,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD + "x\ny\nz\n",
        gold_post=GOLD,
        reparses=True,
    )
    assert not noisy.verified and noisy.effect == "partial"
    assert noisy.gold_diff_lines == 2
    assert noisy.diff_added == 4
    assert noisy.total == pytest.approx(PARTIAL_CAP - 3 * 0.01)
    failed = combine(
        action=GOLD_ACTION,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=None,
        gold_post=GOLD,
        reparses=False,
        weights=RewardWeights(similarity=0.5),
    )
    assert failed.diff_added == failed.diff_removed == 0
    assert failed.effect == "failed"
    assert failed.total == 0.5 * DEGENERATE_FRACTION


def test_a_wrong_language_action_is_failed_even_with_the_gold_result() -> None:
    js = PatternAction(pattern="g($A, $B)", rewrite="g($B, $A)", language="javascript")
    reward = combine(
        action=js,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        language="python",
    )
    assert reward.effect == "failed" and not reward.verified
    assert reward.diff_added == reward.diff_removed == 0
    assert reward.step_similarity == DEGENERATE_FRACTION and reward.total == DEGENERATE_FRACTION


def test_without_an_expert_action_the_similarity_is_none_and_counts_zero() -> None:
    kwargs = {"pre": PRE, "gold_post": GOLD, "expert": None, "language": "python"}
    good = combine(action=GOLD_ACTION, result_text=GOLD, reparses=True, **kwargs)  # type: ignore[arg-type]
    noop = combine(action=GOLD_ACTION, result_text=PRE, reparses=True, **kwargs)  # type: ignore[arg-type]
    assert good.step_similarity is None and good.text_similarity is None
    assert good.effect == "equivalent" and good.total == 1.0
    assert noop.step_similarity is None and noop.effect == "noop" and noop.total == 0.0
    assert combine(action=None, result_text=None, reparses=False, **kwargs).total == -1.0  # type: ignore[arg-type]


def test_format_error_is_minus_one() -> None:
    reward = combine(
        action=None,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        tests_passed=1.0,
    )
    assert reward.total == -1.0
    assert reward.step_similarity == -1.0
    assert reward.effect == "malformed"
    assert not reward.format_ok and not reward.verified


RESULTS = [PRE, None, GOLD + "z = 1\n", "def f(a, b):\n    return \n", GOLD.replace("g", "h")]


#: Where ast-grep replaced code in PRE (UTF-8 byte offsets): the gold's match ``g(a, b)``,
#: the whole file as the root node, the file but its newline, nothing listed.
GOLD_SPAN = [(PRE.index("g(a, b)"), PRE.index("g(a, b)") + len("g(a, b)"))]
ROOT_SPAN = [(0, len(PRE))]
BODY_SPAN = [(0, len(PRE) - 1)]


@given(
    st.text(min_size=1, max_size=40),
    st.text(max_size=40),
    st.one_of(st.sampled_from(RESULTS), st.text(max_size=80)),
    st.booleans(),
    st.floats(0.0, 1.0),
    st.sampled_from([None, GOLD_SPAN, ROOT_SPAN, BODY_SPAN]),
)
def test_nothing_but_a_correct_action_reaches_a_correct_actions_score(
    pattern: str,
    rewrite: str,
    result: str | None,
    reparses: bool,
    tests: float,
    replaced: list[tuple[int, int]] | None,
) -> None:
    """Whatever the action's text, its result and the regions it replaced, with at most the
    tests a correct action passes: only a structural action with the gold result earns 1.0
    (and 1.0 in the paper reward only with the gold's text); anything else totals less. An
    action that reached the gold result by overwriting the whole file is not correct
    (this test once let any action with the gold result score 2.0, an overwrite too)."""
    action = PatternAction(pattern=pattern, rewrite=rewrite, language="python")
    kwargs = {"expert": GOLD_ACTION, "pre": PRE, "gold_post": GOLD, "tests_passed": tests}
    reached = combine(action=action, result_text=GOLD, reparses=True, replaced=replaced, **kwargs)  # type: ignore[arg-type]
    correct = combine(
        action=GOLD_ACTION, result_text=GOLD, reparses=True, replaced=GOLD_SPAN, **kwargs
    )  # type: ignore[arg-type]
    other = combine(action=GOLD_ACTION, result_text=result, reparses=reparses, **kwargs)  # type: ignore[arg-type]
    assert correct.step_similarity == 1.0 and correct.effect == "equivalent"
    assert correct.paper_reward == 1.0
    if is_overwrite(action, PRE, replaced):
        assert reached.effect == "overwrite" and not reached.verified
        assert reached.total < correct.total
        assert reached.paper_reward == OVERWRITE_PAPER_REWARD
    else:
        assert reached.step_similarity == 1.0 and reached.effect == "equivalent"
        assert reached.total == correct.total
        assert reached.paper_reward is not None
        assert reached.paper_reward <= correct.paper_reward
    if result == GOLD and reparses:
        assert other == correct.model_copy(update={"text_similarity": 1.0})
        return
    assert other.step_similarity is not None and other.step_similarity <= PARTIAL_CAP
    assert other.total < correct.total
    if other.effect in DEGENERATE_EFFECTS:
        assert other.step_similarity <= DEGENERATE_FRACTION


def test_weights_cannot_let_a_wrong_step_win() -> None:
    with pytest.raises(ValidationError):
        RewardWeights(similarity=-1.0)
    with pytest.raises(ValidationError, match="must be positive"):
        RewardWeights(similarity=0.0, verified=0.0)


def test_old_rows_without_effect_still_load() -> None:
    old = {"format_ok": True, "verified": False, "step_similarity": 0.5, "total": 0.5}
    assert Reward.model_validate(old).effect is None


# -- the whole-file overwrite and the paper reward ----------------------------------------
ROOT_RULE = parsed(
    "id: t\nlanguage: python\nrule:\n  kind: module\nfix: " + json.dumps(GOLD) + "\n"
)


def test_an_overwrite_of_the_whole_file_is_never_equivalent() -> None:
    """A rule on the root node whose fix is the expert's file reaches the expert's result
    byte for byte: it is an overwrite, below the gold action in both rewards."""
    gold = combine(
        action=GOLD_ACTION,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        language="python",
        replaced=GOLD_SPAN,
    )
    attack = combine(
        action=ROOT_RULE,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        language="python",
        replaced=ROOT_SPAN,
    )
    assert (gold.effect, gold.verified, gold.total, gold.paper_reward) == (
        "equivalent",
        True,
        2.0,
        1.0,
    )
    assert attack.effect == "overwrite" and not attack.verified
    assert attack.step_similarity is not None and attack.step_similarity <= DEGENERATE_FRACTION
    assert attack.total < gold.total and attack.total <= DEGENERATE_FRACTION
    assert attack.paper_reward == OVERWRITE_PAPER_REWARD < 0
    assert attack.reward_version == gold.reward_version == REWARD_VERSION
    # Also the last step of a longer expert trajectory: an overwrite never verifies.
    last = combine(
        action=ROOT_RULE,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=PRE + "#\n",
        final_post=GOLD,
        reparses=True,
        language="python",
        replaced=ROOT_SPAN,
    )
    assert last.effect == "overwrite" and not last.verified
    # The root rule is an overwrite even when ast-grep's regions are not known.
    unknown = combine(
        action=ROOT_RULE,
        expert=GOLD_ACTION,
        pre=PRE,
        result_text=GOLD,
        gold_post=GOLD,
        reparses=True,
        language="python",
    )
    assert unknown.effect == "overwrite"


def test_what_is_an_overwrite() -> None:
    literal = PatternAction(pattern=PRE.strip(), rewrite=GOLD.strip(), language="python")
    anything = PatternAction(pattern="$A", rewrite=GOLD, language="python")
    assert matches_root_kind(ROOT_RULE)
    assert matches_root_kind(
        parsed("id: t\nlanguage: js\nrule:\n  any: [{kind: program}]\nfix: x\n")
    )
    assert not matches_root_kind(GOLD_ACTION)
    assert not matches_root_kind(
        parsed("id: t\nlanguage: js\nrule: {kind: call_expression}\nfix: x\n")
    )
    # The root node's span (the trailing newline included) is the whole file, whatever the
    # rewrite; a match over the file's text but for its newline is one only when the
    # rewrite has no metavariable (the new file written out).
    assert is_overwrite(anything, PRE, ROOT_SPAN)
    assert is_overwrite(literal, PRE, BODY_SPAN)
    assert not is_overwrite(GOLD_ACTION, PRE, GOLD_SPAN)
    assert not is_overwrite(GOLD_ACTION, PRE, None)
    one = "foo(1)\n"
    rename = PatternAction(pattern="foo($A)", rewrite="bar($A)", language="python")
    assert not is_overwrite(rename, one, [(0, 6)])  # a one-statement file, rewritten structurally
    assert is_overwrite(rename, one, [(0, 7)])  # the root itself
    # An overwrite that leaves the file as it was is a noop.
    assert effect(pre=PRE, result_text=PRE, gold_post=GOLD, reparses=True, overwrite=True) == "noop"
    assert "overwrite" in DEGENERATE_EFFECTS


def test_the_paper_reward_is_the_ratio_of_the_canonical_action_texts() -> None:
    assert paper_action_text(GOLD_ACTION) == '{"pattern":"g($1,$2)"}\ng($2,$1)\n'
    for spelling in SPELLINGS:  # one canonical text, whatever the spelling
        assert paper_reward(parsed(spelling), GOLD_ACTION) == 1.0
    near = PatternAction(pattern="g($A, $B)", rewrite="h($B, $A)", language="python")
    expected = difflib.SequenceMatcher(
        None, paper_action_text(near), paper_action_text(GOLD_ACTION), autojunk=False
    ).ratio()
    assert paper_reward(near, GOLD_ACTION) == expected
    assert 0 < expected < 1
    # The paper's reward looks at the text only: an identity rewrite is still similar.
    identity = PatternAction(pattern="g($A, $B)", rewrite="g($A, $B)", language="python")
    assert paper_reward(identity, GOLD_ACTION) > 0.8
    assert paper_reward(None, GOLD_ACTION) == -1.0
    assert paper_reward(near, None) is None
    assert paper_reward(GOLD_ACTION, GOLD_ACTION, overwrite=True) == OVERWRITE_PAPER_REWARD
    malformed = combine(
        action=None, expert=GOLD_ACTION, pre=PRE, result_text=None, gold_post=GOLD, reparses=False
    )
    assert malformed.paper_reward == -1.0 and malformed.reward_version == REWARD_VERSION


def test_old_rows_without_paper_reward_still_load() -> None:
    old = {"format_ok": True, "verified": True, "step_similarity": 1.0, "total": 2.0}
    loaded = Reward.model_validate(old)
    assert loaded.paper_reward is None and loaded.reward_version is None
