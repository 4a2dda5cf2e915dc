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
  (:mod:`keel.srl.canonical`) scaled by the effect (:func:`step_similarity`);
* the paper's reward itself (:func:`paper_reward`): the ratio between the canonical texts
  of the two actions (:func:`paper_action_text`), -1 for a malformed answer, and
  ``OVERWRITE_PAPER_REWARD`` for an action that overwrites the whole file.

An action that rewrites the whole file (its rule matches the root node, or one match
replaced the file's whole text with text written out in the rewrite) has the effect
``overwrite`` (:func:`is_overwrite`): never equivalent, never verified, in both rewards
below every correct structural action.

:func:`combine` folds them into one :class:`Reward` with the documented weights of
:class:`RewardWeights`; ``REWARD_VERSION`` names this definition in every record. Pure:
no I/O.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from keel.srl.canonical import CanonicalAction, canonical_action, text_similarity
from keel.srl.step import Language, PatternAction, RuleAction

FORMAT_ERROR_REWARD = -1.0
#: The version of the reward definitions (Keel's ``total`` and ``step_similarity``, and
#: ``paper_reward``) a record was scored with: recorded in every :class:`Reward`, changed
#: whenever a definition changes. Rows without it were scored before version 2 (no
#: ``overwrite`` effect, no paper reward). Version 3: ``tests_passed`` is computed (the
#: fraction of the task's tests that pass on the file after the action, run in the jail),
#: so a task with tests adds ``0.5·tests_passed`` to ``total``; without tests, ``total``
#: is what version 2 gave.
REWARD_VERSION = "srl-reward/3"
#: The paper reward of an action that overwrites the whole file: below every well-formed
#: answer's ratio (>= 0), above a malformed answer's -1. A deviation from the paper,
#: whose ratio would score such an action by its text alone.
OVERWRITE_PAPER_REWARD = -0.5
#: The kinds of the root node of a file in the task languages (tree-sitter's names).
ROOT_KINDS = frozenset({"module", "program"})


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
    "equivalent",
    "partial",
    "noop",
    "destructive",
    "unparseable",
    "failed",
    "overwrite",
    "malformed",
]
#: Effects that earn (almost) nothing: the file is unchanged, broken or lost code the
#: expert keeps, overwritten as a whole, or the action was not applied.
DEGENERATE_EFFECTS: frozenset[Effect] = frozenset(
    {"noop", "destructive", "unparseable", "failed", "overwrite"}
)
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


#: A metavariable in a canonical rewrite (``keel.srl.canonical`` numbers them: ``$1``,
#: ``$$$2``; a non-capturing one is ``$_``).
_CANONICAL_METAVARIABLE = re.compile(r"(?<![\w$])\${1,3}(?:\d+|_)(?!\w)")


