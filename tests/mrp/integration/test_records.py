"""Record-sharded inputs end to end (issue 27): ``MRPJob`` over JSONL, Parquet and CSV
files cut into shards of records, on the real dev server with threads and local Ray, and
``s3://`` inputs read from a real SeaweedFS server.

Input files are generated here, in tmp. The operators are cheap (``amount-stats`` per
shard, ``numeric-sum``, ``json-writer``), so a 100,000-record job takes seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import SecretStr
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from keel.mrp.ir import ir_from_json
from keel.mrp.run import ERROR_COMPILE, ERROR_SHARD, MRPJobInput, MRPJobResult
from keel.settings import Settings
from store.artifacts import PackRef, artifact_store_from_settings
from store.db import get_sessionmaker
from store.mrp_runs import get_manifest
from tests.support.mrp_jobs import run_job
from tests.support.seaweed import SeaweedS3, seaweed_s3
from workers.main import build_worker

pytestmark = pytest.mark.usefixtures("ray_for_module")

REPO = Path(__file__).resolve().parents[3]
INPUT_BUCKET = "keel-mrp-inputs"  # the test config's allowed_input_prefixes


def records_job(job_id: str, files: str, fmt: str, *, extra: str = "", **inputs: Any) -> str:
    keys = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in inputs.items())
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  files: {json.dumps([files])}
  format: {fmt}{keys}
map:
  operator: amount-stats@1.0.0
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: 2
  budget_units: "1000"
{extra}
"""


def produced(result: MRPJobResult, job_id: str) -> dict[str, Any]:
    """The totals the sink file holds (numeric-sum over the shards' amount-stats)."""
    body = json.loads((Path(result.output_root or "") / f"out/{job_id}.json").read_text())
    totals: dict[str, Any] = body["data"]["totals"]
    return totals


def manifest_of(settings: Settings, run_id: str) -> Any:
    return get_manifest(
        get_sessionmaker(settings.resolved_database_url),
        artifact_store_from_settings(settings),
        run_id,
    )


def amount(i: int) -> str:
    return f"{i % 1000}.{i % 100:02d}"


async def test_jsonl_100k_records_give_equal_digests_on_threads_ray_and_replay(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    """100,000 JSONL records, 10,000 per shard: computed on threads, found by their
    checkpoint keys from a run on Ray (a shard's identity is the same on both), and
    recomputed on Ray by a replay: every digest equal, every record counted once."""
    settings = mrp_settings
    (tmp_path / "data").mkdir()
    with (tmp_path / "data" / "sales.jsonl").open("w") as f:
        for i in range(100_000):
            f.write(f'{{"id": {i}, "amount": "{amount(i)}"}}\n')
    job_id = "rec-jsonl-100k"
    text = records_job(job_id, "data/*.jsonl", "jsonl", records_per_shard=10_000)
    start = MRPJobInput(job_yaml=text, base_dir=str(tmp_path))
    async with build_worker(client, settings):
        first = await run_job(
            client, settings, job_id, start.model_copy(update={"backend": "threads"})
        )
        again = await run_job(client, settings, job_id, start.model_copy(update={"backend": "ray"}))
        replay = await run_job(
            client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="ray")
        )
    assert first.status == "succeeded", first
    assert (first.counters.total, first.counters.run) == (10, 10)
    assert (again.counters.run, again.counters.skipped) == (0, 10)
    assert replay.replay_matched is True and replay.counters.run == 10
    assert again.output_digests == first.output_digests == replay.output_digests
    totals = produced(first, job_id)
    assert totals["count"] == "100000"
    assert Decimal(totals["sum"]) == sum(Decimal(amount(i)) for i in range(100_000))
    # Each shard's payload names its records: file, first record, lines and bytes.
    manifest = manifest_of(settings, first.run_id)
    store = artifact_store_from_settings(settings)
    # ... and lies in the compile's pack of the run's inputs, proved by its own digest.
    ir = ir_from_json(store.get_bytes(manifest.ir_digest))
    place = ir.input_place(ir.map_tasks[3])
    assert place is not None and place[0] == ir.input_packs[0] and len(ir.input_packs) == 1
    payload = json.loads(store.get_member(PackRef(*place), manifest.shards[3].input_digest))
    assert isinstance(payload, dict)
    rec = payload["records"]
    assert (rec["file"]["path"], rec["first_record"], rec["record_count"]) == (
        "data/sales.jsonl",
        30_000,
        10_000,
    )
    assert (rec["start_line"], rec["end_line"]) == (30_001, 40_000)


