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
from sqlalchemy import Engine, Insert, Table, insert, select
from sqlalchemy import event as sa_event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from keel.records import GateAuditEvent, LLMCallLog
from store.db import _sqlite_file, make_engine
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


#: ``INSERT ... ON CONFLICT (key) DO NOTHING RETURNING key`` per table, conflict key and
#: dialect, built once and run with each row's values as parameters. Built from the
#: row's values instead (``.values(row)``), the statement, its cache key and the values'
#: coercion cost three times the write itself (gate rows: 0.32-0.43 ms against
#: 0.10-0.11 ms a row, SQLite); every SRL step, LLM call log and design row paid that.
_CONFLICT_INSERTS: dict[tuple[str, tuple[str, ...], str], Insert] = {}


def _conflict_insert(table: Table, conflict_columns: Sequence[str], dialect: str) -> Insert | None:
    """The prebuilt insert of ``table`` that skips a row whose ``conflict_columns`` exist;
    None for a dialect without ``ON CONFLICT DO NOTHING``."""
    key = (table.name, tuple(conflict_columns), dialect)
    stmt = _CONFLICT_INSERTS.get(key)
    if stmt is None:
        if dialect == "postgresql":
            stmt = postgresql.insert(table).on_conflict_do_nothing(
                index_elements=list(conflict_columns)
            )
        elif dialect == "sqlite":
            stmt = sqlite.insert(table).on_conflict_do_nothing(
                index_elements=list(conflict_columns)
            )
        else:
            return None
        # RETURNING tells whether a row went in; rowcount cannot, since SQLAlchemy may
        # add its own RETURNING for the primary key and then drivers report -1.
        stmt = stmt.returning(table.c[conflict_columns[0]])
        _CONFLICT_INSERTS[key] = stmt
    return stmt


def _insert_ignoring_conflict(
    session: Session, model: type[Base], values: dict[str, Any], conflict_columns: Sequence[str]
) -> bool:
    """Insert one row unless its key exists; True when this call inserted it."""
    # Core insert on the table: no ORM identity map involved, and the column types
    # (UTC timestamps, JSON) still apply.
    table = cast(Table, model.__table__)
    stmt = _conflict_insert(table, conflict_columns, session.get_bind().dialect.name)
    if stmt is None:
        # Other databases: a savepoint keeps a duplicate from spoiling the transaction.
        try:
            with session.begin_nested():
                session.execute(insert(table).values(values))
        except IntegrityError:
            return False
        return True
    return session.execute(stmt, values).first() is not None


def _insert_row(
    sm: sessionmaker[Session],
    model: type[Base],
    values: dict[str, Any],
    conflict_columns: Sequence[str],
) -> bool:
    """:func:`_insert_ignoring_conflict` in a transaction of its own, on a bare connection
    where the sessionmaker is bound to an engine (no ORM session to build and close)."""
    bind = sm.kw.get("bind")
    if isinstance(bind, Engine):
        table = cast(Table, model.__table__)
        stmt = _conflict_insert(table, conflict_columns, bind.dialect.name)
        if stmt is not None:
            return _insert_on(bind, stmt, values)
    with sm.begin() as session:
        return _insert_ignoring_conflict(session, model, values, conflict_columns)


def _insert_on(engine: Engine, stmt: Insert, values: dict[str, Any]) -> bool:
    with engine.begin() as conn:
        return conn.execute(stmt, values).first() is not None


def _gate_insert(dialect: str) -> Insert | None:
    """The gate row's insert (a gate's decision is answered only once its row is
    written: a local activity in the answering workflow task)."""
    return _conflict_insert(cast(Table, GateAuditRow.__table__), ["event_key"], dialect)


def _gate_row_values(event: GateAuditEvent) -> dict[str, Any]:
    values = event.model_dump()
    # JSON mode turns datetimes and the like inside ``details`` into JSON values.
    values["details"] = event.model_dump(mode="json", include={"details"})["details"]
    return values


def record_gate_event(sm: sessionmaker[Session], event: GateAuditEvent) -> bool:
    """Append ``event`` to its gate's audit trail.

    Returns True when written, False when a row with the same ``event_key`` already
    exists (a retried activity); the existing row is left as it is.
    """
    inserted = _insert_row(sm, GateAuditRow, _gate_row_values(event), ["event_key"])
    if not inserted:
        log.debug("gate event %s already recorded", event.event_key)
    return inserted


def _no_busy_wait(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=0")
    finally:
        cursor.close()


def _is_busy(err: OperationalError) -> bool:
    """Whether SQLite refused for another connection's lock (``SQLITE_BUSY``/locked)."""
    text = str(err.orig).lower()
    return "locked" in text or "busy" in text


class GateRowsNowait:
    """Gate audit rows written on the calling thread when that need not wait.

    For the gate's audit activity, which answers a decision once its row is written: on
    the worker's event loop a row costs its write alone, where a thread's hand-off and
    hand-back cost as much again (bench/gate_latency.py). Only a SQLite file qualifies (a
    server's round trip is a wait), on one connection of its own whose ``busy_timeout``
    is 0: a row that would wait for another writer's lock is refused at once, and the
    caller writes it with :func:`record_gate_event` off its thread. The connection closes
    with this object (or :meth:`close`).
    """

    def __init__(self, sm: sessionmaker[Session]) -> None:
        bind = sm.kw.get("bind")
        self._engine: Engine | None = None
        if (
            isinstance(bind, Engine)
            and bind.dialect.name == "sqlite"
            and _sqlite_file(bind.url) is not None
        ):
            # make_engine's pragmas, then (listeners run in order) no wait for the lock.
            self._engine = make_engine(bind.url, pool_size=1)
            sa_event.listen(self._engine, "connect", _no_busy_wait)

    def write(self, event: GateAuditEvent) -> bool | None:
        """:func:`record_gate_event` here and now: None, with nothing written, when
        another writer holds the write lock or the store is not a SQLite file."""
        stmt = _gate_insert("sqlite")
        if self._engine is None or stmt is None:
            return None
        try:
            inserted = _insert_on(self._engine, stmt, _gate_row_values(event))
        except OperationalError as err:
            if not _is_busy(err):
                raise
            return None
        if not inserted:
            log.debug("gate event %s already recorded", event.event_key)
        return inserted

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()


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
    inserted = _insert_row(sm, LLMCallRow, call.model_dump(), ["call_key"])
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
