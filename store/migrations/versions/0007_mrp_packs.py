"""MRP window packs: a shard's output may be a member of its window's packed object.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

``mrp_shards`` and ``mrp_checkpoints`` gain the output's place in a pack (the pack's
digest, the member's offset and length). All three are NULL for an output stored alone,
as every row written before this revision is, so those read as before.

Hand-written to run unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("mrp_shards", "mrp_checkpoints")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("pack_digest", sa.String(), nullable=True))
            batch.add_column(sa.Column("pack_offset", sa.BigInteger(), nullable=True))
            batch.add_column(sa.Column("pack_length", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.drop_column("pack_length")
            batch.drop_column("pack_offset")
            batch.drop_column("pack_digest")
