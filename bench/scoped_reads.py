"""``GET /gates`` for an approver with a few gates among thousands of others' pending ones.

    uv run python bench/scoped_reads.py [--sizes 500,3000] [--mine 5] [--repeat 15]

One dev server (SQLite WAL) and the API (in process, over ASGI) run here; no worker, so
the gates stay pending as started (``client.gate.start_gate``: memo and ``KeelReaders``).
For each size, others' gates are added until that many are pending, then, interleaved:

* scoped: ``GET /gates?limit=100`` as the approver, who may decide ``--mine`` of them: one
  visibility query filtered by ``KeelReaders`` (what the API does now);
* walk: what ``GET /gates`` did before ``KeelReaders``: read pending gates newest first
  and check each one's access memo until ``limit`` rows the caller may see, or the end
  (the caller's gates are the oldest here, so the walk reads every row);
* admin: ``GET /gates?limit=100`` as ``admin`` (no filter; reads each row's request).

Prints p50 and p90 of each per size, the ratio of the scoped p50 at the largest size to
the smallest (flat: about 1), and ``ratio <walk p50 / scoped p50>`` at the largest size.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from temporalio.client import Client  # noqa: E402

from api.app import create_app  # noqa: E402
from bench.stats import p90  # noqa: E402
from client.gate import start_gate  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.access import ACCESS_MEMO, RunAccess, may_read  # noqa: E402
from keel.gates import GATE_WORKFLOW_TYPE, GateRequest, gate_workflow_id  # noqa: E402
from keel.search_attributes import GATE_STATUS_ATTRIBUTE  # noqa: E402
from keel.settings import ApiToken, Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402

ME, ROOT_USER = "bench-approver", "bench-root"


async def walk(client: Client, limit: int) -> int:
    """The pre-``KeelReaders`` list: every pending gate's memo until ``limit`` are readable."""
    query = f'WorkflowType = "{GATE_WORKFLOW_TYPE}" AND {GATE_STATUS_ATTRIBUTE} = "pending"'
    found = 0
    async for wf in client.list_workflows(query):
        access = await wf.memo_value(ACCESS_MEMO, None, type_hint=RunAccess)
        if may_read(access, ME, frozenset({"approver"})):
            found += 1
            if found >= limit:
                break
    return found


async def main(sizes: list[int], mine: int, repeat: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-scoped-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        tokens = [
            ApiToken(token=SecretStr("tok-me-0123456789"), actor=ME, roles=["approver"]),
            ApiToken(token=SecretStr("tok-root-0123456789"), actor=ROOT_USER, roles=["admin"]),
        ]
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}", api_tokens=tokens,
        )  # fmt: skip
        client = await connect(settings)
        limiter = asyncio.Semaphore(32)
        started = 0

        async def gate(n: int, approvers: list[str]) -> None:
            req = GateRequest(name="g", requester=f"someone-{n % 7}", approvers=approvers)
            async with limiter:
                gid = gate_workflow_id(f"bench/{n}", "g")
                await start_gate(client, req, gate_id=gid, task_queue=settings.task_queue)

        # The approver's gates first: the oldest, so a newest-first walk reaches them last.
        await asyncio.gather(*(gate(-1 - i, [ME]) for i in range(mine)))
        transport = httpx.ASGITransport(app=create_app(settings, client=client))
        results: list[tuple[int, dict[str, list[float]]]] = []
        async with httpx.AsyncClient(transport=transport, base_url="http://keel.bench") as http:

            async def timed_get(tok: str) -> tuple[float, int]:
                t0 = time.perf_counter()
                resp = await http.get(
                    "/gates", params={"limit": 100}, headers={"Authorization": f"Bearer {tok}"}
                )
                elapsed = time.perf_counter() - t0
                assert resp.status_code == 200, resp.text
                return elapsed, len(resp.json()["gates"])

            for size in sizes:
                t0 = time.perf_counter()
                await asyncio.gather(*(gate(n, ["other"]) for n in range(started, size)))
                started = max(started, size)
                print(f"{size} pending gates of others started in {time.perf_counter() - t0:.1f} s")
                while (await timed_get("tok-me-0123456789"))[1] < mine:  # visibility lags
                    await asyncio.sleep(0.2)
                times: dict[str, list[float]] = {"scoped": [], "walk": [], "admin": []}
                for _ in range(repeat):
                    elapsed, count = await timed_get("tok-me-0123456789")
                    assert count == mine, count
                    times["scoped"].append(elapsed)
                    t0 = time.perf_counter()
                    assert await walk(client, 100) == mine
                    times["walk"].append(time.perf_counter() - t0)
                    times["admin"].append((await timed_get("tok-root-0123456789"))[0])
                results.append((size, times))
                for name, values in times.items():
                    print(
                        f"  {name:7s} p50 {statistics.median(values) * 1000:8.1f} ms"
                        f"  p90 {p90(values) * 1000:8.1f} ms"
                    )
        (small, t_small), (large, t_large) = results[0], results[-1]
        scoped = statistics.median(t_large["scoped"]) / statistics.median(t_small["scoped"])
        print(f"scoped p50 at {large} / at {small}: {scoped:.2f}")
        walk_ratio = statistics.median(t_large["walk"]) / statistics.median(t_large["scoped"])
        print(f"ratio {walk_ratio:.1f}")
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500,3000", help="pending gates of others, rising")
    parser.add_argument("--mine", type=int, default=5, help="the approver's gates")
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.mine, args.repeat))
