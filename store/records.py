"""Writing and reading Keel's records: gate audit events, LLM call logs, API idempotency.

Every write is idempotent by a natural key, because its callers are Temporal activities
that may run more than once: the first write wins and a repeat is a no-op that returns
False. Inserts use ``INSERT ... ON CONFLICT DO NOTHING`` (SQLite and PostgreSQL), so a
duplicate never aborts the surrounding transaction, even when two attempts race.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from pydantic import AwareDatetime, BaseModel
from sqlalchemy import Insert, Table, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from keel.records import GateAuditEvent, LLMCallLog
from store.models import ApiIdempotencyRow, Base, GateAuditRow, LLMCallRow

log = logging.getLogger(__name__)


class IdempotentResponse(BaseModel):
    """A stored API response, replayed when the same caller repeats an idempotency key.

    ``body_digest`` is the digest of the original request body: a repeat with another
    body is a misuse of the key, which the API should refuse rather than replay.
    """

    key: str
    actor: str
    method: str
    path: str
    body_digest: str
    status_code: int
    response_body: Any
    created_at: AwareDatetime


def _insert_ignoring_conflict(
    session: Session, model: type[Base], values: dict[str, Any], conflict_columns: Sequence[str]
) -> bool:
    """Insert one row unless its key exists; True when this call inserted it."""
    # Core insert on the table: no ORM identity map involved, and the column types
    # (UTC timestamps, JSON) still apply.
    table = cast(Table, model.__table__)
    # RETURNING tells whether a row went in; rowcount cannot, since SQLAlchemy may add
    # its own RETURNING for the primary key and then drivers report -1.
    marker = table.c[conflict_columns[0]]
    dialect = session.get_bind().dialect.name
    stmt: Insert
    if dialect == "postgresql":
        stmt = (
            postgresql.insert(table)
            .values(values)
            .on_conflict_do_nothing(index_elements=list(conflict_columns))
            .returning(marker)
        )
    elif dialect == "sqlite":
        stmt = (
            sqlite.insert(table)
            .values(values)
            .on_conflict_do_nothing(index_elements=list(conflict_columns))
            .returning(marker)
        )
    else:
        # Other databases: a savepoint keeps a duplicate from spoiling the transaction.
        try:
            with session.begin_nested():
                session.execute(insert(table).values(values))
        except IntegrityError:
            return False
        return True
    return session.execute(stmt).first() is not None


def record_gate_event(sm: sessionmaker[Session], event: GateAuditEvent) -> bool:
    """Append ``event`` to its gate's audit trail.

    Returns True when written, False when a row with the same ``event_key`` already
    exists (a retried activity); the existing row is left as it is.
    """
    values = event.model_dump()
    # JSON mode turns datetimes and the like inside ``details`` into JSON values.
    values["details"] = event.model_dump(mode="json")["details"]
    with sm.begin() as session:
        inserted = _insert_ignoring_conflict(session, GateAuditRow, values, ["event_key"])
    if not inserted:
        log.debug("gate event %s already recorded", event.event_key)
    return inserted


def list_gate_events(sm: sessionmaker[Session], gate_id: str) -> list[GateAuditEvent]:
    """The audit trail of one gate, oldest first.

    Ties in time go by the row's place in its run (the number after the last ``:`` of
    ``event_key``): a gate writes its rows concurrently, so insertion order is not theirs.
    """
    with sm() as session:
        rows = session.scalars(
            select(GateAuditRow)
            .where(GateAuditRow.gate_id == gate_id)
            .order_by(GateAuditRow.at, GateAuditRow.id)
        ).all()
        events = [GateAuditEvent.model_validate(r, from_attributes=True) for r in rows]
    return sorted(events, key=lambda e: (e.at, _place_in_run(e.event_key)))


def _place_in_run(event_key: str) -> int:
    """``<run id>:<n>`` → n; a key of another shape sorts first (stable: insertion order)."""
    _, _, tail = event_key.rpartition(":")
    return int(tail) if tail.isdigit() else 0


def record_llm_call(sm: sessionmaker[Session], call: LLMCallLog) -> bool:
    """Log one LLM call. Returns False (and writes nothing) if ``call_key`` is known."""
    values = call.model_dump()
    with sm.begin() as session:
        inserted = _insert_ignoring_conflict(session, LLMCallRow, values, ["call_key"])
    if not inserted:
        log.debug("llm call %s already recorded", call.call_key)
    return inserted


def list_llm_calls(
    sm: sessionmaker[Session],
    *,
    workflow_id: str | None = None,
    since: datetime | None = None,
    limit: int | None = None,
) -> list[LLMCallLog]:
    """Logged LLM calls, oldest first, optionally of one workflow and/or since a time."""
    stmt = select(LLMCallRow).order_by(LLMCallRow.created_at, LLMCallRow.id)
    if workflow_id is not None:
        stmt = stmt.where(LLMCallRow.workflow_id == workflow_id)
    if since is not None:
        stmt = stmt.where(LLMCallRow.created_at >= since)
    if limit is not None:
        stmt = stmt.limit(limit)
    with sm() as session:
        return [LLMCallLog.model_validate(r, from_attributes=True) for r in session.scalars(stmt)]


def _to_response(row: ApiIdempotencyRow) -> IdempotentResponse:
    return IdempotentResponse.model_validate(row, from_attributes=True)


def get_idempotent(sm: sessionmaker[Session], key: str, actor: str) -> IdempotentResponse | None:
    """The response stored for (``key``, ``actor``), or None if the key is new."""
    # A Core select on the session's connection: every mutating API request with a key
    # asks this first, and the ORM's identity map and loading cost several times the read.
    table = cast(Table, ApiIdempotencyRow.__table__)
    stmt = select(table).where(table.c.key == key, table.c.actor == actor)
    with sm() as session:
        row = session.connection().execute(stmt).first()
    return IdempotentResponse.model_validate(dict(row._mapping)) if row is not None else None


def save_idempotent(
    sm: sessionmaker[Session],
    key: str,
    actor: str,
    method: str,
    path: str,
    body_digest: str,
    status_code: int,
    response_body: Any,
) -> IdempotentResponse:
    """Store the response to (``key``, ``actor``) and return what is stored.

    If a concurrent request with the same key and actor stored its response first, that
    row is kept and returned, so every caller answers with the same response.
    """
    values = {
        "key": key,
        "actor": actor,
        "method": method,
        "path": path,
        "body_digest": body_digest,
        "status_code": status_code,
        "response_body": response_body,
        "created_at": datetime.now(UTC),
    }
    with sm.begin() as session:
        inserted = _insert_ignoring_conflict(session, ApiIdempotencyRow, values, ["key", "actor"])
        if inserted:
            return IdempotentResponse.model_validate(values)
        row = session.get(ApiIdempotencyRow, (key, actor), populate_existing=True)
        if row is None:  # pragma: no cover - the row exists once the insert or the winner did
            raise RuntimeError(f"idempotency row ({key!r}, {actor!r}) vanished after insert")
        log.debug("idempotency key %r for %r already stored", key, actor)
        return _to_response(row)
