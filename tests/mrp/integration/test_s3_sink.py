"""An ``s3://`` sink written by a real ``MRPJob`` (Temporal dev server, threads backend)
into the SeaweedFS S3 server and read back; a retried produce does not write again.

The worker's settings carry the S3 endpoint and credentials as the artifact store takes
them (``KEEL_S3_*``); its artifacts stay local, so the bucket holds only what the sink
wrote.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

from activities.mrp.sinks import DIGEST_METADATA, upload_to_s3
from keel.digest import digest_bytes
from keel.mrp import steps
from keel.mrp.dsl import parse_s3_destination
from keel.mrp.run import MRPJobInput, ProducedFileRecord, workflow_id_for
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings, s3_client_for_bucket
from store.db import get_sessionmaker
from store.mrp_runs import get_manifest
from tests.support.mrp_jobs import run_job
from tests.support.mrp_operators import TEST_CONFIG
from tests.support.seaweed import SeaweedS3, seaweed_s3
from workers.main import build_worker

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


def s3_config(tmp_path: Path, prefix: str) -> Path:
    """The test operators' config, with ``prefix`` an allowed sink destination."""
    data = yaml.safe_load(TEST_CONFIG.read_text())
    data["operator_paths"] = [
        str((TEST_CONFIG.parent / p).resolve()) for p in data["operator_paths"]
    ]
    data["caps"]["allowed_destination_prefixes"] = [prefix]
    path = tmp_path / "mrp.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def s3_settings(settings: Settings, server: SeaweedS3, config: Path) -> Settings:
    return settings.model_copy(
        update={
            "mrp_config": config,
            "s3_endpoint_url": server.endpoint_url,
            "s3_region": server.region,
            "s3_access_key_id": SecretStr(server.access_key_id),
            "s3_secret_access_key": SecretStr(server.secret_access_key),
        }
    )


def job(job_id: str, destination: str) -> str:
    items = [{"text": f"record {i} says hello"} for i in range(6)]
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {json.dumps(items)}
  shard_size: 2
map:
  operator: word-count@1.0.0
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: "{destination}"}}
policy:
  max_workers: 2
  budget_units: "100"
"""


def get_object(server: SeaweedS3, bucket: str, key: str) -> dict[str, Any]:
    return server.client().get_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined,no-any-return]


async def test_s3_sink_is_written_read_back_and_not_written_twice(
    client: Client, settings: Settings, s3_server: SeaweedS3, tmp_path: Path
) -> None:
    bucket = f"keel-out-{uuid.uuid4().hex[:12]}"
    s3 = s3_server.client()
    s3.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    destination = f"s3://{bucket}/reports/2026/wordcount.json"
    st = s3_settings(settings, s3_server, s3_config(tmp_path, f"s3://{bucket}/reports/"))
    async with build_worker(client, st):
        result = await run_job(
            client,
            st,
            "s3-sink",
            MRPJobInput(job_yaml=job("s3-sink", destination), backend="threads"),
        )
    assert result.status == "succeeded", result
    by_path = {f.path: f for f in result.produced}
    assert set(by_path) == {"wordcount.json", "wordcount.json.audit.jsonl"}
    assert by_path["wordcount.json"].uri == destination
    assert by_path["wordcount.json.audit.jsonl"].uri == destination + ".audit.jsonl"

    # Read back from the bucket: the bytes the run recorded, the digest in the metadata.
    obj = get_object(s3_server, bucket, "reports/2026/wordcount.json")
    body = obj["Body"].read()
    assert digest_bytes(body) == result.output_digests["produced:wordcount.json"]
    assert obj["Metadata"][DIGEST_METADATA] == by_path["wordcount.json"].digest
    assert json.loads(body)["data"]["totals"]["items"] == "6"
    audit = get_object(s3_server, bucket, "reports/2026/wordcount.json.audit.jsonl")["Body"].read()
    [record] = [json.loads(line) for line in audit.splitlines()]
    assert record["destination"] == destination and record["digest"] == digest_bytes(body)

    # The run manifest names the URI of every file it wrote.
    sm = get_sessionmaker(st.resolved_database_url)
    manifest = get_manifest(sm, artifact_store_from_settings(st), result.run_id)
    assert manifest is not None and manifest.sink_destination == destination
    assert {f.uri for f in manifest.produced} == {destination, destination + ".audit.jsonl"}

    # A retried produce (same staged files) finds every object in place and writes nothing.
    out_dir = Path(result.output_root or "")
    staged = [
        ProducedFileRecord(path=f.path, digest=f.digest, size=f.size) for f in result.produced
    ]
    before = {
        f.path: s3.head_object(Bucket=bucket, Key=f"reports/2026/{f.path}")["LastModified"]  # type: ignore[attr-defined]
        for f in staged
    }
    again = upload_to_s3(st, destination, out_dir, staged, "r-retry")
    assert [f.uri for f in again] == [by_path[f.path].uri for f in staged]
    for f in staged:
        head = s3.head_object(Bucket=bucket, Key=f"reports/2026/{f.path}")  # type: ignore[attr-defined]
        assert head["LastModified"] == before[f.path]
        assert head["Metadata"]["keel-run-id"] == result.run_id  # still the first writer's
    listing = s3.list_objects_v2(Bucket=bucket)  # type: ignore[attr-defined]
    assert sorted(o["Key"] for o in listing["Contents"]) == [
        "reports/2026/wordcount.json",
        "reports/2026/wordcount.json.audit.jsonl",
    ]
    # An object someone overwrote with other bytes is replaced whole by the next write.
    s3.put_object(Bucket=bucket, Key="reports/2026/wordcount.json", Body=b"garbage")  # type: ignore[attr-defined]
    upload_to_s3(st, destination, out_dir, staged, "r-retry")
    assert digest_bytes(
        get_object(s3_server, bucket, "reports/2026/wordcount.json")["Body"].read()
    ) == (by_path["wordcount.json"].digest)


async def test_s3_sink_into_a_missing_bucket_fails_at_compile_before_any_shard(
    client: Client, settings: Settings, s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """The bucket is checked with the job's credentials when the job compiles: the run
    fails there, naming the bucket and the sink's line, and no map window is scheduled."""
    bucket = f"keel-missing-{uuid.uuid4().hex[:12]}"
    destination = f"s3://{bucket}/out/"
    st = s3_settings(settings, s3_server, s3_config(tmp_path, f"s3://{bucket}/"))
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    inp = MRPJobInput(job_yaml=job("s3-missing", destination), backend="threads", run_id=run_id)
    async with build_worker(client, st):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(client, st, "s3-missing", inp)
    message = str(info.value.cause) + " " + str(getattr(info.value.cause, "cause", ""))
    assert "sink not writable at produce.sink.destination (line " in message, message
    assert "NoSuchBucket" in message and f"s3://{bucket}/out/" in message, message
    scheduled = []
    handle = client.get_workflow_handle(workflow_id_for("s3-missing", run_id))
    async for e in handle.fetch_history_events():
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled.append(e.activity_task_scheduled_event_attributes.activity_type.name)
    assert scheduled == [steps.COMPILE.name], scheduled  # nothing after the compile
    listing = s3_server.client().list_buckets()  # type: ignore[attr-defined]
    assert bucket not in {b["Name"] for b in listing["Buckets"]}  # and no bucket was made


