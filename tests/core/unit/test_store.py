"""The SQL store: migrations, idempotent records, API idempotency rows.

Every database test runs on SQLite (a fresh file per test) and, when
``KEEL_TEST_POSTGRES_URL`` is set (``scripts/with-postgres.sh`` sets it), on PostgreSQL
too, each test in its own fresh schema.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from pydantic import ValidationError
from sqlalchemy import func, inspect, select
from sqlalchemy.orm import Session, sessionmaker

from keel.records import GateAuditEvent, LLMCallLog
from store.db import (
    alembic_config,
    get_engine,
    get_sessionmaker,
    init_db,
    make_engine,
)
from store.models import Base, GateAuditRow, LLMCallRow
from store.records import (
    get_idempotent,
    list_gate_events,
    list_llm_calls,
    record_gate_event,
    record_llm_call,
    save_idempotent,
)
from tests.support.store import run_together

POSTGRES_URL = os.environ.get("KEEL_TEST_POSTGRES_URL", "")
TABLES = {"gate_audit", "llm_calls", "api_idempotency", "rllm_runs"}
TABLES |= {"mrp_runs", "mrp_shards", "mrp_checkpoints", "srl_steps", "srl_collections"}
TABLES |= {"projects", "decision_sets", "artifacts", "agent_runs", "approvals"}
TABLES |= {"cost_estimates", "events"}
T0 = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)


def gate_event(
    key: str, *, gate_id: str = "design/p/ds1/gate/pre-codegen", **kw: Any
) -> GateAuditEvent:
    fields: dict[str, Any] = {
        "gate_id": gate_id,
        "gate_name": "pre-codegen",
        "event": "approved",
        "actor": "alice",
        "comment": "looks good",
        "request_id": "req-1",
        "event_key": key,
        "at": T0,
        "details": {"reason_cards": ["rc1"], "n": 2},
    }
    fields.update(kw)
    return GateAuditEvent(**fields)


def llm_call(key: str, **kw: Any) -> LLMCallLog:
    fields: dict[str, Any] = {
        "call_key": key,
        "workflow_id": "rllm/app/blake3:00",
        "model_name": "small",
        "litellm_model": "hosted_vllm/smollm2",
        "provider": "hosted_vllm",
        "status": "ok",
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "total_tokens": 42,
        "latency_ms": 812.5,
        "cost_usd": 0.00042,
        "created_at": T0,
    }
    fields.update(kw)
    return LLMCallLog(**fields)


# --- migrations -------------------------------------------------------------------------


def test_init_db_creates_exactly_the_schema_at_head(db_url: str) -> None:
    init_db(db_url)
    engine = get_engine(db_url)
    insp = inspect(engine)
    assert set(insp.get_table_names()) == TABLES | {"alembic_version"}
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    with engine.connect() as conn:
        assert MigrationContext.configure(conn).get_current_revision() == head
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("gate_audit")}
    assert ("event_key",) in uniques
    assert insp.get_pk_constraint("api_idempotency")["constrained_columns"] == ["key", "actor"]
    # A second run finds the schema current and changes nothing.
    init_db(db_url)
    assert set(inspect(engine).get_table_names()) == TABLES | {"alembic_version"}


def test_models_match_migrations(db_url: str) -> None:
    init_db(db_url)
    with get_engine(db_url).connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(ctx, Base.metadata) == []


def test_downgrade_to_base_and_back(db_url: str) -> None:
    init_db(db_url)
    cfg = alembic_config(db_url)
    engine = get_engine(db_url)
    command.downgrade(cfg, "base")
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    command.upgrade(cfg, "head")
    assert set(inspect(engine).get_table_names()) >= TABLES


def test_concurrent_init_db_is_safe(db_url: str) -> None:
    # Two workers starting at once on an empty database must not both create tables.
    run_together(3, lambda: init_db(db_url))
    assert set(inspect(get_engine(db_url)).get_table_names()) >= TABLES


def test_get_sessionmaker_is_cached_per_url(db_url: str) -> None:
    assert get_sessionmaker(db_url) is get_sessionmaker(db_url)
    assert get_engine(db_url) is get_engine(db_url)


def test_sqlite_engine_settings(tmp_path: Path) -> None:
    db = tmp_path / "a" / "b" / "keel.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 10_000
        assert db.exists()
    finally:
        engine.dispose()


# --- gate audit -------------------------------------------------------------------------


def test_gate_event_written_once_per_event_key(sm: sessionmaker[Session]) -> None:
    assert record_gate_event(sm, gate_event("run-1:7")) is True
    # A retry of the same activity, even with different content, keeps the first row.
    assert record_gate_event(sm, gate_event("run-1:7", comment="changed")) is False
    with sm() as s:
        assert s.scalar(select(func.count()).select_from(GateAuditRow)) == 1
    (stored,) = list_gate_events(sm, "design/p/ds1/gate/pre-codegen")
    assert stored.comment == "looks good"


def test_gate_events_round_trip_in_time_order(sm: sessionmaker[Session]) -> None:
    plus2 = timezone(timedelta(hours=2))
    later = gate_event(
        "r:2", event="comment", at=(T0 + timedelta(minutes=5)).astimezone(plus2), actor=None
    )
    first = gate_event("r:1", event="opened", details={"nested": {"a": [1, 2.5, None]}})
    same_time = gate_event("r:3", event="reminder", at=T0, request_id=None)
    other_gate = gate_event("r:4", gate_id="mrp/j1/gate/eval")
    for e in (later, first, same_time, other_gate):
        assert record_gate_event(sm, e)

    got = list_gate_events(sm, "design/p/ds1/gate/pre-codegen")
    assert got == [first, same_time, later]
    assert all(e.at.utcoffset() == timedelta(0) for e in got)
    assert got[2].at == T0 + timedelta(minutes=5)
    assert list_gate_events(sm, "mrp/j1/gate/eval") == [other_gate]
    assert list_gate_events(sm, "no/such/gate") == []


def test_gate_events_at_the_same_time_go_by_their_place_in_the_run(
    sm: sessionmaker[Session],
) -> None:
    # A gate starts each row's write where the row is made, so rows of one workflow task
    # (same time) can land in any order; "r:10" must also follow "r:9", not "r:1".
    rows = [gate_event(f"r:{n}", event="comment", at=T0) for n in (10, 2, 9, 1)]
    for e in rows:
        assert record_gate_event(sm, e)
    got = list_gate_events(sm, "design/p/ds1/gate/pre-codegen")
    assert [e.event_key for e in got] == ["r:1", "r:2", "r:9", "r:10"]


def test_gate_event_details_stored_as_json(sm: sessionmaker[Session]) -> None:
    record_gate_event(sm, gate_event("r:1", details={"when": T0, "ok": True}))
    (got,) = list_gate_events(sm, "design/p/ds1/gate/pre-codegen")
    assert got.details == {"when": "2026-01-02T03:04:05.123456Z", "ok": True}


def test_concurrent_duplicate_gate_events_write_one_row(sm: sessionmaker[Session]) -> None:
    results = run_together(4, lambda: record_gate_event(sm, gate_event("race:1")))
    assert sorted(results) == [False, False, False, True]
    assert len(list_gate_events(sm, "design/p/ds1/gate/pre-codegen")) == 1


def test_records_refuse_naive_datetimes() -> None:
    with pytest.raises(ValidationError):
        gate_event("k", at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        llm_call("k", created_at=datetime(2026, 1, 1))
    with pytest.raises(ValidationError):
        gate_event("k", event="deleted")


# --- LLM calls --------------------------------------------------------------------------


def test_llm_call_written_once_and_filtered(sm: sessionmaker[Session]) -> None:
    a = llm_call("wf-run:act-1:1")
    b = llm_call(
        "wf-run:act-1:2",
        status="error",
        error_code="RateLimitError",
        prompt_tokens=0,
        completion_tokens=0,
        total_tokens=0,
        cost_usd=None,
        created_at=T0 + timedelta(seconds=1),
    )
    c = llm_call("other:act-1:1", workflow_id=None, created_at=T0 + timedelta(seconds=2))
    assert [record_llm_call(sm, x) for x in (a, b, c)] == [True, True, True]
    assert record_llm_call(sm, a) is False
    with sm() as s:
        assert s.scalar(select(func.count()).select_from(LLMCallRow)) == 3

    assert list_llm_calls(sm) == [a, b, c]
    assert list_llm_calls(sm, workflow_id="rllm/app/blake3:00") == [a, b]
    assert list_llm_calls(sm, since=T0 + timedelta(seconds=1)) == [b, c]
    assert list_llm_calls(sm, limit=1) == [a]


# --- API idempotency --------------------------------------------------------------------


def test_idempotency_first_response_wins(sm: sessionmaker[Session]) -> None:
    assert get_idempotent(sm, "key-1", "alice") is None
    saved = save_idempotent(
        sm, "key-1", "alice", "POST", "/gates/x/approve", "blake3:aa", 202, {"ok": True}
    )
    assert (saved.status_code, saved.response_body, saved.body_digest) == (
        202,
        {"ok": True},
        "blake3:aa",
    )
    assert saved.created_at.tzinfo is not None
    assert get_idempotent(sm, "key-1", "alice") == saved

    again = save_idempotent(
        sm, "key-1", "alice", "POST", "/gates/x/approve", "blake3:bb", 500, None
    )
    assert again == saved

    # Keys are per caller: bob's key-1 is another request.
    bob = save_idempotent(sm, "key-1", "bob", "POST", "/gates/y/reject", "blake3:cc", 200, [1, 2])
    assert (bob.actor, bob.path, bob.response_body) == ("bob", "/gates/y/reject", [1, 2])
    assert get_idempotent(sm, "key-1", "alice") == saved


def test_concurrent_idempotent_saves_agree(sm: sessionmaker[Session]) -> None:
    counter = iter(range(100))
    lock = threading.Lock()

    def save() -> Any:
        with lock:
            n = next(counter)
        return save_idempotent(sm, "k", "alice", "POST", "/x", f"d{n}", 200 + n, {"n": n})

    results = run_together(4, save)
    assert all(r == results[0] for r in results)
    assert get_idempotent(sm, "k", "alice") == results[0]
