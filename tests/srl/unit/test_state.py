"""keel.srl.state: merge, render, validation errors and the token budget."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.srl.errors import StateUpdateInvalid
from keel.srl.state import (
    MAX_HISTORY,
    MAX_ITEMS,
    MAX_TEXT_CHARS,
    State,
    StateUpdate,
    fit_budget,
    heuristic_count_tokens,
    merge,
    parse_state,
    parse_state_update,
    render,
    state_tokens,
)

texts = st.text(min_size=0, max_size=400)
updates = st.builds(
    StateUpdate,
    goals=st.lists(texts, max_size=6),
    constraints=st.lists(texts, max_size=6),
    decisions=st.lists(texts, max_size=6),
    hypotheses=st.lists(texts, max_size=6),
    history=st.lists(texts, max_size=6),
    open_issues=st.lists(texts, max_size=6),
    resolved=st.lists(texts, max_size=3),
    next_focus=st.none() | texts,
)


def test_merge_appends_dedupes_and_keeps_last_three_history() -> None:
    state = State(goals=["Rename foo to bar"], history=["s1", "s2"])
    update = StateUpdate(
        goals=["rename FOO to bar", "Keep tests green"],
        history=["s3", "s4"],
        open_issues=["imports"],
        next_focus="run the rule",
    )
    merged = merge(state, update)
    assert merged.goals == ["Rename foo to bar", "Keep tests green"]
    assert merged.history == ["s2", "s3", "s4"]
    assert merged.open_issues == ["imports"]
    assert merged.next_focus == "run the rule"
    resolved = merge(merged, StateUpdate(resolved=["Imports"]))
    assert resolved.open_issues == []
    assert resolved.next_focus == "run the rule"


def test_merge_trims_long_texts_to_256_chars() -> None:
    merged = merge(State(), StateUpdate(decisions=["x" * 1000]))
    assert len(merged.decisions[0]) == MAX_TEXT_CHARS
    assert merged.decisions[0].endswith("…")


@settings(max_examples=150)
@given(updates, updates)
def test_merge_invariants(first: StateUpdate, second: StateUpdate) -> None:
    state = merge(merge(State(), first), second)
    assert len(state.history) <= MAX_HISTORY
    for name in ("goals", "constraints", "decisions", "hypotheses", "open_issues", "history"):
        items = getattr(state, name)
        assert len(items) <= MAX_ITEMS
        assert all(0 < len(t) <= MAX_TEXT_CHARS for t in items)
        assert len({t.casefold() for t in items}) == len(items)
    # A merged state is a valid State: it survives a JSON round trip through validation.
    assert parse_state(state.model_dump()) == state
    # Merging nothing changes nothing.
    assert merge(state, StateUpdate()) == state


def test_render_is_stable_and_lists_every_section() -> None:
    state = State(goals=["g1"], next_focus="f")
    text = render(state)
    assert text == render(State(goals=["g1"], next_focus="f"))
    assert text.splitlines() == [
        "<state>",
        "Goals:",
        "- g1",
        "Constraints:",
        "- (none)",
        "Decisions:",
        "- (none)",
        "Hypotheses:",
        "- (none)",
        "History:",
        "- (none)",
        "Open issues:",
        "- (none)",
        "Next focus: f",
        "</state>",
    ]


def test_malformed_update_names_the_field() -> None:
    with pytest.raises(StateUpdateInvalid) as err:
        parse_state_update({"goals": "not a list", "histroy": []})
    assert set(err.value.fields) == {"goals", "histroy"}
    assert "goals" in str(err.value)
    with pytest.raises(StateUpdateInvalid) as err:
        parse_state_update('{"history": [1, "ok"]}')
    assert err.value.fields == ["history.0"]
    with pytest.raises(StateUpdateInvalid, match="not valid JSON"):
        parse_state_update("{oops")
    with pytest.raises(StateUpdateInvalid, match="expected a JSON object"):
        parse_state_update("[1, 2]")
    assert parse_state_update("  ") == StateUpdate()


def test_stored_state_over_the_caps_is_refused() -> None:
    with pytest.raises(StateUpdateInvalid) as err:
        parse_state({"history": ["a", "b", "c", "d"], "goals": ["x" * 257]})
    assert set(err.value.fields) == {"history", "goals.0"}


def _full_state() -> State:
    def six(prefix: str) -> list[str]:
        return [f"{prefix} {i} " + "word " * 48 for i in range(MAX_ITEMS)]

    return State(
        goals=[g[:MAX_TEXT_CHARS] for g in six("goal")],
        constraints=[g[:MAX_TEXT_CHARS] for g in six("constraint")],
        decisions=[g[:MAX_TEXT_CHARS] for g in six("decision")],
        hypotheses=[g[:MAX_TEXT_CHARS] for g in six("hypothesis")],
        history=[g[:MAX_TEXT_CHARS] for g in six("step")][:3],
        open_issues=[g[:MAX_TEXT_CHARS] for g in six("issue")],
        next_focus="focus " * 40,
    )


def test_fit_budget_shrinks_least_valuable_first() -> None:
    state = _full_state()
    assert state_tokens(state) > 800
    fitted = fit_budget(state, 800)
    assert state_tokens(fitted) <= 800
    # History is summarised into one line and hypotheses go before goals.
    assert len(fitted.history) <= 1
    assert len(fitted.goals) == MAX_ITEMS
    assert len(fitted.hypotheses) < MAX_ITEMS
    # A state already inside the budget is returned unchanged.
    small = State(goals=["g"])
    assert fit_budget(small, 400) is small


def test_fit_budget_uses_the_counter_passed_in() -> None:
    state = _full_state()

    def words(text: str) -> int:
        return len(text.split())

    by_words = fit_budget(state, 400, words)
    assert words(render(by_words)) <= 400
    assert by_words != fit_budget(state, 400)


def test_fit_budget_refuses_budgets_outside_400_to_800() -> None:
    with pytest.raises(ValueError, match="400-800"):
        fit_budget(State(), 100)
    with pytest.raises(ValueError, match="even an empty state"):
        fit_budget(State(), 400, lambda text: 10_000)


@settings(max_examples=60)
@given(st.lists(updates, min_size=1, max_size=4), st.integers(400, 800))
def test_fit_budget_always_fits_and_is_deterministic(batch: list[StateUpdate], budget: int) -> None:
    state = State()
    for update in batch:
        state = merge(state, update)
    fitted = fit_budget(state, budget)
    assert heuristic_count_tokens(render(fitted)) <= budget
    assert fit_budget(state, budget) == fitted
    assert fit_budget(fitted, budget) == fitted


def test_heuristic_counts_bytes_over_three() -> None:
    assert heuristic_count_tokens("") == 0
    assert heuristic_count_tokens("abc") == 1
    assert heuristic_count_tokens("abcd") == 2
    assert heuristic_count_tokens("é") == 1
