"""Persistence: SQL records (SQLAlchemy + Alembic) and the content-addressed artifact store."""
