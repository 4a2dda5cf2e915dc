"""store/mrp_runs.py on SQLite: run rows, shard rows that add up, a first-writer-wins index."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from keel.digest import digest_json
from keel.mrp.run import RunManifest, ShardOutputRecord, ShardRecord
from store.artifacts import LocalArtifactStore, PackRef
from store.db import init_db, make_engine, make_sessionmaker
from store.mrp_runs import (
    RunIdTaken,
    finish_run,
    get_manifest,
    get_run,
    index_run_checkpoints,
    list_runs,
    list_shards,
    lookup_checkpoint_outputs,
    lookup_checkpoints,
    record_shards,
    shard_counts,
    shards_with_output,
    start_run,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _sm(tmp_path: Path) -> sessionmaker[Session]:
    url = f"sqlite:///{tmp_path / 'keel.db'}"
    init_db(url)
    return make_sessionmaker(make_engine(url))


def _shard(i: int, **kw: object) -> ShardRecord:
    base: dict[str, object] = {
        "run_id": "r1",
        "shard_index": i,
        "shard_id": f"shard-{i:06d}",
        "input_digest": digest_json({"in": i}),
        "checkpoint_key": digest_json({"key": i}),
        "output_digest": digest_json({"out": i}),
        "state": "succeeded",
        "source": "computed",
        "attempts": 1,
        "executions": 1,
        "latency_ms": 1.5,
        "cost_units": Decimal("1.000000"),
        "updated_at": T0,
    }
    base.update(kw)
    return ShardRecord.model_validate(base)


def test_run_lifecycle_and_manifest(tmp_path: Path) -> None:
    sm = _sm(tmp_path)
    store = LocalArtifactStore(tmp_path / "artifacts")
    d = digest_json("x")
    start_run(
        sm,
        run_id="r1",
        workflow_id="mrp/job/r1",
        job_id="job",
        backend="threads",
        replay_of=None,
        ir_digest=d,
        manifest_digest=d,
        policy_report_digest=d,
        job_yaml_digest=d,
        shard_count=2,
        output_root="/tmp/out",
    )
    run = get_run(sm, "r1")
    assert run is not None and run.status == "running" and run.counters.total == 2
    assert get_manifest(sm, store, "r1") is None  # not finished
    manifest = RunManifest(
        run_id="r1",
        job_id="job",
        workflow_id="mrp/job/r1",
        status="succeeded",
        backend="threads",
        ir_digest=d,
        manifest_digest=d,
        policy_report_digest=d,
        job_yaml_digest=d,
        shards=[
            ShardOutputRecord(
                shard_index=0,
                shard_id="shard-000000",
                input_digest=d,
                checkpoint_key=d,
                output_digest=d,
            )
        ],
        reduce_digest=d,
    )
    digest = store.put_bytes(manifest.to_json())
    assert digest == manifest.digest()
    finish_run(sm, manifest, digest)
    run = get_run(sm, "r1")
    assert run is not None and run.status == "succeeded" and run.run_manifest_digest == digest
    assert get_manifest(sm, store, "r1") == manifest
    assert [r.run_id for r in list_runs(sm, job_id="job")] == ["r1"]
    assert get_run(sm, "nope") is None


def test_shard_rows_add_up_and_keep_their_output(sm: sessionmaker[Session]) -> None:
    """On SQLite, and on PostgreSQL where the suite has one (the rows go to the driver's
    executemany as tuples, each dialect's placeholders and timestamp processing)."""
    first = _shard(0)
    record_shards(sm, [first])
    # A later attempt of the same shard in the same run (a retried window) adds counts
    # but cannot replace the output that is already there.
    record_shards(
        sm,
        [_shard(0, output_digest=digest_json("other"), attempts=2, executions=1)],
    )
    record_shards(
        sm,
        [_shard(1, output_digest=None, state="failed", source="none", error="boom")],
    )
    rows = list_shards(sm, "r1")
    assert [(r.shard_index, r.state, r.attempts, r.executions) for r in rows] == [
        (0, "succeeded", 3, 2),
        (1, "failed", 1, 1),
    ]
    assert rows[0].output_digest == first.output_digest
    assert rows[0].cost_units == Decimal("1.000000")
    assert rows[0].updated_at == T0 and rows[0].updated_at.tzinfo is not None
    assert rows[1].error == "boom" and rows[1].output_digest is None
    assert shard_counts(sm, "r1") == {"succeeded": 1, "failed": 1}
    assert set(shards_with_output(sm, "r1")) == {0}
    assert set(shards_with_output(sm, "r1", [1])) == set()
    # Indexed at the run's end: the first output only, and nothing for the failed shard.
    index_run_checkpoints(sm, "r1", "op")
    assert lookup_checkpoints(sm, [first.checkpoint_key, _shard(1).checkpoint_key]) == {
        first.checkpoint_key: first.output_digest
    }


def test_record_shards_writes_a_batch_with_the_same_rules(sm: sessionmaker[Session]) -> None:
    record_shards(sm, [])  # nothing to write
    # One transaction: computed shards, a checkpoint-sourced one, a failure.
    record_shards(
        sm,
        [
            _shard(0),
            _shard(1, source="checkpoint", attempts=0, executions=0),
            _shard(2, output_digest=None, state="failed", source="none", error="x"),
        ],
    )
    # A retried window's batch adds counts and keeps outputs already there.
    record_shards(
        sm,
        [
            _shard(0, output_digest=digest_json("other"), attempts=2),
            _shard(3),
        ],
    )
    rows = list_shards(sm, "r1")
    assert [(r.shard_index, r.state, r.source, r.attempts, r.executions) for r in rows] == [
        (0, "succeeded", "computed", 3, 2),
        (1, "succeeded", "checkpoint", 0, 0),
        (2, "failed", "none", 1, 1),
        (3, "succeeded", "computed", 1, 1),
    ]
    assert rows[0].output_digest == _shard(0).output_digest
    assert rows[2].error == "x" and rows[0].cost_units == Decimal("1.000000")
    keys = [_shard(i).checkpoint_key for i in range(4)]
    index_run_checkpoints(sm, "r1", "op")  # the run's end: what it computed, first outputs
    assert lookup_checkpoints(sm, keys) == {
        keys[0]: _shard(0).output_digest,
        keys[3]: _shard(3).output_digest,
    }


def test_a_runs_end_indexes_what_it_computed_and_the_first_writer_wins(
    sm: sessionmaker[Session],
) -> None:
    """Windows record without indexing; ``index_run_checkpoints`` (the run's finalise)
    indexes its computed outputs, with their places in packs, in one statement: not a
    shard taken from a checkpoint, not a failure, not another run's, and not over an
    entry another run wrote first."""
    pack = PackRef(digest_json("pack"), 10, 20)
    record_shards(
        sm,
        [
            _shard(0),
            _shard(1, source="checkpoint", attempts=0, executions=0),
            _shard(2, output_digest=None, state="failed", source="none", error="x"),
            _shard(3),
            _shard(4, run_id="r0", output_digest=digest_json("r0")),
        ],
        packs={3: pack},
    )
    keys = [_shard(i).checkpoint_key for i in range(5)]
    assert lookup_checkpoints(sm, keys) == {}
    index_run_checkpoints(sm, "r0", "op")  # r0 ended first: its shard 4
    assert lookup_checkpoints(sm, keys) == {keys[4]: digest_json("r0")}
    index_run_checkpoints(sm, "r1", "op")
    assert lookup_checkpoints(sm, keys) == {
        keys[0]: _shard(0).output_digest,
        keys[3]: _shard(3).output_digest,
        keys[4]: digest_json("r0"),  # r0's own shard
    }
    found = lookup_checkpoint_outputs(sm, keys)
    assert found[keys[3]].pack == pack and found[keys[0]].pack is None
    index_run_checkpoints(sm, "r1", "op")  # a finalise retried changes nothing
    assert lookup_checkpoint_outputs(sm, keys) == found


def test_a_run_id_belongs_to_one_workflow(tmp_path: Path) -> None:
    sm = _sm(tmp_path)
    d = digest_json("x")
    kw: dict[str, Any] = {
        "run_id": "r1",
        "job_id": "job",
        "backend": "threads",
        "replay_of": None,
        "ir_digest": d,
        "manifest_digest": d,
        "policy_report_digest": d,
        "job_yaml_digest": d,
        "shard_count": 1,
        "output_root": None,
    }
    start_run(sm, workflow_id="mrp/job/r1", **kw)  # type: ignore[arg-type]
    start_run(sm, workflow_id="mrp/job/r1", **kw)  # a retried compile: fine
    with pytest.raises(RunIdTaken, match="mrp/job/r1"):
        start_run(sm, workflow_id="mrp/other/r1", **kw)  # type: ignore[arg-type]
