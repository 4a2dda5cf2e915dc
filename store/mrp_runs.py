"""MRP run records, per-shard status and the checkpoint index (tables from migration 0003).

Callers are Temporal activities (which may run more than once) and the ``mrp`` CLI and API
(``mrp inspect``), so every write is idempotent:

- ``mrp_runs``: one row per run, upserted by :func:`start_run` (after compile) and
  :func:`finish_run` (finalise).
- ``mrp_shards``: one row per (run, shard), upserted by :func:`record_shards` (a batch,
  one transaction; what map windows write). A row that already holds an output is never
  overwritten by a later attempt.
- ``mrp_checkpoints``: checkpoint key -> output digest, written for a run's computed
  shards when it ends (:func:`index_run_checkpoints`); the first writer wins, so a key
  never changes meaning.

A shard's output is named by its own digest everywhere; its bytes are either stored alone
under it or are a member of a window's pack (``pack_digest``, ``pack_offset``,
``pack_length`` on both tables, NULL for an output stored alone): :class:`StoredOutput`
says which, and :func:`read_output` reads either, verified against the shard's digest.

All functions are blocking (SQLAlchemy sync); async callers run them in a thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, NamedTuple, cast

from sqlalchemy import Table, case, func, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import Session, sessionmaker

from keel.mrp.run import (
    RunCost,
    RunManifest,
    RunRecord,
    ShardCounters,
    ShardRecord,
    run_manifest_from_json,
)
from store.artifacts import ArtifactStore, PackRef
from store.models import MrpCheckpointRow, MrpRunRow, MrpShardRow

# SQLite limits bound parameters per statement; IN lists are cut into chunks of this size.
_CHUNK = 500


def _now() -> datetime:
    return datetime.now(UTC)


def _upsert(
    session: Session,
    model: type[Any],
    values: dict[str, Any],
    keys: Sequence[str],
    update: dict[str, Any],
) -> None:
    table = cast(Table, model.__table__)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        pg = postgresql.insert(table).values(values)
        session.execute(pg.on_conflict_do_update(index_elements=list(keys), set_=update))
    elif dialect == "sqlite":
        sq = sqlite.insert(table).values(values)
        session.execute(sq.on_conflict_do_update(index_elements=list(keys), set_=update))
    else:  # pragma: no cover - Keel runs on SQLite and PostgreSQL
        row = session.get(model, tuple(values[k] for k in keys))
        if row is None:
            session.add(model(**values))
        else:
            for k, v in update.items():
                setattr(row, k, v)


# -- runs ----------------------------------------------------------------------------------


class RunIdTaken(ValueError):
    """The run id is already used by another workflow (run ids are unique across jobs)."""


def start_run(
    sm: sessionmaker[Session],
    *,
    run_id: str,
    workflow_id: str,
    job_id: str,
    backend: str,
    replay_of: str | None,
    ir_digest: str,
    manifest_digest: str,
    policy_report_digest: str,
    job_yaml_digest: str,
    shard_count: int,
    output_root: str | None,
) -> None:
    """Create (or, for a retried compile, refresh) the run's row with status ``running``.

    Raises :class:`RunIdTaken` when another workflow (another job) already used ``run_id``.
    """
    now = _now()
    values = {
        "run_id": run_id,
        "workflow_id": workflow_id,
        "job_id": job_id,
        "status": "running",
        "backend": backend,
        "replay_of": replay_of,
        "ir_digest": ir_digest,
        "manifest_digest": manifest_digest,
        "policy_report_digest": policy_report_digest,
        "job_yaml_digest": job_yaml_digest,
        "run_manifest_digest": None,
        "reduce_digest": None,
        "output_root": output_root,
        "shard_count": shard_count,
        "counters": ShardCounters(total=shard_count).model_dump(mode="json"),
        "cost": RunCost().model_dump(mode="json"),
        "phase_timings": {},
        "error": None,
        "created_at": now,
        "updated_at": now,
    }
    update = {k: v for k, v in values.items() if k not in ("run_id", "created_at")}
    with sm.begin() as session:
        existing = session.get(MrpRunRow, run_id)
        if existing is not None and existing.workflow_id != workflow_id:
            raise RunIdTaken(f"run id {run_id!r} is already used by {existing.workflow_id}")
        _upsert(session, MrpRunRow, values, ["run_id"], update)


def finish_run(sm: sessionmaker[Session], manifest: RunManifest, run_manifest_digest: str) -> None:
    """Write the run's end: status, run manifest digest, counters, cost, timings, error."""
    now = _now()
    values = {
        "run_id": manifest.run_id,
        "workflow_id": manifest.workflow_id,
        "job_id": manifest.job_id,
        "status": manifest.status,
        "backend": manifest.backend,
        "replay_of": manifest.replay_of,
        "ir_digest": manifest.ir_digest,
        "manifest_digest": manifest.manifest_digest,
        "policy_report_digest": manifest.policy_report_digest,
        "job_yaml_digest": manifest.job_yaml_digest,
        "run_manifest_digest": run_manifest_digest,
        "reduce_digest": manifest.reduce_digest,
        "output_root": manifest.output_root,
        "shard_count": len(manifest.shards),
        "counters": manifest.counters.model_dump(mode="json"),
        "cost": manifest.cost.model_dump(mode="json"),
        "phase_timings": dict(manifest.phase_timings),
        "error": manifest.error,
        "created_at": now,
        "updated_at": now,
    }
    update = {k: v for k, v in values.items() if k not in ("run_id", "created_at")}
    with sm.begin() as session:
        _upsert(session, MrpRunRow, values, ["run_id"], update)


