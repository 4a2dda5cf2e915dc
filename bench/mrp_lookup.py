"""``GET /mrp/jobs/{id}`` for an unknown run id, among thousands of MRP runs, against the
one visibility query it stands on.

    uv run python bench/mrp_lookup.py [--jobs 2000] [--repeat 31]

The latency half of issue 15 §4 ("an unknown id is a 404 at once, even with 2,000 runs on
the server"). tests/mrp/integration/test_lookup.py shows the mechanism by counting: one
``list_workflow_executions`` per lookup, whatever the server holds. How long that takes is
this bench's, not a test's (no test asserts a time).

One dev server (SQLite WAL) runs here; ``--jobs`` idle ``MRPJob`` runs are started on a
task queue no worker polls (visible, never progressing; they time out after 10 minutes).
The API runs in process over ASGI (no TCP), as the test does. Interleaved, ``--repeat``
times each:

* floor: the bare visibility query ``find_workflow_id`` makes (``WorkflowType`` and
  ``KeelMrpRunId``, limit 1) for an id no run has;
* keel: ``GET /mrp/jobs/<that id>`` as a requester: the SQL record lookup, the same query,
  and the 404.

Prints p50 and p90 of each, and ``ratio <keel p50 / floor p50>`` as its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.common import SearchAttributePair, TypedSearchAttributes  # noqa: E402

from api.app import create_app  # noqa: E402
from bench.harness import bench_settings, dev_server, in_chunks  # noqa: E402
from bench.stats import p90  # noqa: E402
from client.mrp import RUN_ID_KEY  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.mrp.run import WORKFLOW_TYPE, MRPJobInput, workflow_id_for  # noqa: E402
from keel.search_attributes import RUN_ID_ATTRIBUTE  # noqa: E402
from keel.settings import ApiToken  # noqa: E402

TOKEN = "tok-bench-reader-0123456789"


async def start_idle_jobs(client: Client, n: int) -> str:
    """``n`` MRPJob runs nobody works on; returns the last run id (to wait for visibility)."""
    queue, job_id = f"bench-idle-{uuid.uuid4()}", f"lookup-{uuid.uuid4().hex[:8]}"
    run_ids = [uuid.uuid4().hex[:16] for _ in range(n)]

    async def one(run_id: str) -> None:
        await client.start_workflow(
            WORKFLOW_TYPE,
            MRPJobInput(job_yaml="", run_id=run_id),
            id=workflow_id_for(job_id, run_id),
            task_queue=queue,
            execution_timeout=timedelta(minutes=10),
            search_attributes=TypedSearchAttributes([SearchAttributePair(RUN_ID_KEY, run_id)]),
        )

    _, seconds = await in_chunks(run_ids, one, chunk=32)
    print(f"started {n} idle MRPJob runs in {seconds:.1f} s")
    return run_ids[-1]


async def bare_query(client: Client, run_id: str) -> str | None:
    query = f'WorkflowType = "{WORKFLOW_TYPE}" AND {RUN_ID_ATTRIBUTE} = "{run_id}"'
    async for wf in client.list_workflows(query, limit=1):
        return str(wf.id)
    return None


async def main(jobs: int, repeat: int) -> None:
    with dev_server("keel-bench-lookup-") as (server, tmp):
        token = ApiToken(token=SecretStr(TOKEN), actor="bench-reader", roles=["requester"])  # type: ignore[list-item]
        settings = bench_settings(server, tmp, api_tokens=[token])
        client = await connect(settings)
        last = await start_idle_jobs(client, jobs)
        for _ in range(300):  # visibility catches up with the last start
            if await bare_query(client, last):
                break
            await asyncio.sleep(0.1)
        count = await client.count_workflows(f'WorkflowType = "{WORKFLOW_TYPE}"')
        print(f"MRPJob runs on the server: {count.count}")

        app = create_app(settings, client=client)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        times: dict[str, list[float]] = {"floor": [], "keel": []}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://keel.test"
        ) as http:
            for i in range(repeat + 1):  # the first round warms both up and is dropped
                unknown = f"no-such-{uuid.uuid4().hex}"
                t0 = time.perf_counter()
                found = await bare_query(client, unknown)
                t1 = time.perf_counter()
                resp = await http.get(f"/mrp/jobs/{unknown}", headers=headers)
                t2 = time.perf_counter()
                if found is not None or resp.status_code != 404:
                    raise SystemExit(f"expected nothing and a 404, got {found} / {resp.text}")
                if i:
                    times["floor"].append(t1 - t0)
                    times["keel"].append(t2 - t1)
    for name, values in times.items():
        print(
            f"{name}: p50 {statistics.median(values) * 1000:.1f} ms, "
            f"p90 {p90(values) * 1000:.1f} ms ({len(values)} lookups among {jobs} runs)"
        )
    ratio = statistics.median(times["keel"]) / statistics.median(times["floor"])
    print(f"ratio {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=31)
    args = parser.parse_args()
    asyncio.run(main(args.jobs, args.repeat))
