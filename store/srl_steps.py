"""SRL steps in SQL: written once per (collection, step key), read for reports, export and
a collection run again (which reuses them); and each collection's identity, written once."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from keel.srl.steps import CollectionIdentity
from keel.srl.trajectory import StepRow
from store.models import SrlCollectionRow, SrlStepRow
from store.records import _insert_ignoring_conflict, _insert_row

_COLUMNS = tuple(StepRow.model_fields)


def insert_step(sm: sessionmaker[Session], row: StepRow) -> tuple[StepRow, bool]:
    """Write ``row`` unless its key is there; return the stored row (the first one wins)
    and whether this call wrote it.

    A step replayed after a lost worker has the same key, so it is one row whatever the
    number of attempts.
    """
    values = {**row.model_dump(), "created_at": datetime.now(UTC)}
    if _insert_row(sm, SrlStepRow, values, ["collection", "step_key"]):
        return row, True
    with sm() as session:
        stored = session.get(SrlStepRow, (row.collection, row.step_key))
        if stored is None:  # pragma: no cover - the conflicting row exists
            raise RuntimeError(f"srl step {row.collection}/{row.step_key} vanished")
        return _row(stored), False


def get_step(sm: sessionmaker[Session], collection: str, key: str) -> StepRow | None:
    """The row of one step, or None when it is not recorded."""
    with sm() as session:
        stored = session.get(SrlStepRow, (collection, key))
        return _row(stored) if stored is not None else None


_IDENTITY = tuple(CollectionIdentity.model_fields)


def get_identity(sm: sessionmaker[Session], collection: str) -> CollectionIdentity | None:
    """The identity a collection's first run recorded, or None."""
    with sm() as session:
        stored = session.get(SrlCollectionRow, collection)
        if stored is None:
            return None
        return CollectionIdentity.model_validate({c: getattr(stored, c) for c in _IDENTITY})


def record_identity(
    sm: sessionmaker[Session], identity: CollectionIdentity
) -> tuple[CollectionIdentity, bool]:
    """Write the collection's identity unless it is there; return the stored one (the
    first run's) and whether this call wrote it.

    A collection recorded before identities were kept gets the first identity a run
    brings, unless its rows name another source (then that source, so the run is refused).
    """
    values = {**identity.model_dump(), "created_at": datetime.now(UTC)}
    with sm.begin() as session:
        stored = session.get(SrlCollectionRow, identity.collection)
        if stored is None:
            sources = set(
                session.scalars(
                    select(SrlStepRow.source)
                    .where(SrlStepRow.collection == identity.collection)
                    .distinct()
                )
            )
            if sources and identity.source not in sources:
                legacy = identity.model_copy(update={"source": sorted(sources)[0]})
                return legacy, False
            if _insert_ignoring_conflict(session, SrlCollectionRow, values, ["collection"]):
                return identity, True
            stored = session.get(SrlCollectionRow, identity.collection, populate_existing=True)
            if stored is None:  # pragma: no cover - the conflicting row exists
                raise RuntimeError(f"srl collection {identity.collection} vanished")
        return CollectionIdentity.model_validate({c: getattr(stored, c) for c in _IDENTITY}), False


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
    q = q.order_by(SrlStepRow.task_id, SrlStepRow.sample, SrlStepRow.step)
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