def _names_root_kind(value: object) -> bool:
    """True when a rule object (at any depth: ``all``, ``any``, ``has`` …) asks for a node of
    a root kind (``kind: module`` / ``kind: program``)."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if isinstance(kind, str) and kind.strip() in ROOT_KINDS:
            return True
        return any(_names_root_kind(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_root_kind(v) for v in value)
    return False


def matches_root_kind(action: PatternAction | RuleAction | CanonicalAction) -> bool:
    """True when the action's rule matches the file's root node by kind (``module`` in
    Python, ``program`` in JavaScript, TypeScript and Java): it rewrites the whole file."""
    if isinstance(action, RuleAction):
        return _names_root_kind(action.rule.get("rule")) or _names_root_kind(
            action.rule.get("utils")
        )
    if isinstance(action, CanonicalAction):
        return any(f'"kind":"{k}"' in action.matcher for k in ROOT_KINDS)
    return False


def is_overwrite(
    action: PatternAction | RuleAction | CanonicalAction,
    pre: str,
    replaced: Sequence[tuple[int, int]] | None,
) -> bool:
    """True when the action rewrites the whole file rather than the code the task is about.

    Either its rule asks for the root node by kind (:func:`matches_root_kind`), or one of
    the regions ast-grep replaced (``replaced``: UTF-8 byte offsets into ``pre``, expansions
    included) spans the whole file but for surrounding whitespace and

    * is the root node's span (from the first byte to the last, the file's trailing
      whitespace included: no statement ends past its last token; a pattern that is one
      metavariable, ``$A``, matches the root), or
    * was replaced by a rewrite with no metavariable, i.e. the new file written out in
      the rewrite (a pattern spelling the whole old file, a rewrite spelling the new).

    A structural rewrite of a one-statement file (``foo($A)`` → ``bar($A)`` on
    ``foo(1)\n``) is none of these: its match ends before the newline and its rewrite
    carries ``$A`` over.
    """
    if matches_root_kind(action):
        return True
    data = pre.encode("utf-8")
    if not data.strip():
        return False
    first = len(data) - len(data.lstrip())
    last = len(data.rstrip())
    rewrite = canonical_action(action).rewrite or ""
    literal = _CANONICAL_METAVARIABLE.search(rewrite) is None
    for start, end in replaced or ():
        if start > first or end < last:
            continue
        if (start == 0 and end == len(data) and last < len(data)) or literal:
            return True
    return False


def effect(
    *,
    pre: str,
    result_text: str | None,
    gold_post: str,
    reparses: bool,
    applied_language_ok: bool = True,
    overwrite: bool = False,
) -> Effect:
    """What the action did to the file, judged against the expert's result ``gold_post``.

    ``failed``: not applied (the sandbox refused or failed, or the action's language is
    not the task's); ``noop``: the file is unchanged; ``overwrite``: it changed the file
    by rewriting it as a whole (``overwrite``, see :func:`is_overwrite`), whatever the
    result, the expert's included; ``equivalent``: the result is ``gold_post`` and
    re-parses (see :func:`verified`); ``unparseable``: the result does not re-parse;
    ``destructive``: it removed code the expert keeps (:func:`removes_kept_code`);
    ``partial``: any other change.
    """
    if result_text is None or not applied_language_ok:
        return "failed"
    if overwrite and result_text != pre:
        return "overwrite"
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
    ``destructive``, ``unparseable``, ``failed``, ``overwrite``). So every correct action scores the same
    and above every other, and a do-nothing action scores at most 0.1.
    """
    if action is None or effect == "malformed":
        return FORMAT_ERROR_REWARD
    if expert is None:
        return None
    return _scaled(effect, text_similarity(action, expert))


def paper_action_text(action: PatternAction | RuleAction | CanonicalAction) -> str:
    """The text the paper reward compares: the action's canonical form
    (:func:`~keel.srl.canonical.canonical_action`) as three lines, the matcher (the rule
    object as canonical JSON; ``{"pattern":"…"}`` for a pattern action), the rewrite (empty
    for a rule without ``fix``) and the extras (``constraints``, ``transform`` … as
    canonical JSON; empty when there are none). The language and the envelope (``id``,
    ``message`` …) are not compared; metavariables are numbered by first appearance."""
    canon = canonical_action(action)
    return "\n".join((canon.matcher, canon.rewrite or "", canon.extras or ""))


def paper_reward(
    action: PatternAction | RuleAction | CanonicalAction | None,
    expert: PatternAction | RuleAction | CanonicalAction | None,
    *,
    overwrite: bool = False,
) -> float | None:
    """The SRL paper's step-wise reward (arXiv 2510.25992, §3): ``2M/T``, the
    ``difflib.SequenceMatcher`` ratio (``autojunk`` off) between the two actions' texts
    (:func:`paper_action_text`), whatever the action did; -1 for a malformed answer
    (``action`` is ``None``); ``None`` when the task has no expert action.

    One deviation: an action that overwrites the whole file (:func:`is_overwrite`) scores
    ``OVERWRITE_PAPER_REWARD`` (-0.5), below every well-formed answer, whatever its text.
    """
    if action is None:
        return FORMAT_ERROR_REWARD
    if expert is None:
        return None
    if overwrite:
        return OVERWRITE_PAPER_REWARD
    a, b = paper_action_text(action), paper_action_text(expert)
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


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
    ``step_similarity`` is ``None`` when the task has no expert action. ``paper_reward``
    is the paper's reward beside it, and ``reward_version`` the definitions used.
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
    #: The paper's step-wise reward (:func:`paper_reward`); ``None`` without an expert
    #: action, and in rows written before it existed.
    paper_reward: float | None = Field(default=None, ge=-1.0, le=1.0)
    #: The definitions the step was scored with (``REWARD_VERSION``); ``None``: before
    #: version 2.
    reward_version: str | None = None


def format_error_reward() -> Reward:
    """The reward of a malformed answer: -1, nothing else earned."""
    return Reward(
        format_ok=False,
        verified=False,
        step_similarity=FORMAT_ERROR_REWARD,
        effect="malformed",
        total=-1.0,
        paper_reward=FORMAT_ERROR_REWARD,
        reward_version=REWARD_VERSION,
    )


def _effect_verified(
    action: PatternAction | RuleAction | CanonicalAction,
    pre: str,
    result_text: str | None,
    gold_post: str,
    reparses: bool,
    language_ok: bool,
    final_post: str | None,
    replaced: Sequence[tuple[int, int]] | None,
) -> tuple[Effect, bool]:
    """The step's effect and whether it is verified: equivalent to ``gold_post``, or (a
    step of a longer trajectory) reaching ``final_post`` at once, which makes it
    equivalent too; an overwrite never is."""
    what = effect(
        pre=pre,
        result_text=result_text,
        gold_post=gold_post,
        reparses=reparses,
        applied_language_ok=language_ok,
        overwrite=is_overwrite(action, pre, replaced),
    )
    is_verified = what == "equivalent"
    if final_post is not None and final_post != gold_post and what != "overwrite":
        is_verified = language_ok and verified(result_text, final_post, reparses)
        if is_verified:
            what = "equivalent"
    return what, is_verified


def _weighted_total(
    w: RewardWeights,
    similarity: float | None,
    is_verified: bool,
    tests_passed: float | None,
    excess: int,
) -> float:
    """The reward's total before rounding: the weighted parts less the excess diff."""
    return (
        (similarity or 0.0) * w.similarity
        + (w.verified if is_verified else 0.0)
        + (tests_passed or 0.0) * w.tests
        - excess * w.diff_line
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
    replaced: Sequence[tuple[int, int]] | None = None,
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
    too, however many steps the expert took. ``replaced`` are the regions of ``pre`` ast-grep
    replaced (UTF-8 byte offsets), from which :func:`is_overwrite` tells an action that
    overwrote the whole file: effect ``overwrite``, never verified.
    """
    if action is None:
        return format_error_reward()
    w = weights or RewardWeights()
    language_ok = language is None or action.language == language
    what, is_verified = _effect_verified(
        action, pre, result_text, gold_post, reparses, language_ok, final_post, replaced
    )
    applied = result_text if result_text is not None and language_ok else pre
    diff = diff_size(pre, applied)
    gold_lines = diff_size(pre, gold_post).total
    excess = min(max(0, diff.total - gold_lines), w.diff_cap)
    text = None if expert is None else text_similarity(action, expert)
    similarity = step_similarity(action, expert, what)
    total = _weighted_total(w, similarity, is_verified, tests_passed, excess)
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
        paper_reward=paper_reward(action, expert, overwrite=what == "overwrite"),
        reward_version=REWARD_VERSION,
    )
