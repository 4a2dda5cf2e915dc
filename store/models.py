"""SQLAlchemy models of Keel's tables.

The schema itself is created by the Alembic migrations in ``store/migrations``; these
classes must stay in step with them (``tests/core/unit/test_store.py`` compares the two).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# JSONB on PostgreSQL (indexable, compact), plain JSON text elsewhere.
JSONType = JSON().with_variant(JSONB(), "postgresql")


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored
    as naive UTC and the zone is put back on read. Naive datetimes are refused on write
    because their meaning depends on the writer's local clock.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: store timezone-aware datetimes only")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every Keel table."""

    # Explicit constraint names, identical on every database, so later migrations can
    # drop or alter them by name (the migrations use the same names).
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(table_name)s_%(column_0_name)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class GateAuditRow(Base):
    """One row of a gate's audit trail (see ``keel.records.GateAuditEvent``)."""

    __tablename__ = "gate_audit"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    gate_id: Mapped[str] = mapped_column(String, index=True)
    gate_name: Mapped[str] = mapped_column(String)
    event: Mapped[str] = mapped_column(String(32))
    actor: Mapped[str | None] = mapped_column(String, nullable=True)
    comment: Mapped[str] = mapped_column(Text, default="")
    request_id: Mapped[str | None] = mapped_column(String, nullable=True)
    event_key: Mapped[str] = mapped_column(String, unique=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    details: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)


class LLMCallRow(Base):
    """Usage and outcome of one LLM call (see ``keel.records.LLMCallLog``)."""

    __tablename__ = "llm_calls"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    call_key: Mapped[str] = mapped_column(String, unique=True)
    workflow_id: Mapped[str | None] = mapped_column(String, nullable=True, index=True)
    model_name: Mapped[str] = mapped_column(String)
    litellm_model: Mapped[str] = mapped_column(String)
    provider: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16))
    error_code: Mapped[str | None] = mapped_column(String, nullable=True)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    total_tokens: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float)
    cost_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class ApiIdempotencyRow(Base):
    """The stored response of an API request made with an ``Idempotency-Key``.

    The key is scoped to the caller: two actors may use the same key independently.
    """

    __tablename__ = "api_idempotency"

    key: Mapped[str] = mapped_column(String, primary_key=True)
    actor: Mapped[str] = mapped_column(String, primary_key=True)
    method: Mapped[str] = mapped_column(String(16))
    path: Mapped[str] = mapped_column(String)
    body_digest: Mapped[str] = mapped_column(String)
    status_code: Mapped[int] = mapped_column(Integer)
    response_body: Mapped[Any] = mapped_column(JSONType, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class RllmRunRow(Base):
    """One finished ``.rllm`` app run (see ``keel.rllm.stats.RllmRunRecord``).

    Stats are aggregated from these rows on read; ``schema_version`` is the record
    layout version (``keel.rllm.stats.STATS_SCHEMA_VERSION``) the row was written with.
    """

    __tablename__ = "rllm_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_key: Mapped[str] = mapped_column(String, unique=True)
    workflow_id: Mapped[str] = mapped_column(String, default="")
    app: Mapped[str] = mapped_column(String)
    app_version: Mapped[str] = mapped_column(String)
    model: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String(16))
    error_type: Mapped[str | None] = mapped_column(String, nullable=True)
    input_valid: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    output_valid: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    retries: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    total_tokens: Mapped[int] = mapped_column(Integer, default=0)
    max_completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    llm_latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    total_latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    own_latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    schema_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_rllm_runs_app_model", "app", "model"),)


