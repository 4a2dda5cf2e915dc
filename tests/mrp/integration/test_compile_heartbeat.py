"""The compile activity heartbeats while it scans a job's inputs, each beat carrying how
far the scan has got, and ``mrp.compile`` has a heartbeat timeout (a worker lost in a
long scan is noticed after it, not after the 10-minute start-to-close).

The activity runs in Temporal's ``ActivityEnvironment`` (the SDK's own harness, which
records heartbeats) on the test MRP config and a real local store and SQLite file.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import activities.mrp.activities as mrp_activities
from activities.mrp.activities import MrpActivities
from keel.mrp.steps import CompileInput
from keel.settings import Settings
from tests.mrp.integration.test_records import records_job
from workflows.common import MRP_COMPILE_HEARTBEAT, OPTIONS

RECORDS = 100_000


async def test_compile_heartbeats_the_scan_progress(
    mrp_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    with (tmp_path / "data" / "sales.jsonl").open("w") as f:
        for i in range(RECORDS):
            f.write(json.dumps({"id": i, "amount": f"{i % 1000}.25"}) + "\n")
    text = records_job("rec-beat", "data/*.jsonl", "jsonl", records_per_shard=10_000)
    # Beat often, so the beats sent during the scan are many (the interval is the only
    # thing changed; the activity is the worker's own).
    monkeypatch.setattr(mrp_activities, "COMPILE_HEARTBEAT_EVERY_S", 0.01)
    beats: list[dict[str, Any]] = []
    env = ActivityEnvironment()
    env.on_heartbeat = lambda *details: beats.append(details[0])
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    compiled = await env.run(
        MrpActivities(mrp_settings).compile,
        CompileInput(
            job_yaml=text,
            base_dir=str(tmp_path),
            run_id=run_id,
            workflow_id=f"wf-{run_id}",
            backend="threads",
        ),
    )
    assert compiled.shard_count == RECORDS // 10_000
    assert beats[0] == {"files": 0, "records": 0, "shards": 0, "bytes": 0}
    # Beats during the scan carry its progress, and it only grows.
    scanning = [b for b in beats if 0 < b["records"] < RECORDS]
    assert scanning, beats[:5]
    print(f"{len(beats)} beats, {len(scanning)} during the scan")
    records = [b["records"] for b in beats]
    assert records == sorted(records) and set(beats[-1]) == {"files", "records", "shards", "bytes"}


def test_compile_has_a_heartbeat_timeout() -> None:
    options = OPTIONS["mrp.compile"]
    assert options.heartbeat == MRP_COMPILE_HEARTBEAT
    assert options.heartbeat is not None and options.heartbeat < options.start_to_close