def _run_record(row: MrpRunRow) -> RunRecord:
    return RunRecord.model_validate(row, from_attributes=True)


def get_run(sm: sessionmaker[Session], run_id: str) -> RunRecord | None:
    """The run's record, or None for an unknown run id."""
    with sm() as session:
        row = session.get(MrpRunRow, run_id)
        return _run_record(row) if row is not None else None


def list_runs(
    sm: sessionmaker[Session], *, job_id: str | None = None, limit: int = 50
) -> list[RunRecord]:
    """Runs, newest first, optionally of one job."""
    stmt = select(MrpRunRow).order_by(MrpRunRow.created_at.desc(), MrpRunRow.run_id)
    if job_id is not None:
        stmt = stmt.where(MrpRunRow.job_id == job_id)
    with sm() as session:
        return [_run_record(r) for r in session.scalars(stmt.limit(limit))]


def get_manifest(
    sm: sessionmaker[Session], store: ArtifactStore, run_id: str
) -> RunManifest | None:
    """The stored run manifest of a finished run (None while running or unknown)."""
    run = get_run(sm, run_id)
    if run is None or run.run_manifest_digest is None:
        return None
    return run_manifest_from_json(store.get_bytes(run.run_manifest_digest))


# -- shards --------------------------------------------------------------------------------


class StoredOutput(NamedTuple):
    """A shard output: its digest, and where its bytes lie when they are a pack member
    (``None``: stored alone under the digest)."""

    digest: str
    pack: PackRef | None = None

    @property
    def object_digest(self) -> str:
        """The stored object that holds the bytes (the pack, or the output itself)."""
        return self.pack.pack if self.pack is not None else self.digest


def read_output(store: ArtifactStore, output: StoredOutput) -> bytes:
    """The output's bytes, verified against its own digest (a pack member with one range
    read)."""
    if output.pack is None:
        return store.get_bytes(output.digest)
    return store.get_member(output.pack, output.digest)


def _pack_columns(ref: PackRef | None) -> dict[str, Any]:
    if ref is None:
        return {"pack_digest": None, "pack_offset": None, "pack_length": None}
    return {"pack_digest": ref.pack, "pack_offset": ref.offset, "pack_length": ref.length}


def _pack_of(row: Any) -> PackRef | None:
    if row.pack_digest is None:
        return None
    return PackRef(row.pack_digest, int(row.pack_offset), int(row.pack_length))


