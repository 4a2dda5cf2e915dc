"""Rewards of one SRL step.

Signals, each computed from what the sandbox activity hands over:

* ``verified``: the sandbox result equals the gold post-text exactly and re-parses in the
  task's language (the re-parse needs ast-grep, so it comes in as a flag);
* ``effect``: what the action did to the file: ``equivalent`` (verified), ``partial``,
  or degenerate: ``noop`` (unchanged), ``destructive`` (removed code the expert keeps),
  ``unparseable``, ``failed`` (not applied: a sandbox error or the wrong language);
* tests passed: the fraction of the task's tests that passed, where it has tests;
* diff size: added and removed lines of the unified diff (difflib) from pre to result;
* step-wise similarity, after the SRL paper's reward (Deng et al., "Supervised
  Reinforcement Learning", arXiv 2510.25992, §3: ``difflib.SequenceMatcher`` ratio
  ``2M/T`` between the model's action text and the expert's, -1 for a malformed answer),
  changed so that it measures the action, not its spelling: 1.0 for any action whose
  result is the expert's, else the canonical text similarity
  (:mod:`keel.srl.canonical`) scaled by the effect (:func:`step_similarity`).

:func:`combine` folds them into one :class:`Reward` with the documented weights of
:class:`RewardWeights`. Pure: no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from keel.srl.canonical import CanonicalAction, text_similarity
from keel.srl.step import Language, PatternAction, RuleAction

FORMAT_ERROR_REWARD = -1.0


def verified(result_text: str | None, gold_post: str, reparses: bool) -> bool:
    """True only when the action applied, its result is byte-for-byte the gold post-text,
    and the result re-parses. No whitespace normalisation: a rewrite that reformats the
    file is a different file."""
    return result_text is not None and reparses and result_text == gold_post


def passed_fraction(passed: int, total: int) -> float | None:
    """Share of passed tests, ``None`` when the task has no tests (not 0: absent, not failed)."""
    if passed < 0 or total < 0 or passed > total:
        raise ValueError(f"passed={passed}, total={total} is not a test count")
    return None if total == 0 else passed / total


class DiffSize(BaseModel):
    """Line counts of a unified diff, headers (``---``/``+++``/``@@``) not counted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    added: int = Field(ge=0)
    removed: int = Field(ge=0)

    @property
    def total(self) -> int:
        return self.added + self.removed


def diff_size(pre: str, post: str) -> DiffSize:
    """Added and removed lines of ``difflib.unified_diff(pre, post)``."""
    added = removed = 0
    lines = difflib.unified_diff(pre.splitlines(), post.splitlines(), lineterm="", n=0)
    for line in lines:
        if line.startswith(("---", "+++", "@@")):
            continue
        if line.startswith("+"):
            added += 1
        elif line.startswith("-"):
            removed += 1
    return DiffSize(added=added, removed=removed)


