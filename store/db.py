"""Engines, sessions and schema migrations for Keel's SQL store.

SQLite is the default (a file under the data directory); PostgreSQL works through a
``postgresql+psycopg://`` URL. The schema is owned by Alembic: ``init_db`` runs
``upgrade head`` in code, so no ``alembic.ini`` is needed at runtime.

The store is synchronous SQLAlchemy; async callers (activities, API routes) run it in
a thread (``asyncio.to_thread``).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

# Arbitrary constant shared by every Keel process: serialises concurrent migrations of
# one PostgreSQL database (two workers starting at once).
_PG_MIGRATION_LOCK_KEY = 0x6B65656C  # "keel"

SQLITE_BUSY_TIMEOUT_MS = 10_000

_lock = threading.Lock()
_engines: dict[str, Engine] = {}
_sessionmakers: dict[str, sessionmaker[Session]] = {}


def _is_sqlite(url: URL) -> bool:
    return url.get_backend_name() == "sqlite"


def _sqlite_file(url: URL) -> Path | None:
    """The database file of a SQLite URL, or None for in-memory databases."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    if url.query.get("mode") == "memory":
        return None
    return Path(database)


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers run while a writer commits; NORMAL sync is durable across
        # process crashes in WAL mode, and the busy timeout makes concurrent writers
        # (worker threads, API) wait for the lock instead of failing at once.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    finally:
        cursor.close()


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """Create a new engine for ``url`` (not cached; see ``get_engine``).

    For SQLite the parent directory of the database file is created and every
    connection gets WAL, foreign keys and a busy timeout. Extra ``kwargs`` go to
    ``sqlalchemy.create_engine``.
    """
    parsed = make_url(url)
    if _is_sqlite(parsed):
        path = _sqlite_file(parsed)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        # Room for every thread that may hold a connection at once (the worker's activity
        # threads and asyncio's default executor; the API's executor): with the default 5,
        # the rest opened a connection, ran the pragmas and closed it on every use.
        kwargs.setdefault("pool_size", 16)
        engine = create_engine(parsed, **kwargs)
        event.listen(engine, "connect", _set_sqlite_pragmas)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(parsed, **kwargs)


def get_engine(url: str | URL) -> Engine:
    """The process-wide engine for ``url``, created on first use and then reused."""
    key = make_url(url).render_as_string(hide_password=False)
    with _lock:
        engine = _engines.get(key)
        if engine is None:
            engine = make_engine(key)
            _engines[key] = engine
        return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory bound to ``engine``.

    ``expire_on_commit=False`` so objects read in a session stay usable after it ends.
    """
    return sessionmaker(bind=engine, expire_on_commit=False)


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic ``Config`` built in code, pointing at ``store/migrations``.

    Works from any working directory. ``url`` is only needed when the config is used
    without a connection in ``config.attributes["connection"]`` (then ``env.py`` falls
    back to it, or to ``KEEL_DATABASE_URL``).
    """
    # Imported here: alembic costs ~0.3 s to import and most callers never migrate.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # Config values go through configparser interpolation, so a literal '%'
        # (URL-encoded password) must be doubled.
        rendered = make_url(url).render_as_string(hide_password=False)
        cfg.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return cfg


def init_db(url: str | URL) -> None:
    """Bring the database at ``url`` to the newest schema (Alembic ``upgrade head``).

    Safe to call from several processes at once: the migration runs inside one
    transaction that first takes a lock (an advisory lock on PostgreSQL, the SQLite
    write lock), so the second caller finds the schema current and does nothing.
    """
    from alembic import command

    engine = get_engine(url)
    cfg = alembic_config()
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            # pysqlite would run DDL outside any transaction; an explicit
            # BEGIN IMMEDIATE takes the write lock and makes the migration atomic.
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif engine.dialect.name == "postgresql":
            conn.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK_KEY}
            )
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        conn.commit()
    log.info("database schema at head for %s", engine.url.render_as_string(hide_password=True))


def get_sessionmaker(url: str | URL, *, migrate: bool = True) -> sessionmaker[Session]:
    """The process-wide session factory for ``url``; what activities and routes call.

    On first use per URL (and per process) the schema is migrated to head unless
    ``migrate`` is False.
    """
    key = make_url(url).render_as_string(hide_password=False)
    with _lock:
        existing = _sessionmakers.get(key)
    if existing is not None:
        return existing
    if migrate:
        init_db(key)
    factory = make_sessionmaker(get_engine(key))
    with _lock:
        return _sessionmakers.setdefault(key, factory)


def dispose_engines() -> None:
    """Close every cached engine's connections and forget them (tests, shutdown)."""
    with _lock:
        engines = list(_engines.values())
        _engines.clear()
        _sessionmakers.clear()
    for engine in engines:
        engine.dispose()