class _Bulk(NamedTuple):
    """A statement compiled once per dialect for the driver's ``executemany``: its SQL
    with positional placeholders, the column of each, and the bind processors of the
    columns that have one (the timestamps)."""

    sql: str
    columns: tuple[str, ...]
    processors: tuple[tuple[int, Any], ...]

    def params(self, rows: Iterable[Mapping[str, Any]]) -> list[tuple[Any, ...]]:
        out = []
        cols = self.columns
        procs = self.processors
        for row in rows:
            values = [row[c] for c in cols]
            for i, proc in procs:
                values[i] = proc(values[i])
            out.append(tuple(values))
        return out


_bulks: dict[str, _Bulk] = {}


def _bulk(dialect: Dialect) -> _Bulk:
    """The shard rows' upsert for ``dialect``, compiled once. The rows go to the driver's
    ``executemany`` as tuples: SQLAlchemy's per-row parameter processing was most of a
    flush's time (``record_shards``: 37.6 us a shard on SQLite, 100,000 shards in
    flushes of 256)."""
    found = _bulks.get(dialect.name)
    if found is not None:
        return found
    if dialect.name == "postgresql":
        positional: Dialect = postgresql.psycopg.dialect(paramstyle="format")
        insert: Any = postgresql.insert
    else:
        positional = sqlite.pysqlite.dialect(paramstyle="qmark")
        insert = sqlite.insert
    table = cast(Table, MrpShardRow.__table__)
    ins = insert(table)
    has_output = table.c.output_digest.isnot(None)

    def keep(col: str) -> Any:
        return case((has_output, table.c[col]), else_=ins.excluded[col])

    stmt = ins.on_conflict_do_update(
        index_elements=["run_id", "shard_index"],
        set_={
            "attempts": table.c.attempts + ins.excluded.attempts,
            "executions": table.c.executions + ins.excluded.executions,
            "output_digest": keep("output_digest"),
            "pack_digest": keep("pack_digest"),
            "pack_offset": keep("pack_offset"),
            "pack_length": keep("pack_length"),
            "state": keep("state"),
            "source": keep("source"),
            "latency_ms": keep("latency_ms"),
            "cost_units": keep("cost_units"),
            "cost_usd": keep("cost_usd"),
            "error": keep("error"),
            "updated_at": ins.excluded.updated_at,
        },
    )
    compiled = stmt.compile(dialect=positional, column_keys=[c.key for c in table.columns])
    columns = tuple(compiled.positiontup or ())
    processors = tuple(
        (i, proc)
        for i, name in enumerate(columns)
        if (proc := table.c[name].type.bind_processor(dialect)) is not None
    )
    found = _Bulk(str(compiled), columns, processors)
    _bulks[dialect.name] = found
    return found


def _executemany(session: Session, bulk: _Bulk, rows: Iterable[Mapping[str, Any]]) -> None:
    """``bulk`` for each of ``rows`` on the session's connection, in its transaction."""
    session.connection().exec_driver_sql(bulk.sql, bulk.params(rows))  # type: ignore[arg-type]


def record_shards(
    sm: sessionmaker[Session],
    records: Sequence[ShardRecord],
    *,
    packs: Mapping[int, PackRef] | None = None,
) -> None:
    """Upsert shard rows in one transaction, in one bulk statement whatever the batch's
    size (what map windows write). ``packs`` gives, by shard index, the place in a pack of
    an output that is a pack member. The checkpoint index gets the run's outputs when it
    ends (:func:`index_run_checkpoints`).

    ``executions`` and ``attempts`` add up over calls for the same (run, shard), so a
    window that is retried after a crash leaves the true totals. A row that already holds
    an output keeps it: a later call can only add counts.
    """
    if not records:
        return
    rows: list[dict[str, Any]] = []
    packs = packs or {}
    no_pack = _pack_columns(None)
    for record in records:
        values = dict(record.__dict__)
        values["cost_units"] = str(record.cost_units)
        values["cost_usd"] = str(record.cost_usd)
        ref = packs.get(record.shard_index) if record.output_digest is not None else None
        values.update(no_pack if ref is None else _pack_columns(ref))
        rows.append(values)
    with sm.begin() as session:
        _executemany(session, _bulk(session.get_bind().dialect), rows)


