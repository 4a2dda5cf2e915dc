"""A job whose reducer streams (``StreamingReducerBase``: the ``stream-sum`` test
operator) end to end: the reduce activity streams the outputs from the store to it, and
its value is over every shard output in shard order."""

from __future__ import annotations

from pydantic import JsonValue
from temporalio.client import Client

from keel.mrp.run import MRPJobInput
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from tests.mrp.operators import CONFIG
from tests.support.mrp_jobs import items_job_yaml, run_job
from workers.main import build_worker


async def test_a_streaming_reducer_reduces_every_output(client: Client, settings: Settings) -> None:
    settings = settings.model_copy(update={"mrp_config": CONFIG})
    n = 30
    yaml_text = items_job_yaml(
        "stream-reduce", "word-count@1.0.0", {}, n, max_workers=4, budget_units="1000"
    ).replace("numeric-sum@1.0.0", "stream-sum@1.0.0")
    async with build_worker(client, settings):
        result = await run_job(
            client, settings, "stream-reduce", MRPJobInput(job_yaml=yaml_text, backend="threads")
        )
    assert result.status == "succeeded", result
    assert result.reduce_digest is not None
    reduced: JsonValue = artifact_store_from_settings(settings).get_json(result.reduce_digest)
    chars = sum(len(f"item-{i}") for i in range(n))
    # "item-7" is two words ([\w']+ runs).
    assert reduced == {"shards": n, "totals": {"chars": chars, "items": n, "words": 2 * n}}