async def test_parquet_rows_give_equal_digests_on_threads_and_a_ray_replay(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    settings = mrp_settings
    (tmp_path / "data").mkdir()
    n = 30_000
    table = pa.table({"id": list(range(n)), "amount": [amount(i) for i in range(n)]})
    pq.write_table(table, tmp_path / "data" / "sales.parquet", row_group_size=4096)
    job_id = "rec-parquet"
    text = records_job(job_id, "data/sales.parquet", "parquet", records_per_shard=10_000)
    async with build_worker(client, settings):
        first = await run_job(
            client,
            settings,
            job_id,
            MRPJobInput(job_yaml=text, base_dir=str(tmp_path), backend="threads"),
        )
        replay = await run_job(
            client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="ray")
        )
    assert first.status == "succeeded" and first.counters.total == 3
    assert replay.replay_matched is True and replay.output_digests == first.output_digests
    totals = produced(first, job_id)
    assert totals["count"] == str(n)
    assert Decimal(totals["sum"]) == sum(Decimal(amount(i)) for i in range(n))


async def test_malformed_record_fails_its_shard_by_file_and_line_or_is_skipped_and_listed(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    settings = mrp_settings
    (tmp_path / "data").mkdir()
    lines = [json.dumps({"amount": i}) for i in range(1, 13)]
    lines[6] = '{"amount": 7,,}'  # line 7
    lines[10] = "[11]"  # line 11
    (tmp_path / "data" / "bad.jsonl").write_text("\n".join(lines) + "\n")
    async with build_worker(client, settings):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client,
                settings,
                "rec-bad-fail",
                MRPJobInput(
                    job_yaml=records_job(
                        "rec-bad-fail", "data/*.jsonl", "jsonl", records_per_shard=5
                    ),
                    base_dir=str(tmp_path),
                    backend="threads",
                ),
            )
        skip_text = records_job(
            "rec-bad-skip", "data/*.jsonl", "jsonl", records_per_shard=5, on_malformed="skip"
        )
        skipped = await run_job(
            client,
            settings,
            "rec-bad-skip",
            MRPJobInput(job_yaml=skip_text, base_dir=str(tmp_path), backend="threads"),
        )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_SHARD
    # Shards 1 (line 7) and 2 (line 11) both fail; they run side by side, so the run
    # fails with whichever failed first (a loaded clean-clone run saw shard 2's), and
    # names that shard with its own file and line.
    first = {
        "shard shard-000001": "malformed record at data/bad.jsonl line 7: invalid JSON",
        "shard shard-000002": "malformed record at data/bad.jsonl line 11: a JSONL record "
        "must be a JSON object, not list",
    }
    named = [shard for shard in first if shard in cause.message]
    assert len(named) == 1, cause.message
    assert first[named[0]] in cause.message
    assert skipped.status == "succeeded"
    totals = produced(skipped, "rec-bad-skip")
    assert totals["count"] == "10"  # twelve records, two left out
    assert Decimal(totals["sum"]) == sum(range(1, 13)) - 7 - 11
    manifest = manifest_of(settings, skipped.run_id)
    assert manifest.skipped_record_count == 2
    assert [m.describe() for m in manifest.skipped_records] == [
        "data/bad.jsonl line 7: invalid JSON: Expecting property name enclosed in double "
        "quotes at column 14",
        "data/bad.jsonl line 11: a JSONL record must be a JSON object, not list",
    ]
    full = artifact_store_from_settings(settings).get_json(manifest.skipped_records_digest)
    assert isinstance(full, list) and len(full) == 2


async def test_degenerate_csv_inputs(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    """An empty file, a header-only file and a file without a trailing newline, with
    records_per_shard larger than all of them: one shard of three records."""
    settings = mrp_settings
    data = tmp_path / "data"
    data.mkdir()
    (data / "a_empty.csv").write_text("")
    (data / "b_header.csv").write_text("id,amount\n")
    (data / "c_rows.csv").write_text("id,amount\n1,1.5\n2,2.25\n3,3")
    job_id = "rec-csv-degenerate"
    text = records_job(job_id, "data/*.csv", "csv", records_per_shard=1_000_000)
    only_empty = records_job("rec-csv-empty", "data/[ab]_*.csv", "csv", records_per_shard=10)
    async with build_worker(client, settings):
        result = await run_job(
            client,
            settings,
            job_id,
            MRPJobInput(job_yaml=text, base_dir=str(tmp_path), backend="threads"),
        )
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client,
                settings,
                "rec-csv-empty",
                MRPJobInput(job_yaml=only_empty, base_dir=str(tmp_path), backend="threads"),
            )
    assert result.status == "succeeded" and result.counters.total == 1
    assert produced(result, job_id)["count"] == "3"
    assert produced(result, job_id)["sum"] == "6.75"
    manifest = manifest_of(settings, result.run_id)
    assert sorted(manifest.input_file_digests) == [
        "data/a_empty.csv",
        "data/b_header.csv",
        "data/c_rows.csv",
    ]
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_COMPILE
    assert "hold no csv records" in cause.message


# -- S3 --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