def test_a_large_output_goes_up_in_parts_and_reads_back_whole(
    settings: Settings, s3_server: SeaweedS3, tmp_path: Path
) -> None:
    """Above the part size an output is a multipart upload (S3's ETag of such an object
    ends in ``-<parts>``), streamed from disk; the bytes read back are the file's."""
    bucket = f"keel-big-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    st = s3_settings(settings, s3_server, s3_config(tmp_path, f"s3://{bucket}/"))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    data = os.urandom(5 * 1024 * 1024) * 2 + b"tail"  # two 5 MiB parts and a little
    (out_dir / "big.jsonl").write_bytes(data)
    staged = [ProducedFileRecord(path="big.jsonl", digest=digest_bytes(data), size=len(data))]
    location = parse_s3_destination(f"s3://{bucket}/runs/")
    store = s3_client_for_bucket(st, bucket)
    store.upload_file_at(
        location.key_for("big.jsonl"),
        out_dir / "big.jsonl",
        metadata={DIGEST_METADATA: digest_bytes(data)},
        part_bytes=5 * 1024 * 1024,
    )
    head = s3_server.client().head_object(Bucket=bucket, Key="runs/big.jsonl")  # type: ignore[attr-defined]
    assert head["ETag"].strip('"').endswith("-3"), head["ETag"]
    assert get_object(s3_server, bucket, "runs/big.jsonl")["Body"].read() == data
    # The sink's own path: a second upload of the same bytes finds them and writes nothing.
    [done] = upload_to_s3(st, f"s3://{bucket}/runs/", out_dir, staged, "r-big")
    assert done.uri == f"s3://{bucket}/runs/big.jsonl"
    assert (
        s3_server.client().head_object(Bucket=bucket, Key="runs/big.jsonl")["ETag"] == head["ETag"]
    )  # type: ignore[attr-defined]


async def test_a_sink_outside_the_allowed_prefixes_is_refused_without_touching_the_bucket(
    client: Client, settings: Settings, s3_server: SeaweedS3, tmp_path: Path
) -> None:
    bucket = f"keel-other-{uuid.uuid4().hex[:12]}"
    s3 = s3_server.client()
    s3.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    st = s3_settings(settings, s3_server, s3_config(tmp_path, "s3://keel-allowed-only/"))
    inp = MRPJobInput(job_yaml=job("s3-refused", f"s3://{bucket}/out/"), backend="threads")
    async with build_worker(client, st):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(client, st, "s3-refused", inp)
    message = str(info.value.cause) + " " + str(getattr(info.value.cause, "cause", ""))
    assert "outside the allowed prefixes" in message, message
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket)  # type: ignore[attr-defined]
