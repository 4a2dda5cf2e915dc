"""What an MRP run costs per shard in stored objects, SQL rows and bytes (issue 40 §2).

    uv run python bench/mrp_footprint.py [--shards 2000] [--window 1000] [--distinct]

Runs one ``MRPJob`` of ``--shards`` one-word shards (``word-count`` -> ``numeric-sum`` ->
``json-writer``, threads backend) on a dev server and an in-process worker, everything
in a temp dir on loopback (the dev server stopped by its PID at the end), then counts:

- objects in the artifact store (files of the local store) and their bytes;
- rows the run left in ``mrp_shards`` and ``mrp_checkpoints`` (the other MRP tables hold
  one row per run);
- the bytes of the run's IR and manifest (the compile's two per-job documents);

each in all and per shard, with the run's wall time. The store is content-addressed: the
one-word shards' outputs are mostly equal (``{"items": 1, "words": 1, "chars": 4}``), so
they add a handful of objects, and the count is about one object (the shard's input) per
shard; a job whose outputs all differ stores one more per shard. ``--distinct`` runs
such a job: one number per shard (``amount-stats`` -> ``numeric-sum``), every shard's
output different. S3 requests are not counted (the local store).

Measured here (2 cores shared, 2026-12-06, before any packing): 2,000 shards, window
1,000: 27.525 s; 2,011 objects (1.006 per shard), 1,764,213 bytes; 2,000 shard rows +
2,000 checkpoint rows (2.000 per shard); IR 791,084 B (395.542 B per shard); manifest
189,571 B (94.785 B per shard). Issue 40 §2 asks for one packed
object and one bulk insert per window and a manifest/IR that grow by at most tens of
bytes per shard; this prints where a run stands against that (``... per shard``). It
measures no ratio against a baseline: run it before and after a storage change, on the
same machine, and compare the per-shard lines.

Measured here (2 cores shared by several sessions, 2026-12-06), this file run on the tree
before and after window packs (outputs packed per flush, activities/mrp/window.py), 2,000
shards, window 1,000: default job, before 2,011 objects (1.006 per shard), after 2,013
(1.006: its outputs are nearly all equal); ``--distinct``, before 4,007 objects (2.003 per
shard), after 2,061 (1.030: the 2,000 output objects became one pack per flush). Rows stay
2.000 per shard (a shard row and a checkpoint row); IR and manifest bytes per shard
unchanged (395.542 / 94.785 B default). The INSERT statements (counted since) were one
per table per flush before and after (an executemany of the flush's rows): a second pair
of ``--distinct`` runs gave before 108 + 108 statements (0.108 per shard, 4,007 objects),
after 58 + 58 (0.058, 2,065 objects, about one pack per flush); how many flushes a window
makes depends on timing (every 0.25 s or 64 records), so that count varies run to run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from pathlib import Path

import yaml
from sqlalchemy import event, func, select
from sqlalchemy.engine import Engine

from bench.harness import bench_settings, bench_worker, dev_server
from bench.mrp_history import job
from client.temporal import connect
from keel.mrp.run import MRPJobInput, workflow_id_for
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.models import MrpCheckpointRow, MrpShardRow
from tests.support.mrp_operators import TEST_CONFIG
from workflows.mrp import MRPJob


def config_for(path: Path, shards: int) -> Path:
    """The test MRP config with caps that admit ``shards`` (operator paths absolute)."""
    cfg = yaml.safe_load(TEST_CONFIG.read_text())
    cfg["operator_paths"] = [str((TEST_CONFIG.parent / p).resolve()) for p in cfg["operator_paths"]]
    cfg["caps"]["max_shards"] = max(shards, cfg["caps"]["max_shards"])
    cfg["caps"]["max_budget_units"] = str(max(10 * shards, 1_000_000))
    path.write_text(yaml.safe_dump(cfg))
    return path


def distinct_job(job_id: str, shards: int, max_workers: int = 8) -> str:
    """A job of one number per shard whose shard outputs all differ."""
    items = json.dumps([{"amount": i} for i in range(shards)])
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {items}
  by: item
map:
  operator: amount-stats@1.0.0
  params: {{field: amount}}
reduce:
  operator: numeric-sum@1.0.0
  params: {{fields: [count, sum]}}
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: {max_workers}
  budget_units: "1000000"
"""


def count_inserts() -> dict[str, int]:
    """INSERT statements this process sends, by table (every engine; an executemany of
    many rows is one)."""
    counts: dict[str, int] = {}

    @event.listens_for(Engine, "before_cursor_execute")
    def _count(conn: object, cursor: object, statement: str, *args: object) -> None:
        words = statement.split(None, 3)
        if len(words) >= 3 and words[0].upper() == "INSERT":
            table = words[2].split("(")[0].strip('"')
            counts[table] = counts.get(table, 0) + 1

    return counts


async def main(shards: int, window: int, distinct: bool = False) -> None:
    inserts = count_inserts()
    with dev_server("keel-mrp-footprint-") as (server, tmp):
        settings = bench_settings(
            server, tmp, mrp_config=config_for(tmp / "mrp.yaml", shards), metrics_port=0
        )
        client = await connect(settings)
        run_id = f"fp-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        async with bench_worker(client, settings):
            result = await client.execute_workflow(
                MRPJob.run,
                MRPJobInput(
                    job_yaml=(distinct_job if distinct else job)(
                        "footprint", shards, max_workers=8
                    ),
                    backend="threads",
                    window_size=window,
                    run_id=run_id,
                ),
                id=workflow_id_for("footprint", run_id),
                task_queue=settings.task_queue,
            )
        wall = time.monotonic() - started
        assert result.status == "succeeded", result
        assert result.ir_digest and result.manifest_digest
        store = artifact_store_from_settings(settings)
        files = [p for p in settings.artifacts_dir.rglob("*") if p.is_file()]
        stored = sum(p.stat().st_size for p in files)
        ir_bytes = len(store.get_bytes(result.ir_digest))
        manifest_bytes = len(store.get_bytes(result.manifest_digest))
        sessions = get_sessionmaker(settings.resolved_database_url)
        with sessions() as s:
            shard_rows = s.scalar(
                select(func.count()).select_from(MrpShardRow).where(MrpShardRow.run_id == run_id)
            )
            checkpoint_rows = s.scalar(select(func.count()).select_from(MrpCheckpointRow))
    n = shards
    print(f"shards {n}  window {window}  distinct {distinct}  wall {wall:.3f} s")
    print(f"objects {len(files)}  per shard {len(files) / n:.3f}  bytes {stored}")
    print(f"sql rows shards {shard_rows} + checkpoints {checkpoint_rows}  per shard "
          f"{((shard_rows or 0) + (checkpoint_rows or 0)) / n:.3f}")  # fmt: skip
    stmts = inserts.get("mrp_shards", 0) + inserts.get("mrp_checkpoints", 0)
    print(f"insert statements mrp_shards {inserts.get('mrp_shards', 0)} + mrp_checkpoints "
          f"{inserts.get('mrp_checkpoints', 0)}  per shard {stmts / n:.3f}")  # fmt: skip
    print(f"ir {ir_bytes} B  per shard {ir_bytes / n:.3f} B")
    print(f"manifest {manifest_bytes} B  per shard {manifest_bytes / n:.3f} B")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=2000)
    parser.add_argument("--window", type=int, default=1000, help="shards per map window")
    parser.add_argument(
        "--distinct", action="store_true", help="a job whose shard outputs all differ"
    )
    args = parser.parse_args()
    asyncio.run(main(args.shards, args.window, args.distinct))
