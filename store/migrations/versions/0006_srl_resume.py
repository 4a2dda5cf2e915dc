"""SRL collections that resume: each collection's identity, and the sample and seed of
each step.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27

Hand-written to run unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "srl_collections",
        sa.Column("collection", sa.String(length=128), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("tasks_digest", sa.String(length=80), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("top_p", sa.Float(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("collection", name="pk_srl_collections"),
    )
    with op.batch_alter_table("srl_steps") as batch:
        batch.add_column(sa.Column("sample", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("seed", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("srl_steps") as batch:
        batch.drop_column("seed")
        batch.drop_column("sample")
    op.drop_table("srl_collections")
