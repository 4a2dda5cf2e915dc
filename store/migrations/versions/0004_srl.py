"""SRL steps: one row per collected step.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24

Hand-written to run unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "srl_steps",
        sa.Column("collection", sa.String(length=128), nullable=False),
        sa.Column("step_key", sa.String(length=160), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("language", sa.String(length=32), nullable=False),
        sa.Column("template", sa.String(length=64), nullable=True),
        sa.Column("format_ok", sa.Boolean(), nullable=False),
        sa.Column("verified", sa.Boolean(), nullable=True),
        sa.Column("tests_passed", sa.Float(), nullable=True),
        sa.Column("diff_lines", sa.Integer(), nullable=True),
        sa.Column("step_similarity", sa.Float(), nullable=True),
        sa.Column("reward_total", sa.Float(), nullable=True),
        sa.Column("record_json", sa.Text(), nullable=False),
        sa.Column("record_digest", sa.String(length=80), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("collection", "step_key", name="pk_srl_steps"),
    )
    op.create_index("ix_srl_steps_collection_task", "srl_steps", ["collection", "task_id"])


def downgrade() -> None:
    op.drop_index("ix_srl_steps_collection_task", table_name="srl_steps")
    op.drop_table("srl_steps")
