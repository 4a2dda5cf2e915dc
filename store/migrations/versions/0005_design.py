"""Design pipelines: projects, decision sets and their artifacts, agent runs, approvals,
cost estimates and events (plan §7).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24

Hand-written to run unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JSONB on PostgreSQL, JSON text elsewhere (same as store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _ts(name: str) -> sa.Column:  # type: ignore[type-arg]
    return sa.Column(name, sa.DateTime(timezone=True), nullable=False)


def upgrade() -> None:
    op.create_table(
        "projects",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("owner_id", sa.String(length=256), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_projects"),
    )
    op.create_table(
        "decision_sets",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("parent_id", sa.String(length=64), nullable=True),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("constraints_json", JSON_TYPE, nullable=False),
        sa.Column("plan_json", JSON_TYPE, nullable=True),
        sa.Column("summary_md", sa.Text(), nullable=False),
        sa.Column("persist_key", sa.String(length=80), nullable=False),
        _ts("created_at"),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("id", "project_id", name="pk_decision_sets"),
    )
    op.create_table(
        "artifacts",
        sa.Column("decision_set_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("path", sa.String(length=512), nullable=False),
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=True),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("decision_set_id", "project_id", "path", name="pk_artifacts"),
    )
    op.create_table(
        "agent_runs",
        sa.Column("idem_key", sa.String(length=100), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("decision_set_id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("input_digest", sa.String(length=80), nullable=False),
        sa.Column("output_json", JSON_TYPE, nullable=False),
        sa.Column("tokens_total", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Integer(), nullable=False),
        sa.Column("ok", sa.Boolean(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("idem_key", name="pk_agent_runs"),
    )
    op.create_index("ix_agent_runs_decision_set", "agent_runs", ["project_id", "decision_set_id"])
    op.create_table(
        "approvals",
        sa.Column("decision_set_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("gate", sa.String(length=128), nullable=False),
        sa.Column("actor", sa.String(length=256), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("comment", sa.Text(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("decision_set_id", "project_id", "gate", name="pk_approvals"),
    )
    op.create_table(
        "cost_estimates",
        sa.Column("decision_set_id", sa.String(length=64), nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("monthly_usd", sa.Float(), nullable=False),
        sa.Column("delta_vs_prev_usd", sa.Float(), nullable=True),
        sa.Column("breakdown_json", JSON_TYPE, nullable=False),
        sa.Column("method", sa.String(length=200), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("decision_set_id", "project_id", name="pk_cost_estimates"),
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("decision_set_id", sa.String(length=64), nullable=False),
        sa.Column("event_key", sa.String(length=200), nullable=False),
        sa.Column("type", sa.String(length=32), nullable=False),
        sa.Column("payload_json", JSON_TYPE, nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_events"),
        sa.UniqueConstraint("project_id", "decision_set_id", "event_key", name="uq_events_key"),
    )
    op.create_index("ix_events_decision_set", "events", ["project_id", "decision_set_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_events_decision_set", table_name="events")
    op.drop_table("events")
    op.drop_table("cost_estimates")
    op.drop_table("approvals")
    op.drop_index("ix_agent_runs_decision_set", table_name="agent_runs")
    op.drop_table("agent_runs")
    op.drop_table("artifacts")
    op.drop_table("decision_sets")
    op.drop_table("projects")