@pytest.mark.s3
async def test_s3_prefix_input_is_read_from_seaweedfs(
    client: Client, mrp_settings: Settings, s3_server: SeaweedS3
) -> None:
    settings = mrp_settings.model_copy(
        update={
            "s3_endpoint_url": s3_server.endpoint_url,
            "s3_region": s3_server.region,
            "s3_access_key_id": SecretStr(s3_server.access_key_id),
            "s3_secret_access_key": SecretStr(s3_server.secret_access_key),
        }
    )
    s3: Any = s3_server.client()
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=INPUT_BUCKET)
    prefix = f"run-{uuid.uuid4().hex[:8]}/"
    for part in range(3):
        body = "".join(
            json.dumps({"id": i, "amount": i}) + "\n" for i in range(part * 100, part * 100 + 100)
        )
        s3.put_object(Bucket=INPUT_BUCKET, Key=f"{prefix}part-{part}.jsonl", Body=body.encode())
    s3.put_object(Bucket=INPUT_BUCKET, Key=f"{prefix}sub/", Body=b"")  # a folder marker
    s3.put_object(Bucket=INPUT_BUCKET, Key=f"other-{prefix}x.jsonl", Body=b'{"amount": 1}\n')
    uri = f"s3://{INPUT_BUCKET}/{prefix}"
    job_id = "rec-s3"
    text = records_job(job_id, uri, "jsonl", records_per_shard=40)
    refused = records_job("rec-s3-refused", "s3://elsewhere/data/", "jsonl", records_per_shard=40)
    async with build_worker(client, settings):
        result = await run_job(
            client, settings, job_id, MRPJobInput(job_yaml=text, backend="threads")
        )
        replay = await run_job(
            client, settings, job_id, MRPJobInput(replay_of=result.run_id, backend="ray")
        )
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client,
                settings,
                "rec-s3-refused",
                MRPJobInput(job_yaml=refused, backend="threads"),
            )
    assert result.status == "succeeded"
    # Three objects of 100 records, 40 per shard, never across objects: 3 x 3 shards.
    assert result.counters.total == 9
    assert produced(result, job_id)["count"] == "300"
    assert produced(result, job_id)["sum"] == str(sum(range(300)))
    manifest = manifest_of(settings, result.run_id)
    assert sorted(manifest.input_file_digests) == [f"{uri}part-{p}.jsonl" for p in range(3)]
    # The replay reads the stored slices, not the bucket: same digests.
    assert replay.replay_matched is True and replay.output_digests == result.output_digests
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_COMPILE
    assert "MRP-P015 input source not allowed at inputs.files[0] (line 5)" in cause.message


# -- The CLI ---------------------------------------------------------------------------------


async def test_cli_compiles_runs_inspects_and_replays_a_jsonl_job(
    client: Client, tmp_path: Path, temporal_address: str
) -> None:
    """``mrp compile`` cuts the file offline; ``mrp run`` skips the bad line; ``mrp inspect``
    names it; ``mrp replay`` reproduces every digest.

    A worker polls the CLI's task queue (in this process, as beside ``keel up``, on the
    module's Ray): that ``mrp run`` and ``mrp replay`` start a ``keel worker`` when none
    polls is tests/mrp/integration/test_cli.py's."""
    env = {
        **os.environ,
        "KEEL_ENV": "test",
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        "KEEL_TEMPORAL_ADDRESS": temporal_address,
        "KEEL_TASK_QUEUE": f"mrp-records-cli-{uuid.uuid4()}",
        "KEEL_METRICS_PORT": "0",
    }
    # What the CLI reads from ``env``, for the worker.
    settings = Settings(
        env="test",
        data_dir=Path(env["KEEL_DATA_DIR"]),
        temporal_address=temporal_address,
        task_queue=env["KEEL_TASK_QUEUE"],
        metrics_port=0,
    )

    async def mrp(*args: str) -> subprocess.CompletedProcess[str]:
        # In a thread: the worker lives on this event loop.
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "cli.mrp", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=REPO,
        )

    (tmp_path / "sales").mkdir()
    lines = [f'{{"id": {i}, "amount": "{amount(i)}"}}' for i in range(20_000)]
    lines[4_999] = '{"id": 4999, "amount": }'  # line 5000
    (tmp_path / "sales" / "q1.jsonl").write_text("\n".join(lines) + "\n")
    job = tmp_path / "sales.yaml"
    job.write_text(
        records_job(
            "rec-cli", "sales/*.jsonl", "jsonl", records_per_shard=5_000, on_malformed="skip"
        )
    )
    compiled = await mrp("compile", str(job), "--out", str(tmp_path / "compiled"))
    assert compiled.returncode == 0, compiled.stderr
    assert json.loads(compiled.stdout)["shards"] == 4
    async with build_worker(client, settings):
        run = await mrp("run", str(job), "--backend", "threads")
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["status"] == "succeeded" and result["counters"]["run"] == 4
        text = await mrp("inspect", "--run-id", result["run_id"], "--text")
        replay = await mrp("replay", "--run-id", result["run_id"])
    assert "skipped      1 malformed input records" in text.stdout, text.stdout
    assert "sales/q1.jsonl line 5000: invalid JSON: Expecting value at column 24" in text.stdout
    assert replay.returncode == 0, replay.stderr
    got = json.loads(replay.stdout)
    assert got["compared"] == got["matched"] == 4 + 1 + 2 and got["first_difference"] is None
