"""``.rllm`` run statistics: one row per finished app run, aggregated on read.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23

Hand-written to run unchanged on SQLite and PostgreSQL. ``schema_version`` in each row
is the record layout (``keel.rllm.stats.STATS_SCHEMA_VERSION``), so a later layout can
be told apart from this one without a migration of old rows.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "rllm_runs",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("run_key", sa.String(), nullable=False),
        sa.Column("workflow_id", sa.String(), nullable=False),
        sa.Column("app", sa.String(), nullable=False),
        sa.Column("app_version", sa.String(), nullable=False),
        sa.Column("model", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_type", sa.String(), nullable=True),
        sa.Column("input_valid", sa.Boolean(), nullable=True),
        sa.Column("output_valid", sa.Boolean(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("max_completion_tokens", sa.Integer(), nullable=False),
        sa.Column("llm_latency_ms", sa.Float(), nullable=False),
        sa.Column("total_latency_ms", sa.Float(), nullable=False),
        sa.Column("own_latency_ms", sa.Float(), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_rllm_runs"),
        sa.UniqueConstraint("run_key", name="uq_rllm_runs_run_key"),
    )
    op.create_index("ix_rllm_runs_app_model", "rllm_runs", ["app", "model"])


def downgrade() -> None:
    op.drop_index("ix_rllm_runs_app_model", table_name="rllm_runs")
    op.drop_table("rllm_runs")