class MrpRunRow(Base):
    """One MRP run (``MRPJob`` workflow): status, digests, counters, cost, timings.

    Written when compile finishes (status ``running``) and again by finalise; see
    ``store/mrp_runs.py``. Amounts inside ``cost`` are Decimal text.
    """

    __tablename__ = "mrp_runs"

    run_id: Mapped[str] = mapped_column(String, primary_key=True)
    workflow_id: Mapped[str] = mapped_column(String)
    job_id: Mapped[str] = mapped_column(String, index=True)
    status: Mapped[str] = mapped_column(String(32))
    backend: Mapped[str] = mapped_column(String(16))
    replay_of: Mapped[str | None] = mapped_column(String, nullable=True)
    ir_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    manifest_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    policy_report_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    job_yaml_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    run_manifest_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    reduce_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    output_root: Mapped[str | None] = mapped_column(String, nullable=True)
    shard_count: Mapped[int] = mapped_column(Integer, default=0)
    counters: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    cost: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    phase_timings: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class MrpShardRow(Base):
    """One map shard of one run: where its output came from and what it cost."""

    __tablename__ = "mrp_shards"

    run_id: Mapped[str] = mapped_column(String, primary_key=True)
    shard_index: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    shard_id: Mapped[str] = mapped_column(String)
    input_digest: Mapped[str] = mapped_column(String)
    checkpoint_key: Mapped[str] = mapped_column(String)
    output_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    # Where the output's bytes lie when they are a member of a window's pack (migration
    # 0007); NULL: stored alone under ``output_digest``.
    pack_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    pack_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pack_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    source: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    executions: Mapped[int] = mapped_column(Integer, default=0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cost_units: Mapped[str] = mapped_column(String, default="0")
    cost_usd: Mapped[str] = mapped_column(String, default="0")
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class MrpCheckpointRow(Base):
    """The checkpoint index: a map shard's checkpoint key -> its stored output digest."""

    __tablename__ = "mrp_checkpoints"

    checkpoint_key: Mapped[str] = mapped_column(String, primary_key=True)
    output_digest: Mapped[str] = mapped_column(String)
    # The output's place in a pack, as on ``mrp_shards`` (NULL: stored alone).
    pack_digest: Mapped[str | None] = mapped_column(String, nullable=True)
    pack_offset: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    pack_length: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    operator_digest: Mapped[str] = mapped_column(String)
    input_digest: Mapped[str] = mapped_column(String)
    run_id: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class SrlStepRow(Base):
    """One SRL step (``keel.srl.trajectory.StepRow``): flat reward columns for reports and
    export, and the whole §7 record as canonical JSON with its BLAKE3 digest.

    The key is (collection, ``<task_id>#<step>``): a retried or replayed step is one row.
    """

    __tablename__ = "srl_steps"

    collection: Mapped[str] = mapped_column(String(128), primary_key=True)
    step_key: Mapped[str] = mapped_column(String(160), primary_key=True)
    schema_version: Mapped[int] = mapped_column(Integer)
    task_id: Mapped[str] = mapped_column(String(128))
    step: Mapped[int] = mapped_column(Integer)
    source: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    language: Mapped[str] = mapped_column(String(32))
    template: Mapped[str | None] = mapped_column(String(64), nullable=True)
    format_ok: Mapped[bool] = mapped_column(Boolean)
    verified: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    tests_passed: Mapped[float | None] = mapped_column(Float, nullable=True)
    diff_lines: Mapped[int | None] = mapped_column(Integer, nullable=True)
    step_similarity: Mapped[float | None] = mapped_column(Float, nullable=True)
    reward_total: Mapped[float | None] = mapped_column(Float, nullable=True)
    record_json: Mapped[str] = mapped_column(Text)
    record_digest: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    sample: Mapped[int] = mapped_column(Integer, server_default="0")
    seed: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (Index("ix_srl_steps_collection_task", "collection", "task_id"),)


class SrlCollectionRow(Base):
    """What an SRL collection's steps were drawn with (``keel.srl.steps.CollectionIdentity``),
    written by its first run: a later run under the same id must name the same."""

    __tablename__ = "srl_collections"

    collection: Mapped[str] = mapped_column(String(128), primary_key=True)
    source: Mapped[str] = mapped_column(String(16))
    model: Mapped[str] = mapped_column(String(200))
    tasks_digest: Mapped[str] = mapped_column(String(80))
    temperature: Mapped[float] = mapped_column(Float)
    top_p: Mapped[float] = mapped_column(Float)
    max_tokens: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


# --- design pipelines (plan §7; docs/design.md "Store") ---------------------------------


class DesignProjectRow(Base):
    """A design project: the owner of its decision sets."""

    __tablename__ = "projects"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    owner_id: Mapped[str] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DecisionSetRow(Base):
    """One decision set; ``version`` is its optimistic lock (every update bumps it and
    names the version it read)."""

    __tablename__ = "decision_sets"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    parent_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    version: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(32))
    constraints_json: Mapped[Any] = mapped_column(JSONType)
    plan_json: Mapped[Any | None] = mapped_column(JSONType, nullable=True)
    summary_md: Mapped[str] = mapped_column(Text)
    persist_key: Mapped[str] = mapped_column(String(80))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DesignArtifactRow(Base):
    """A file of a decision set's repository (or its archive, ``kind='archive'``)."""

    __tablename__ = "artifacts"

    decision_set_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    path: Mapped[str] = mapped_column(String(512), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80))
    kind: Mapped[str] = mapped_column(String(16))
    size_bytes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class AgentRunRow(Base):
    """One node's run, keyed by its idempotency key (§21.3)."""

    __tablename__ = "agent_runs"

    idem_key: Mapped[str] = mapped_column(String(100), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64))
    decision_set_id: Mapped[str] = mapped_column(String(64))
    agent: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(200))
    input_digest: Mapped[str] = mapped_column(String(80))
    output_json: Mapped[Any] = mapped_column(JSONType)
    tokens_total: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[int] = mapped_column(Integer)
    ok: Mapped[bool] = mapped_column(Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_agent_runs_decision_set", "project_id", "decision_set_id"),)


class ApprovalRow(Base):
    __tablename__ = "approvals"

    decision_set_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    gate: Mapped[str] = mapped_column(String(128), primary_key=True)
    actor: Mapped[str] = mapped_column(String(256))
    status: Mapped[str] = mapped_column(String(16))
    comment: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class CostEstimateRow(Base):
    __tablename__ = "cost_estimates"

    decision_set_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    project_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    monthly_usd: Mapped[float] = mapped_column(Float)
    delta_vs_prev_usd: Mapped[float | None] = mapped_column(Float, nullable=True)
    breakdown_json: Mapped[Any] = mapped_column(JSONType)
    method: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class DesignEventRow(Base):
    """Every material change of a decision set, in order; ``event_key`` makes a retried
    write land once."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    project_id: Mapped[str] = mapped_column(String(64))
    decision_set_id: Mapped[str] = mapped_column(String(64))
    event_key: Mapped[str] = mapped_column(String(200))
    type: Mapped[str] = mapped_column(String(32))
    payload_json: Mapped[Any] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("project_id", "decision_set_id", "event_key", name="uq_events_key"),
        Index("ix_events_decision_set", "project_id", "decision_set_id", "id"),
    )
