"""The gate's audit row written on the worker's event loop when it need not wait
(``store.records.GateRowsNowait``, used by ``activities.records.RecordActivities``).

A row that would wait for another writer's lock is refused with nothing written, and the
activity then writes it in a thread, waiting for the lock as any write does: the row is
written either way, exactly once.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from activities.records import RecordActivities
from keel.records import GateAuditEvent
from store.db import dispose_engines, get_sessionmaker, make_engine, make_sessionmaker
from store.records import GateRowsNowait, list_gate_events, record_gate_event

GATE = "bench/x/gate/g"


def row(key: str) -> GateAuditEvent:
    return GateAuditEvent(
        gate_id=GATE,
        gate_name="g",
        event="approved",
        actor="bob",
        comment="ok",
        event_key=key,
        at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        details={"when": datetime(2026, 1, 2, tzinfo=UTC), "n": 2},
    )


@pytest.fixture
def db(tmp_path: Path) -> Iterator[tuple[Path, sessionmaker[Session]]]:
    path = tmp_path / "keel.db"
    yield path, get_sessionmaker(f"sqlite:///{path}")
    dispose_engines()


@pytest.fixture
def write_lock(db: tuple[Path, sessionmaker[Session]]) -> Iterator[sqlite3.Connection]:
    """Another writer holding the database's write lock until the test commits it."""
    conn = sqlite3.connect(db[0], isolation_level=None, check_same_thread=False)
    conn.execute("BEGIN IMMEDIATE")
    yield conn
    conn.close()


def test_writes_once_and_reads_back(db: tuple[Path, sessionmaker[Session]]) -> None:
    _, sm = db
    rows = GateRowsNowait(sm)
    try:
        assert rows.write(row("r:1")) is True
        assert rows.write(row("r:1")) is False  # a retried activity: the first row stays
        assert record_gate_event(sm, row("r:1")) is False
        (got,) = list_gate_events(sm, GATE)
    finally:
        rows.close()
    assert got.event_key == "r:1"
    assert got.details == {"when": "2026-01-02T00:00:00Z", "n": 2}


def test_refused_with_nothing_written_while_another_writer_holds_the_lock(
    db: tuple[Path, sessionmaker[Session]], write_lock: sqlite3.Connection
) -> None:
    _, sm = db
    rows = GateRowsNowait(sm)
    try:
        assert rows.write(row("r:1")) is None
        write_lock.execute("COMMIT")
        assert list_gate_events(sm, GATE) == []
        assert rows.write(row("r:1")) is True
    finally:
        rows.close()
    assert [e.event_key for e in list_gate_events(sm, GATE)] == ["r:1"]


def test_not_a_sqlite_file_is_never_written_here() -> None:
    engine = make_engine("sqlite://")  # in memory: a second engine would be another db
    try:
        rows = GateRowsNowait(make_sessionmaker(engine))
        assert rows.write(row("r:1")) is None
    finally:
        engine.dispose()


async def test_activity_waits_for_the_lock_in_a_thread(
    db: tuple[Path, sessionmaker[Session]], write_lock: sqlite3.Connection
) -> None:
    _, sm = db
    activities = RecordActivities(sm)
    writing = asyncio.create_task(activities.gate_event(row("r:1")))
    # The nowait write was refused; the thread's write waits on the lock (busy timeout).
    await asyncio.sleep(0.2)
    assert not writing.done()
    released = threading.Event()

    def release() -> None:
        write_lock.execute("COMMIT")
        released.set()

    await asyncio.to_thread(release)
    assert await writing is True
    assert released.is_set()
    assert [e.event_key for e in list_gate_events(sm, GATE)] == ["r:1"]
    assert await activities.gate_event(row("r:1")) is False
