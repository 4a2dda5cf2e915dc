"""SRL steps in SQL: written once per (collection, step key), read for reports and export."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from keel.srl.trajectory import StepRow
from store.models import SrlStepRow
from store.records import _insert_ignoring_conflict

_COLUMNS = tuple(StepRow.model_fields)


def insert_step(sm: sessionmaker[Session], row: StepRow) -> tuple[StepRow, bool]:
    """Write ``row`` unless its key is there; return the stored row (the first one wins)
    and whether this call wrote it.

    A step replayed after a lost worker has the same key, so it is one row whatever the
    number of attempts.
    """
    values = {**row.model_dump(), "created_at": datetime.now(UTC)}
    with sm.begin() as session:
        if _insert_ignoring_conflict(session, SrlStepRow, values, ["collection", "step_key"]):
            return row, True
        stored = session.get(SrlStepRow, (row.collection, row.step_key), populate_existing=True)
        if stored is None:  # pragma: no cover - the conflicting row exists
            raise RuntimeError(f"srl step {row.collection}/{row.step_key} vanished")
        return _row(stored), False


def _row(r: SrlStepRow) -> StepRow:
    return StepRow.model_validate({c: getattr(r, c) for c in _COLUMNS})


def list_steps(
    sm: sessionmaker[Session],
    collection: str,
    *,
    task_id: str | None = None,
    limit: int | None = None,
) -> list[StepRow]:
    """Steps of a collection in task and step order."""
    q = select(SrlStepRow).where(SrlStepRow.collection == collection)
    if task_id is not None:
        q = q.where(SrlStepRow.task_id == task_id)
    q = q.order_by(SrlStepRow.task_id, SrlStepRow.step)
    if limit is not None:
        q = q.limit(limit)
    with sm() as session:
        return [_row(r) for r in session.scalars(q)]


def count_steps(sm: sessionmaker[Session], collection: str) -> dict[str, int]:
    """``{"steps", "verified", "format_errors"}`` of a collection."""
    q = select(
        func.count(),
        func.count().filter(SrlStepRow.verified.is_(True)),
        func.count().filter(SrlStepRow.format_ok.is_(False)),
    ).where(SrlStepRow.collection == collection)
    with sm() as session:
        steps, verified, bad = session.execute(q).one()
    return {"steps": steps, "verified": verified, "format_errors": bad}
