"""``policy.shard_memory_mb`` is enforced on the process that runs the shard's operator.

Four shards in one window; the ``memory-hog`` test operator (tests/mrp/operators) touches
256 MiB on one of them under a 64 MB limit. That shard fails alone, on its first attempt
(over the limit is not retryable), naming the limit; the three others in the same window
succeed, and with ``min_success_ratio`` the run reduces over them. Threads and Ray: on
both the operator runs in its host process, where the limit is.
"""

from __future__ import annotations

import json

import pytest
from temporalio.client import Client

from keel.mrp.run import MRPJobInput
from keel.settings import Settings
from store.db import get_sessionmaker
from store.mrp_runs import list_shards
from tests.mrp.operators import CONFIG
from tests.support.mrp_jobs import run_job
from workers.main import build_worker

pytestmark = pytest.mark.usefixtures("ray_for_module")

ITEMS = ["alpha beta", "gamma", "delta epsilon zeta", "eta"]
HOG = "shard-000002"


def job(job_id: str) -> str:
    params = {"hog_shards": [HOG], "mb": 256}
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {json.dumps(ITEMS)}
  by: item
map:
  operator: memory-hog@1.0.0
  params: {json.dumps(params)}
  min_success_ratio: "0.5"
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/result.json}}
policy:
  max_workers: 4
  max_shard_retries: 2
  shard_memory_mb: 64
  budget_units: "1000"
"""


@pytest.mark.parametrize("backend", ["threads", "ray"])
async def test_a_shard_over_its_memory_limit_fails_alone(
    client: Client, settings: Settings, backend: str
) -> None:
    settings = settings.model_copy(update={"mrp_config": CONFIG})
    job_id = f"memory-{backend}"
    async with build_worker(client, settings):
        result = await run_job(
            client,
            settings,
            job_id,
            MRPJobInput(job_yaml=job(job_id), backend=backend),  # type: ignore[arg-type]
        )
    assert result.status == "succeeded", result
    assert (result.counters.total, result.counters.run, result.counters.failed) == (4, 3, 1)
    assert result.counters.retried == 0  # over the limit: not retried
    assert f"1 of 4 shards failed ({HOG})" in result.message
    shards = {
        s.shard_id: s
        for s in list_shards(get_sessionmaker(settings.resolved_database_url), result.run_id)
    }
    hog = shards.pop(HOG)
    assert hog.state == "failed" and hog.attempts == 1
    assert "went over its memory limit of 64 MB (policy.shard_memory_mb)" in (hog.error or "")
    assert "MemoryError" in (hog.error or "")
    assert {s.state for s in shards.values()} == {"succeeded"}
    assert all(s.output_digest for s in shards.values())


async def test_the_same_shard_under_a_higher_limit_succeeds(
    client: Client, settings: Settings
) -> None:
    """The limit, not the operator, failed the shard: at 1024 MB every shard succeeds."""
    settings = settings.model_copy(update={"mrp_config": CONFIG})
    job_id = "memory-enough"
    yaml_text = job(job_id).replace("shard_memory_mb: 64", "shard_memory_mb: 1024")
    async with build_worker(client, settings):
        result = await run_job(
            client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="threads")
        )
    assert result.status == "succeeded", result
    assert (result.counters.run, result.counters.failed) == (4, 0)
