"""Alembic environment for Keel's SQL store.

Three ways in, in order of preference:
- ``store.db.init_db`` passes an open connection in ``config.attributes["connection"]``
  (it already holds the migration lock and owns the transaction);
- ``sqlalchemy.url`` in the config (``alembic -c store/alembic.ini -x url=...``, or
  ``store.db.alembic_config(url)``);
- otherwise ``KEEL_DATABASE_URL`` / the default SQLite file, through ``keel.settings``.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from keel.settings import Settings
from store.db import make_engine
from store.models import Base

config = context.config
# Only the alembic CLI has an ini file; in-process callers keep their own logging.
if config.config_file_name is not None:
    fileConfig(config.config_file_name, disable_existing_loggers=False)
target_metadata = Base.metadata


def _url() -> str:
    x_url = context.get_x_argument(as_dictionary=True).get("url")
    if x_url:
        return x_url
    configured = config.get_main_option("sqlalchemy.url")
    if configured:
        return configured
    return Settings().resolved_database_url


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    context.configure(
        connection=connection,
        url=url,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        render_as_batch=True,
        compare_type=True,
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    """Emit SQL to stdout (``alembic upgrade head --sql``)."""
    _configure(url=_url())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run migrations against a live database."""
    given = config.attributes.get("connection")
    if given is not None:
        _configure(connection=given)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _configure(connection=connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
