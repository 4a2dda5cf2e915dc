"""MRP jobs: run records, per-shard status and the checkpoint index.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Hand-written to run unchanged on SQLite and PostgreSQL. Amounts (``cost_units``,
``cost_usd``) are Decimal text with fixed places, so sums stay exact on every database.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "mrp_runs",
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("workflow_id", sa.String(), nullable=False),
        sa.Column("job_id", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("backend", sa.String(length=16), nullable=False),
        sa.Column("replay_of", sa.String(), nullable=True),
        sa.Column("ir_digest", sa.String(), nullable=True),
        sa.Column("manifest_digest", sa.String(), nullable=True),
        sa.Column("policy_report_digest", sa.String(), nullable=True),
        sa.Column("job_yaml_digest", sa.String(), nullable=True),
        sa.Column("run_manifest_digest", sa.String(), nullable=True),
        sa.Column("reduce_digest", sa.String(), nullable=True),
        sa.Column("output_root", sa.String(), nullable=True),
        sa.Column("shard_count", sa.Integer(), nullable=False),
        sa.Column("counters", JSON_TYPE, nullable=False),
        sa.Column("cost", JSON_TYPE, nullable=False),
        sa.Column("phase_timings", JSON_TYPE, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_mrp_runs"),
    )
    op.create_index("ix_mrp_runs_job_id", "mrp_runs", ["job_id"])

    op.create_table(
        "mrp_shards",
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("shard_index", sa.Integer(), nullable=False),
        sa.Column("shard_id", sa.String(), nullable=False),
        sa.Column("input_digest", sa.String(), nullable=False),
        sa.Column("checkpoint_key", sa.String(), nullable=False),
        sa.Column("output_digest", sa.String(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("executions", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("cost_units", sa.String(), nullable=False),
        sa.Column("cost_usd", sa.String(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", "shard_index", name="pk_mrp_shards"),
    )

    op.create_table(
        "mrp_checkpoints",
        sa.Column("checkpoint_key", sa.String(), nullable=False),
        sa.Column("output_digest", sa.String(), nullable=False),
        sa.Column("operator_digest", sa.String(), nullable=False),
        sa.Column("input_digest", sa.String(), nullable=False),
        sa.Column("run_id", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("checkpoint_key", name="pk_mrp_checkpoints"),
    )


def downgrade() -> None:
    op.drop_table("mrp_checkpoints")
    op.drop_table("mrp_shards")
    op.drop_index("ix_mrp_runs_job_id", table_name="mrp_runs")
    op.drop_table("mrp_runs")
