"""``MRPJob`` end to end on the real dev server, with real Ray (local, loopback) and threads.

Operators are the shipped ones plus the test operators in tests/support/mrp_operators
(signed with the dev key; that folder's mrp.yaml is the config). Ray starts once for the
module (in this process, where the worker's activities run) and is shut down at the end.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.mrp_backends import ray_shutdown
from keel.digest import digest_bytes
from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.mrp_runs import get_manifest, get_run
from workers.main import build_worker
from workflows.mrp import MRPJob

REPO = Path(__file__).resolve().parents[2]
TEST_CONFIG = REPO / "tests" / "support" / "mrp_operators" / "mrp.yaml"


@pytest.fixture(scope="module", autouse=True)
def _ray_once() -> Iterator[None]:
    yield
    ray_shutdown()


@pytest.fixture
def mrp_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"mrp_config": TEST_CONFIG})


def wordcount_job(job_id: str, n: int = 12, per_shard: int = 2, **policy: object) -> str:
    items = ", ".join(json.dumps({"text": f"item {i} says hello world {i % 3}"}) for i in range(n))
    extra = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in policy.items())
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: [{items}]
  shard_size: {per_shard}
map:
  operator: word-count@1.0.0
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: 2
  budget_units: "1000"{extra}
"""


def map_job(
    job_id: str, operator: str, params: dict[str, object], n: int = 6, **policy: object
) -> str:
    items = ", ".join(json.dumps(f"item-{i}") for i in range(n))
    extra = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in policy.items())
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: [{items}]
  by: item
map:
  operator: {operator}
  params: {json.dumps(params)}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: 2{extra}
"""


async def run_job(
    client: Client, settings: Settings, inp: MRPJobInput, job_id: str
) -> MRPJobResult:
    run_id = inp.run_id or f"r-{uuid.uuid4().hex[:10]}"
    inp = inp.model_copy(update={"run_id": run_id})
    return await client.execute_workflow(
        MRPJob.run,
        inp,
        id=workflow_id_for(job_id, run_id),
        task_queue=settings.task_queue,
    )


@pytest.mark.parametrize("backend", ["threads", "ray"])
async def test_wordcount_runs_and_is_deterministic(
    client: Client, mrp_settings: Settings, backend: str
) -> None:
    settings = mrp_settings
    job_id = f"wc-{backend}"
    yaml_text = wordcount_job(job_id)
    async with build_worker(client, settings):
        first = await run_job(
            client, settings, MRPJobInput(job_yaml=yaml_text, backend=backend), job_id
        )  # type: ignore[arg-type]
        assert first.status == "succeeded", first
        assert first.counters.total == 6 and first.counters.run == 6
        second = await run_job(
            client, settings, MRPJobInput(job_yaml=yaml_text, backend=backend), job_id
        )  # type: ignore[arg-type]
        # Same job: every shard comes from the checkpoint index, same digests.
        assert second.counters.skipped == 6 and second.counters.run == 0
        assert second.output_digests == first.output_digests
        replay = await run_job(
            client,
            settings,
            MRPJobInput(replay_of=first.run_id, backend=backend),
            job_id,  # type: ignore[arg-type]
        )
        assert replay.status == "succeeded" and replay.replay_matched is True
        assert replay.counters.run == 6  # a replay recomputes every shard
        assert replay.output_digests == first.output_digests
    out = Path(first.output_root or "") / f"out/{job_id}.json"
    assert digest_bytes(out.read_bytes()) == first.output_digests[f"produced:out/{job_id}.json"]
    sm = get_sessionmaker(settings.resolved_database_url)
    run = get_run(sm, first.run_id)
    assert run is not None and run.status == "succeeded"
    manifest = get_manifest(sm, artifact_store_from_settings(settings), first.run_id)
    assert manifest is not None and len(manifest.shards) == 6