def index_run_checkpoints(sm: sessionmaker[Session], run_id: str, operator_digest: str) -> None:
    """Add the outputs ``run_id`` computed to the checkpoint index, in one statement, in
    key order (the first writer of a key wins).

    Map windows record their shards without indexing them (``record_shards``) and the
    run's finalise indexes them all at once: an insert
    lands on a page of its own in an index of random digests, so 256 at a time cost
    29.7 us a row against an index of 200,000 keys and 38.9 us against 1,000,000, where
    100,000 in key order cost 6.0 and 9.3 us (SQLite, measured here). A shard computed
    by this run is found by the next run once this one has ended; the run's own retries
    and a resumed window read its shard rows, not the index."""
    table = cast(Table, MrpCheckpointRow.__table__)
    shards = cast(Table, MrpShardRow.__table__).c
    with sm.begin() as session:
        dialect = session.get_bind().dialect
        insert: Any = postgresql.insert if dialect.name == "postgresql" else sqlite.insert
        rows = (
            select(
                shards.checkpoint_key,
                shards.output_digest,
                shards.pack_digest,
                shards.pack_offset,
                shards.pack_length,
                literal(operator_digest),
                shards.input_digest,
                shards.run_id,
                shards.updated_at,
            )
            .where(
                shards.run_id == run_id,
                shards.state == "succeeded",
                shards.source == "computed",
                shards.output_digest.isnot(None),
            )
            .order_by(shards.checkpoint_key)
        )
        stmt = (
            insert(table)
            .from_select(
                [
                    "checkpoint_key",
                    "output_digest",
                    "pack_digest",
                    "pack_offset",
                    "pack_length",
                    "operator_digest",
                    "input_digest",
                    "run_id",
                    "created_at",
                ],
                rows,
            )
            .on_conflict_do_nothing(index_elements=["checkpoint_key"])
        )
        session.execute(stmt)


def _shard_record(row: MrpShardRow) -> ShardRecord:
    return ShardRecord(
        run_id=row.run_id,
        shard_index=row.shard_index,
        shard_id=row.shard_id,
        input_digest=row.input_digest,
        checkpoint_key=row.checkpoint_key,
        output_digest=row.output_digest,
        state=row.state,  # type: ignore[arg-type]
        source=row.source,  # type: ignore[arg-type]
        attempts=row.attempts,
        executions=row.executions,
        latency_ms=row.latency_ms,
        cost_units=Decimal(row.cost_units),
        cost_usd=Decimal(row.cost_usd),
        error=row.error,
        updated_at=row.updated_at,
    )


def list_shards(
    sm: sessionmaker[Session],
    run_id: str,
    *,
    state: str | None = None,
    offset: int = 0,
    limit: int | None = None,
) -> list[ShardRecord]:
    """The run's shard rows in shard order (optionally one ``state``, paged)."""
    stmt = select(MrpShardRow).where(MrpShardRow.run_id == run_id)
    if state is not None:
        stmt = stmt.where(MrpShardRow.state == state)
    stmt = stmt.order_by(MrpShardRow.shard_index).offset(offset)
    if limit is not None:
        stmt = stmt.limit(limit)
    with sm() as session:
        return [_shard_record(r) for r in session.scalars(stmt)]


class ShardOutcome(NamedTuple):
    """What the run manifest says of a recorded shard (``shard_outcomes``)."""

    state: str
    source: str
    output_digest: str | None
    attempts: int
    error: str | None


def shard_outcomes(sm: sessionmaker[Session], run_id: str) -> dict[int, ShardOutcome]:
    """The run's recorded shards by index, as the run manifest lists them: the columns
    it needs, not whole rows (``list_shards``), which at 100,000 shards took seconds."""
    stmt = select(
        MrpShardRow.shard_index,
        MrpShardRow.state,
        MrpShardRow.source,
        MrpShardRow.output_digest,
        MrpShardRow.attempts,
        MrpShardRow.error,
    ).where(MrpShardRow.run_id == run_id)
    with sm() as session:
        return {
            r.shard_index: ShardOutcome(r.state, r.source, r.output_digest, r.attempts, r.error)
            for r in session.execute(stmt)
        }


