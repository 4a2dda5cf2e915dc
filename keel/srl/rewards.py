"""Rewards of one SRL step.

Four signals, each computed from texts the sandbox activity hands over:

* ``verified``: the sandbox result equals the gold post-text exactly and re-parses in its
  language (the re-parse needs ast-grep, so it comes in as a flag);
* tests passed: the fraction of the task's tests that passed, where it has tests;
* diff size: added and removed lines of the unified diff (difflib) from pre to result;
* step-wise similarity, the SRL paper's reward (Deng et al., "Supervised Reinforcement
  Learning", arXiv 2510.25992, §3): ``difflib.SequenceMatcher`` ratio ``2M/T`` between the
  model's action text and the expert's, and -1 when the answer is malformed.

:func:`combine` folds them into one :class:`Reward` with the documented weights of
:class:`RewardWeights`.
"""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict, Field

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


def step_similarity(action_text: str | None, expert_text: str) -> float:
    """The SRL paper's step-wise reward: ``SequenceMatcher(None, a, b).ratio()`` in [0, 1],
    or -1 when the answer had no valid action (``action_text`` is ``None``).

    ``autojunk`` is off: its heuristic ignores characters frequent in texts over 200 chars,
    which would make the score depend on the length of the action.
    """
    if action_text is None:
        return FORMAT_ERROR_REWARD
    return difflib.SequenceMatcher(None, action_text, expert_text, autojunk=False).ratio()


class RewardWeights(BaseModel):
    """Weights of :func:`combine`.

    ``total = similarity·w_sim + verified·w_verified + tests·w_tests - diff_excess·w_diff``
    where ``diff_excess`` is how many more diff lines the result has than the gold
    post-text's diff (0 when it is smaller), capped at ``diff_cap``. Defaults: the paper's
    similarity is the main signal (1.0); a verified step earns as much again (1.0); tests
    add half (0.5); each extra diff line costs 0.01, at most 0.5. A malformed answer is
    -1, whatever the weights.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    similarity: float = 1.0
    verified: float = 1.0
    tests: float = 0.5
    diff_line: float = 0.01
    diff_cap: int = Field(default=50, ge=0)


class Reward(BaseModel):
    """All reward signals of one step and their weighted total."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_ok: bool
    verified: bool
    tests_passed: float | None = Field(default=None, ge=0.0, le=1.0)
    diff_added: int = Field(default=0, ge=0)
    diff_removed: int = Field(default=0, ge=0)
    gold_diff_lines: int = Field(default=0, ge=0)
    step_similarity: float = Field(ge=-1.0, le=1.0)
    total: float


def format_error_reward() -> Reward:
    """The reward of a malformed answer: -1, nothing else earned."""
    return Reward(format_ok=False, verified=False, step_similarity=FORMAT_ERROR_REWARD, total=-1.0)


def combine(
    *,
    action_text: str | None,
    expert_text: str,
    pre: str,
    result_text: str | None,
    gold_post: str,
    reparses: bool,
    tests_passed: float | None = None,
    weights: RewardWeights | None = None,
) -> Reward:
    """The :class:`Reward` of one step; ``action_text=None`` means a format error.

    ``result_text`` is the file after the sandbox applied the action (``None`` when the
    action failed to apply, which counts as an unchanged file for the diff size).
    """
    if action_text is None:
        return format_error_reward()
    w = weights or RewardWeights()
    is_verified = verified(result_text, gold_post, reparses)
    diff = diff_size(pre, pre if result_text is None else result_text)
    gold_lines = diff_size(pre, gold_post).total
    excess = min(max(0, diff.total - gold_lines), w.diff_cap)
    similarity = step_similarity(action_text, expert_text)
    total = (
        similarity * w.similarity
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
        total=round(total, 6),
    )
