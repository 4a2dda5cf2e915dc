"""The structured interleaved-thinking state an SRL episode carries from step to step.

The model sees :func:`render` of the state in every prompt and answers with a
``<state_update>``; :func:`merge` folds the update in and :func:`fit_budget` keeps the
rendered state inside its token budget (400-800 tokens, plan §5), so the prompt cannot
grow without bound over a long episode.

Token counting is a callable passed in: the serving model's tokenizer in production
(llama.cpp's ``/tokenize``, a vLLM tokenizer), :func:`heuristic_count_tokens` where none
is offered. Everything here is deterministic: the same state, update and counter always
give the same result, which is what lets a replayed episode workflow reach the same state.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from keel.srl.errors import StateUpdateInvalid

MAX_TEXT_CHARS = 256
MAX_HISTORY = 3
# Without a cap per list a chatty model could push every other field out of the budget.
MAX_ITEMS = 8
# An update text may be longer than a state text (merge trims it), but not unboundedly.
MAX_UPDATE_TEXT_CHARS = 4096
MIN_BUDGET_TOKENS = 400
MAX_BUDGET_TOKENS = 800
DEFAULT_BUDGET_TOKENS = 800
ELLIPSIS = "…"

TokenCounter = Callable[[str], int]

StateText = Annotated[str, StringConstraints(max_length=MAX_TEXT_CHARS)]
UpdateText = Annotated[str, StringConstraints(max_length=MAX_UPDATE_TEXT_CHARS)]

LIST_FIELDS = ("goals", "constraints", "decisions", "hypotheses", "open_issues")


def heuristic_count_tokens(text: str) -> int:
    """Estimate tokens as one per 3 UTF-8 bytes, rounded up.

    BPE tokenizers of current code models average about 3.5-4 bytes per token on English
    and source code; 3 overestimates on purpose, so a state that fits by this count also
    fits the real tokenizer in the common case. Use the serving model's tokenizer where
    one is available.
    """
    return (len(text.encode("utf-8")) + 2) // 3


class State(BaseModel):
    """What the agent knows about its task, as short texts (each at most 256 chars).

    ``history`` holds at most the last three step summaries; older steps are folded away.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    goals: list[StateText] = Field(default_factory=list, max_length=MAX_ITEMS)
    constraints: list[StateText] = Field(default_factory=list, max_length=MAX_ITEMS)
    decisions: list[StateText] = Field(default_factory=list, max_length=MAX_ITEMS)
    hypotheses: list[StateText] = Field(default_factory=list, max_length=MAX_ITEMS)
    history: list[StateText] = Field(default_factory=list, max_length=MAX_HISTORY)
    open_issues: list[StateText] = Field(default_factory=list, max_length=MAX_ITEMS)
    next_focus: StateText = ""


class StateUpdate(BaseModel):
    """What one model answer adds to the state.

    List fields are appended (then deduplicated and trimmed by :func:`merge`);
    ``resolved`` removes open issues with the same text; ``next_focus`` replaces the old
    one when given. Unknown keys are refused, so a typo in a field name is an error the
    model sees, not an update silently lost.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    goals: list[UpdateText] = Field(default_factory=list, max_length=32)
    constraints: list[UpdateText] = Field(default_factory=list, max_length=32)
    decisions: list[UpdateText] = Field(default_factory=list, max_length=32)
    hypotheses: list[UpdateText] = Field(default_factory=list, max_length=32)
    history: list[UpdateText] = Field(default_factory=list, max_length=32)
    open_issues: list[UpdateText] = Field(default_factory=list, max_length=32)
    resolved: list[UpdateText] = Field(default_factory=list, max_length=32)
    next_focus: UpdateText | None = None


def _problems(err: ValidationError) -> list[tuple[str, str]]:
    return [(".".join(str(p) for p in e["loc"]), e["msg"]) for e in err.errors()]


def parse_state_update(raw: str | dict[str, Any]) -> StateUpdate:
    """Validate a ``<state_update>`` body (JSON text or an already decoded object).

    Raises :class:`StateUpdateInvalid` naming each offending field.
    """
    data: Any = raw
    if isinstance(raw, str):
        text = raw.strip()
        if not text:
            return StateUpdate()
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise StateUpdateInvalid([("", f"not valid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise StateUpdateInvalid([("", f"expected a JSON object, got {type(data).__name__}")])
    try:
        return StateUpdate.model_validate(data)
    except ValidationError as exc:
        raise StateUpdateInvalid(_problems(exc)) from None


def parse_state(data: dict[str, Any]) -> State:
    """Validate a stored state, raising :class:`StateUpdateInvalid` naming each bad field."""
    try:
        return State.model_validate(data)
    except ValidationError as exc:
        raise StateUpdateInvalid(_problems(exc)) from None


def clean_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Collapse whitespace and cut to ``limit`` chars, marking a cut with an ellipsis."""
    collapsed = " ".join(text.split())
    if len(collapsed) <= limit:
        return collapsed
    return collapsed[: limit - len(ELLIPSIS)].rstrip() + ELLIPSIS


