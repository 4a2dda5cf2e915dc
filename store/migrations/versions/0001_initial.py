"""Initial schema: gate audit trail, LLM call log, API idempotency records.

Revision ID: 0001
Revises:
Create Date: 2026-11-22

Hand-written to run unchanged on SQLite and PostgreSQL.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# JSONB on PostgreSQL, JSON text elsewhere (same as store.models.JSONType).
JSON_TYPE = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "gate_audit",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("gate_id", sa.String(), nullable=False),
        sa.Column("gate_name", sa.String(), nullable=False),
        sa.Column("event", sa.String(length=32), nullable=False),
        sa.Column("actor", sa.String(), nullable=True),
        sa.Column("comment", sa.Text(), nullable=False),
        sa.Column("request_id", sa.String(), nullable=True),
        sa.Column("event_key", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("details", JSON_TYPE, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_gate_audit"),
        sa.UniqueConstraint("event_key", name="uq_gate_audit_event_key"),
    )
    op.create_index("ix_gate_audit_gate_id", "gate_audit", ["gate_id"])

    op.create_table(
        "llm_calls",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("call_key", sa.String(), nullable=False),
        sa.Column("workflow_id", sa.String(), nullable=True),
        sa.Column("model_name", sa.String(), nullable=False),
        sa.Column("litellm_model", sa.String(), nullable=False),
        sa.Column("provider", sa.String(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("error_code", sa.String(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("completion_tokens", sa.Integer(), nullable=False),
        sa.Column("total_tokens", sa.Integer(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_llm_calls"),
        sa.UniqueConstraint("call_key", name="uq_llm_calls_call_key"),
    )
    op.create_index("ix_llm_calls_workflow_id", "llm_calls", ["workflow_id"])
    op.create_index("ix_llm_calls_created_at", "llm_calls", ["created_at"])

    op.create_table(
        "api_idempotency",
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("body_digest", sa.String(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=False),
        sa.Column("response_body", JSON_TYPE, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", "actor", name="pk_api_idempotency"),
    )


def downgrade() -> None:
    op.drop_table("api_idempotency")
    op.drop_index("ix_llm_calls_created_at", table_name="llm_calls")
    op.drop_index("ix_llm_calls_workflow_id", table_name="llm_calls")
    op.drop_table("llm_calls")
    op.drop_index("ix_gate_audit_gate_id", table_name="gate_audit")
    op.drop_table("gate_audit")