def shard_counts(sm: sessionmaker[Session], run_id: str) -> dict[str, int]:
    """``{state: count}`` of the run's shard rows."""
    stmt = (
        select(MrpShardRow.state, func.count())
        .where(MrpShardRow.run_id == run_id)
        .group_by(MrpShardRow.state)
    )
    with sm() as session:
        return {state: int(n) for state, n in session.execute(stmt)}


def shards_with_output(
    sm: sessionmaker[Session], run_id: str, indexes: Iterable[int] | None = None
) -> dict[int, ShardRecord]:
    """The run's shard rows that hold an output, by shard index (optionally some only)."""
    base = select(MrpShardRow).where(
        MrpShardRow.run_id == run_id, MrpShardRow.output_digest.isnot(None)
    )
    out: dict[int, ShardRecord] = {}
    with sm() as session:
        if indexes is None:
            for row in session.scalars(base):
                out[row.shard_index] = _shard_record(row)
            return out
        wanted = sorted(set(indexes))
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            for row in session.scalars(base.where(MrpShardRow.shard_index.in_(chunk))):
                out[row.shard_index] = _shard_record(row)
    return out


def shard_outputs(
    sm: sessionmaker[Session], run_id: str, indexes: Iterable[int] | None = None
) -> dict[int, StoredOutput]:
    """The run's shard outputs (digest and place), by shard index (optionally some only)."""
    cols = (
        MrpShardRow.shard_index,
        MrpShardRow.output_digest,
        MrpShardRow.pack_digest,
        MrpShardRow.pack_offset,
        MrpShardRow.pack_length,
    )
    base = select(*cols).where(MrpShardRow.run_id == run_id, MrpShardRow.output_digest.isnot(None))
    out: dict[int, StoredOutput] = {}
    with sm() as session:
        if indexes is None:
            stmts = [base]
        else:
            wanted = sorted(set(indexes))
            stmts = [
                base.where(MrpShardRow.shard_index.in_(wanted[i : i + _CHUNK]))
                for i in range(0, len(wanted), _CHUNK)
            ]
        for stmt in stmts:
            for row in session.execute(stmt):
                out[row.shard_index] = StoredOutput(row.output_digest, _pack_of(row))
    return out


def shard_output(
    sm: sessionmaker[Session], store: ArtifactStore, run_id: str, shard_index: int
) -> bytes | None:
    """One shard's output bytes (verified against its digest), wherever they are stored;
    None when the shard has no output."""
    found = shard_outputs(sm, run_id, [shard_index]).get(shard_index)
    return read_output(store, found) if found is not None else None


def lookup_checkpoint_outputs(
    sm: sessionmaker[Session], keys: Iterable[str]
) -> dict[str, StoredOutput]:
    """``{checkpoint key: stored output}`` for the keys that are in the index."""
    wanted = sorted(set(keys))
    out: dict[str, StoredOutput] = {}
    ck = MrpCheckpointRow
    with sm() as session:
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            stmt = select(
                ck.checkpoint_key, ck.output_digest, ck.pack_digest, ck.pack_offset, ck.pack_length
            ).where(ck.checkpoint_key.in_(chunk))
            out.update(
                {
                    r.checkpoint_key: StoredOutput(r.output_digest, _pack_of(r))
                    for r in session.execute(stmt)
                }
            )
    return out


def lookup_checkpoints(sm: sessionmaker[Session], keys: Iterable[str]) -> dict[str, str]:
    """``{checkpoint key: output digest}`` for the keys that are in the index."""
    return {k: o.digest for k, o in lookup_checkpoint_outputs(sm, keys).items()}


__all__ = [
    "RunIdTaken",
    "StoredOutput",
    "finish_run",
    "get_manifest",
    "get_run",
    "list_runs",
    "list_shards",
    "lookup_checkpoint_outputs",
    "lookup_checkpoints",
    "read_output",
    "record_shards",
    "shard_counts",
    "shard_output",
    "shard_outputs",
    "shards_with_output",
    "start_run",
]