def _dedupe(texts: Iterable[str]) -> list[str]:
    """Keep the first occurrence of each text, comparing case-insensitively."""
    seen: set[str] = set()
    out: list[str] = []
    for raw in texts:
        text = clean_text(raw)
        key = text.casefold()
        if text and key not in seen:
            seen.add(key)
            out.append(text)
    return out


def _keep_last(texts: list[str], limit: int) -> list[str]:
    return texts[-limit:] if len(texts) > limit else texts


def merge(state: State, update: StateUpdate) -> State:
    """Fold ``update`` into ``state``: append, dedupe, trim, keep the newest items.

    Every text is whitespace-collapsed and cut to 256 chars; duplicates (ignoring case)
    keep their first position; each list keeps its newest :data:`MAX_ITEMS` entries and
    ``history`` its newest three. Resolved open issues are dropped.
    """
    resolved = {clean_text(t).casefold() for t in update.resolved}
    merged: dict[str, Any] = {}
    for name in LIST_FIELDS:
        items = _dedupe([*getattr(state, name), *getattr(update, name)])
        if name == "open_issues":
            items = [t for t in items if t.casefold() not in resolved]
        merged[name] = _keep_last(items, MAX_ITEMS)
    merged["history"] = _keep_last(_dedupe([*state.history, *update.history]), MAX_HISTORY)
    focus = update.next_focus if update.next_focus is not None else state.next_focus
    merged["next_focus"] = clean_text(focus)
    return State(**merged)


_SECTIONS = (
    ("goals", "Goals"),
    ("constraints", "Constraints"),
    ("decisions", "Decisions"),
    ("hypotheses", "Hypotheses"),
    ("history", "History"),
    ("open_issues", "Open issues"),
)


def render(state: State) -> str:
    """The state as the stable text block that goes into the prompt.

    Fixed section order, one ``- item`` line per entry, ``(none)`` for an empty section,
    so two equal states always render to the same bytes (and cache the same prompt).
    """
    lines = ["<state>"]
    for name, title in _SECTIONS:
        lines.append(f"{title}:")
        items = getattr(state, name) or ["(none)"]
        lines.extend(f"- {item}" for item in items)
    lines.append(f"Next focus: {state.next_focus or '(none)'}")
    lines.append("</state>")
    return "\n".join(lines)


def summarise_history(history: list[str]) -> str:
    """Fold several step summaries into one line of at most 256 chars, oldest first."""
    if not history:
        return ""
    per_item = max(16, (MAX_TEXT_CHARS - 12) // len(history) - 3)
    parts = [clean_text(item, per_item) for item in history]
    return clean_text("earlier: " + " | ".join(parts))


def _shrink_steps(state: State) -> Iterable[State]:
    """Ever smaller states, least valuable content dropped first.

    Order: history is summarised into one line, then the oldest hypotheses, decisions,
    open issues, constraints and finally goals are dropped one at a time, then every text
    is halved. Goals and next focus go last because they say what the task is.
    """
    current = state
    if len(current.history) > 1:
        current = current.model_copy(update={"history": [summarise_history(current.history)]})
        yield current
    if current.history:
        current = current.model_copy(update={"history": []})
        yield current
    for name in ("hypotheses", "decisions", "open_issues", "constraints", "goals"):
        while getattr(current, name):
            current = current.model_copy(update={name: getattr(current, name)[1:]})
            yield current
    limit = MAX_TEXT_CHARS
    while limit > 8:
        limit //= 2
        current = current.model_copy(update={"next_focus": clean_text(current.next_focus, limit)})
        yield current


def fit_budget(
    state: State,
    max_tokens: int = DEFAULT_BUDGET_TOKENS,
    count_tokens: TokenCounter = heuristic_count_tokens,
) -> State:
    """Return ``state`` itself when its rendering fits ``max_tokens``, else a smaller one.

    Shrinking follows :func:`_shrink_steps` and stops at the first state that fits, so
    content is only dropped when it must be. ``max_tokens`` must lie in 400-800.
    Raises ``ValueError`` when even the emptiest state does not fit (a counter that
    counts far more tokens than characters).
    """
    if not MIN_BUDGET_TOKENS <= max_tokens <= MAX_BUDGET_TOKENS:
        raise ValueError(
            f"max_tokens must lie in {MIN_BUDGET_TOKENS}-{MAX_BUDGET_TOKENS}, got {max_tokens}"
        )
    if count_tokens(render(state)) <= max_tokens:
        return state
    for candidate in _shrink_steps(state):
        if count_tokens(render(candidate)) <= max_tokens:
            return candidate
    raise ValueError(f"even an empty state renders to more than {max_tokens} tokens")


def state_tokens(state: State, count_tokens: TokenCounter = heuristic_count_tokens) -> int:
    """Tokens of the rendered state by ``count_tokens``."""
    return count_tokens(render(state))
