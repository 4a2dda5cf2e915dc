"""The shard cap is checked while the inputs are scanned: a job whose records would make
more shards than ``caps.max_shards`` is refused at the slice that passes the cap, and the
scan stops there (``ScanProgress`` counts what it read), for JSONL, CSV and Parquet, and
across files. A job at the cap still compiles."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from activities.mrp.inputs import resolve_inputs
from activities.mrp.records import ScanProgress
from keel.mrp.dsl import InputsSpec
from keel.mrp.errors import InputsRefused
from keel.settings import Settings
from store.artifacts import LocalArtifactStore
from tests.mrp.unit.mrp_jobs import load_caps

RECORDS = 200_000


def resolve(base: Path, inputs: InputsSpec, max_shards: int, progress: ScanProgress) -> object:
    caps = load_caps().model_copy(update={"max_shards": max_shards})
    return resolve_inputs(
        inputs,
        base_dir=str(base),
        settings=Settings(),
        caps=caps,
        store=LocalArtifactStore(base / ".store"),
        base_path=base,
        progress=progress,
    )


def test_a_jsonl_job_over_the_cap_stops_scanning_at_the_cap(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with (data / "big.jsonl").open("w") as f:
        for i in range(RECORDS):
            f.write(json.dumps({"id": i, "text": "x" * 40}) + "\n")
    inputs = InputsSpec(files=["data/*.jsonl"], format="jsonl", records_per_shard=100)
    progress = ScanProgress()
    with pytest.raises(InputsRefused) as info:
        resolve(tmp_path, inputs, 5, progress)
    message = str(info.value)
    assert "MRP-P005" in message and "the cap is 5" in message
    assert "records_per_shard 100" in message and "data/big.jsonl record 501" in message
    # The sixth shard's first record refused the job: 501 of 200,000 records were read
    # (the 501st is read, not counted), and only their bytes (the file is hashed as the
    # scan reads it, not in a pass of its own before).
    size = (data / "big.jsonl").stat().st_size
    with (data / "big.jsonl").open("rb") as f:
        first_501 = sum(len(next(f)) for _ in range(501))
    assert progress.records == 500 and progress.shards == 6
    assert progress.heartbeat() == {"files": 1, "records": 500, "shards": 6, "bytes": first_501}
    assert progress.bytes < size / 300


def test_the_cap_counts_shards_over_all_files_and_formats(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(30)))
    (data / "b.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(30_000)))
    csv = InputsSpec(files=["data/*.csv"], format="csv", records_per_shard=10)
    progress = ScanProgress()
    with pytest.raises(
        InputsRefused, match=r"the cap is 4; the scan stopped at data/b.csv record 11"
    ):
        resolve(tmp_path, csv, 4, progress)
    assert progress.files == 2 and progress.records == 40

    # At the cap a job compiles: 3 + 1 shards under a cap of 4.
    (data / "b.csv").write_text("id\n" + "".join(f"{i}\n" for i in range(10)))
    progress = ScanProgress()
    resolved = resolve(tmp_path, csv, 4, progress)
    assert len(resolved.slices or []) == 4  # type: ignore[attr-defined]
    assert progress.heartbeat() == {
        "files": 2,
        "records": 40,
        "shards": 4,
        "bytes": 3 + 80 + 3 + 20,
    }

    pq.write_table(pa.table({"id": list(range(50_000))}), data / "c.parquet", row_group_size=1_000)
    parquet = InputsSpec(files=["data/*.parquet"], format="parquet", records_per_shard=100)
    progress = ScanProgress()
    with pytest.raises(InputsRefused, match=r"MRP-P005 .* the cap is 3; .*c.parquet record 301"):
        resolve(tmp_path, parquet, 3, progress)
    assert progress.records == 300
