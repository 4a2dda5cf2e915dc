"""store/srl_steps.py on SQLite and PostgreSQL: a step is one row whatever the number of
inserts, the first one wins, and the counts and order are what reports read."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from keel.srl.rewards import Reward, format_error_reward
from keel.srl.trajectory import ModelOutput, StepRecord, StepRow
from store.srl_steps import count_steps, insert_step, list_steps


def row(
    collection: str, task_id: str, step: int, *, verified: bool | None, raw: str = "x"
) -> StepRow:
    reward = (
        format_error_reward()
        if verified is None
        else Reward(format_ok=True, verified=verified, step_similarity=0.5, total=0.5)
    )
    record = StepRecord(
        task_id=task_id,
        step=step,
        prompt={"messages": []},
        state_before={},
        model_output=ModelOutput(raw=raw, format_error="bad_json: x" if verified is None else None),
        reward=reward,
    )
    return StepRow.from_record(
        record, collection=collection, source="teacher", model="m", language="python"
    )


def test_insert_is_idempotent_and_the_first_row_wins(sm: sessionmaker[Session]) -> None:
    first = row("c", "t1", 1, verified=True, raw="first")
    stored, inserted = insert_step(sm, first)
    assert inserted and stored == first
    again = row("c", "t1", 1, verified=False, raw="second")
    stored, inserted = insert_step(sm, again)
    assert not inserted and stored == first
    # The same step key in another collection is another row.
    _, inserted = insert_step(sm, row("other", "t1", 1, verified=False))
    assert inserted
    assert [r.record_digest for r in list_steps(sm, "c")] == [first.record_digest]


def test_counts_and_order(sm: sessionmaker[Session]) -> None:
    for task_id, step, verified in [("b", 2, True), ("a", 1, None), ("b", 1, False)]:
        insert_step(sm, row("c", task_id, step, verified=verified))
    assert [(r.task_id, r.step) for r in list_steps(sm, "c")] == [("a", 1), ("b", 1), ("b", 2)]
    assert [r.step for r in list_steps(sm, "c", task_id="b")] == [1, 2]
    assert count_steps(sm, "c") == {"steps": 3, "verified": 1, "format_errors": 1}
    assert count_steps(sm, "none") == {"steps": 0, "verified": 0, "format_errors": 0}