def unified_diff(pre: str, post: str, path: str = "file") -> str:
    """The unified diff text from ``pre`` to ``post`` (for the artifact store)."""
    return "".join(
        difflib.unified_diff(
            pre.splitlines(keepends=True),
            post.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )


Effect = Literal[
    "equivalent", "partial", "noop", "destructive", "unparseable", "failed", "malformed"
]
#: Effects that earn (almost) nothing: the file is unchanged, broken or lost code the
#: expert keeps, or the action was not applied.
DEGENERATE_EFFECTS: frozenset[Effect] = frozenset({"noop", "destructive", "unparseable", "failed"})
#: An unverified, non-degenerate action's similarity is this share of its text similarity:
#: below 1.0, so only an action whose result is the expert's earns a full 1.0.
PARTIAL_CAP = 0.9
#: A degenerate action's similarity is this share of its text similarity (at most 0.1):
#: a little signal among failures, never near a correct action's 1.0.
DEGENERATE_FRACTION = 0.1

_TOKEN = re.compile(r"\w+|[^\w\s]")


def _tokens(text: str) -> Counter[str]:
    return Counter(_TOKEN.findall(text))


def removes_kept_code(pre: str, result: str, gold_post: str) -> bool:
    """True when ``result`` has fewer copies of a token than both ``pre`` and the expert's
    ``gold_post`` have: it removed code the expert keeps (e.g. a rewrite to the empty
    string deletes every match, and the arguments the expert kept go with it). Tokens are
    words and single punctuation characters."""
    before, after, gold = _tokens(pre), _tokens(result), _tokens(gold_post)
    return any(after[t] < min(n, gold[t]) for t, n in before.items() if t in gold)


def effect(
    *,
    pre: str,
    result_text: str | None,
    gold_post: str,
    reparses: bool,
    applied_language_ok: bool = True,
) -> Effect:
    """What the action did to the file, judged against the expert's result ``gold_post``.

    ``failed``: not applied (the sandbox refused or failed, or the action's language is
    not the task's); ``equivalent``: the result is ``gold_post`` and re-parses (see
    :func:`verified`); ``noop``: the file is unchanged; ``unparseable``: the result does
    not re-parse; ``destructive``: it removed code the expert keeps
    (:func:`removes_kept_code`); ``partial``: any other change.
    """
    if result_text is None or not applied_language_ok:
        return "failed"
    if verified(result_text, gold_post, reparses):
        return "equivalent"
    if result_text == pre:
        return "noop"
    if not reparses:
        return "unparseable"
    if removes_kept_code(pre, result_text, gold_post):
        return "destructive"
    return "partial"


def step_similarity(
    action: PatternAction | RuleAction | CanonicalAction | None,
    expert: PatternAction | RuleAction | CanonicalAction | None,
    effect: Effect,
) -> float | None:
    """The step-wise reward, the SRL paper's similarity made to measure the action.

    -1 for a malformed answer (``action`` is ``None``); ``None`` when the task has no
    expert action; 1.0 for an ``equivalent`` action, whatever its spelling;
    ``PARTIAL_CAP`` (0.9) · :func:`~keel.srl.canonical.text_similarity` for a ``partial``
    one; ``DEGENERATE_FRACTION`` (0.1) · it for a degenerate one (``noop``,
    ``destructive``, ``unparseable``, ``failed``). So every correct action scores the same
    and above every other, and a do-nothing action scores at most 0.1.
    """
    if action is None or effect == "malformed":
        return FORMAT_ERROR_REWARD
    if expert is None:
        return None
    return _scaled(effect, text_similarity(action, expert))


def _scaled(effect: Effect, text: float) -> float:
    if effect == "equivalent":
        return 1.0
    share = DEGENERATE_FRACTION if effect in DEGENERATE_EFFECTS else PARTIAL_CAP
    return share * text


class RewardWeights(BaseModel):
    """Weights of :func:`combine`.

    ``total = similarity·w_sim + verified·w_verified + tests·w_tests - diff_excess·w_diff``
    where ``similarity`` is :func:`step_similarity` (0 when the task has no expert action)
    and ``diff_excess`` is how many more diff lines the result has than the gold
    post-text's diff (0 when it is smaller), capped at ``diff_cap``. Defaults: the
    similarity is the main signal (1.0); a verified step earns as much again (1.0); tests
    add half (0.5); each extra diff line costs 0.01, at most 0.5. A malformed answer is
    -1, whatever the weights. Weights are non-negative and ``similarity + verified`` is
    positive, so a correct action (similarity 1.0, verified, no excess) out-scores any
    other with no more tests passed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    similarity: float = Field(default=1.0, ge=0.0)
    verified: float = Field(default=1.0, ge=0.0)
    tests: float = Field(default=0.5, ge=0.0)
    diff_line: float = Field(default=0.01, ge=0.0)
    diff_cap: int = Field(default=50, ge=0)

    @model_validator(mode="after")
    def _correct_wins(self) -> RewardWeights:
        if self.similarity + self.verified <= 0:
            raise ValueError("similarity + verified must be positive: a correct step must win")
        return self


class Reward(BaseModel):
    """All reward signals of one step and their weighted total.

    ``effect`` says what the action did (see :func:`effect`; ``None`` in rows written
    before it existed); ``text_similarity`` is the canonical text similarity before the
    effect scaled it (``None`` for a malformed answer or a task without expert action);
    ``step_similarity`` is ``None`` when the task has no expert action.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_ok: bool
    verified: bool
    tests_passed: float | None = Field(default=None, ge=0.0, le=1.0)
    diff_added: int = Field(default=0, ge=0)
    diff_removed: int = Field(default=0, ge=0)
    gold_diff_lines: int = Field(default=0, ge=0)
    step_similarity: float | None = Field(ge=-1.0, le=1.0)
    text_similarity: float | None = Field(default=None, ge=0.0, le=1.0)
    effect: Effect | None = None
    total: float


def format_error_reward() -> Reward:
    """The reward of a malformed answer: -1, nothing else earned."""
    return Reward(
        format_ok=False,
        verified=False,
        step_similarity=FORMAT_ERROR_REWARD,
        effect="malformed",
        total=-1.0,
    )


def combine(
    *,
    action: PatternAction | RuleAction | CanonicalAction | None,
    expert: PatternAction | RuleAction | CanonicalAction | None,
    pre: str,
    result_text: str | None,
    gold_post: str,
    reparses: bool,
    language: Language | None = None,
    tests_passed: float | None = None,
    weights: RewardWeights | None = None,
    final_post: str | None = None,
) -> Reward:
    """The :class:`Reward` of one step.

    ``action`` is the parsed action (``None``: a format error, -1); ``expert`` the expert's
    action (``None``: a task verified against ``gold_post`` only, ``step_similarity`` is
    then ``None``); ``gold_post`` the expert's result text; ``pre`` the file before the
    step; ``result_text`` the file after the sandbox applied the action (``None`` when it
    failed to apply, which counts as an unchanged file for the diff size); ``language``
    the task's: an action in another one counts as failed. ``final_post`` is the task's
    post-text when ``gold_post`` is the file after one step of a longer expert trajectory:
    the step is compared with the expert's step, and ``verified`` means the task is done
    (the result is ``final_post``); an action that reaches it at once is ``equivalent``
    too, however many steps the expert took.
    """
    if action is None:
        return format_error_reward()
    w = weights or RewardWeights()
    language_ok = language is None or action.language == language
    what = effect(
        pre=pre,
        result_text=result_text,
        gold_post=gold_post,
        reparses=reparses,
        applied_language_ok=language_ok,
    )
    is_verified = what == "equivalent"
    if final_post is not None and final_post != gold_post:
        is_verified = language_ok and verified(result_text, final_post, reparses)
        if is_verified:
            what = "equivalent"
    applied = result_text if result_text is not None and language_ok else pre
    diff = diff_size(pre, applied)
    gold_lines = diff_size(pre, gold_post).total
    excess = min(max(0, diff.total - gold_lines), w.diff_cap)
    text = None if expert is None else text_similarity(action, expert)
    similarity = step_similarity(action, expert, what)
    total = (
        (similarity or 0.0) * w.similarity
        + (w.verified if is_verified else 0.0)
        + (tests_passed or 0.0) * w.tests
        - excess * w.diff_line
    )
    return Reward(
        format_ok=True,
        verified=is_verified,
        tests_passed=tests_passed,
        diff_added=diff.added,
        diff_removed=diff.removed,
        gold_diff_lines=gold_lines,
        step_similarity=similarity,
        text_similarity=text,
        effect=what,
        total=round(total, 6),
    )
