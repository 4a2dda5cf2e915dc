"""A gate decision against the floor: a bare Update on a trivial workflow.

    uv run python bench/gate_latency.py [--gates 50] [--settle 0.3]

One dev server (SQLite WAL), one worker and the API (uvicorn on loopback) run in this
process. For each round, interleaved:

* floor: ``FloorGate`` (bench/floor.py) started, then one ``decide`` Update that records
  the decision and returns the state: the least an Update round trip costs here;
* client: an ``ApprovalGate`` started, then its ``decide`` Update (validator, handler,
  the audit row's local activity, answer), timed from send to answer;
* client, settled: the same on a gate opened ``--settle`` seconds before (default 0.3),
  as a person's click comes, against a floor settled as long: after a pause the round
  trip itself is slower here (the floor too), so each is compared with its own floor;
* API: a gate opened with ``POST /gates`` and, once it runs (a Query, as for the other
  gates), ``POST /gates/{id}/approve`` timed as an HTTP client sees it (bearer token,
  ``Idempotency-Key``);
* for reference, the ``state`` Query on the client's gate, the Signal path (send to
  the gate's result), and ``GET /health`` (an HTTP request whose route makes one RPC:
  what any API call costs before its own work).

Prints p50 and p90 of each and its ratio to the floor (the settled decide: to the settled
floor), and ends with ``ratio <decide (client) p50 / floor p50>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.floor import FloorGate, FloorState  # noqa: E402
from bench.harness import bench_worker, serve_api  # noqa: E402
from bench.stats import p90  # noqa: E402
from client.temporal import connect  # noqa: E402
from keel.gates import GateDecision, GateRequest  # noqa: E402
from keel.settings import Settings  # noqa: E402
from services.processes import TemporalDevServer, free_port  # noqa: E402
from workflows.gate import ApprovalGate  # noqa: E402


def token(settings: Settings, role: str) -> str:
    return next(t for t in settings.api_tokens if role in t.roles).token.get_secret_value()


async def main(n: int, settle_s: float) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-gate-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}", api_port=free_port(),
        )  # fmt: skip
        client = await connect(settings)
        api = contextlib.AsyncExitStack()
        base = await api.enter_async_context(serve_api(settings, client))
        floor_ms: list[float] = []
        floor_settled_ms: list[float] = []
        client_ms: list[float] = []
        settled_ms: list[float] = []
        api_ms: list[float] = []
        query_ms: list[float] = []
        signal_ms: list[float] = []
        health_ms: list[float] = []
        worker = bench_worker(client, settings)
        requester = {"Authorization": f"Bearer {token(settings, 'requester')}"}
        approver = {"Authorization": f"Bearer {token(settings, 'approver')}"}
        approver_actor = next(t for t in settings.api_tokens if "approver" in t.roles).actor
        async with worker, httpx.AsyncClient(base_url=base, timeout=30) as http:

            async def open_gate() -> Any:
                handle = await client.start_workflow(
                    ApprovalGate.run,
                    GateRequest(name="g", requester="alice", approvers=[approver_actor]),
                    id=f"bench/{uuid.uuid4()}/gate/g",
                    task_queue=settings.task_queue,
                )
                await handle.query(ApprovalGate.state)  # the gate is running
                return handle

            for i in range(n + 3):  # the first three warm up connections and caches
                floor = await client.start_workflow(
                    FloorGate.run, id=f"floor/{uuid.uuid4()}", task_queue=settings.task_queue
                )
                await floor.query(FloorGate.state)  # running, as each gate is before timing
                t0 = time.perf_counter()
                await floor.execute_update(
                    FloorGate.decide, FloorState(decision="approve", actor="bob")
                )
                t1 = time.perf_counter()
                await floor.result()

                floor = await client.start_workflow(
                    FloorGate.run, id=f"floor/{uuid.uuid4()}", task_queue=settings.task_queue
                )
                await floor.query(FloorGate.state)
                await asyncio.sleep(settle_s)
                t1s0 = time.perf_counter()
                await floor.execute_update(
                    FloorGate.decide, FloorState(decision="approve", actor="bob")
                )
                t1s = time.perf_counter()
                await floor.result()

                handle = await open_gate()
                t2 = time.perf_counter()
                await handle.query(ApprovalGate.state)
                t3 = time.perf_counter()
                await handle.execute_update(
                    ApprovalGate.decide, GateDecision(decision="approve", actor=approver_actor)
                )
                t4 = time.perf_counter()
                await handle.result()

                handle = await open_gate()
                await asyncio.sleep(settle_s)
                t3s = time.perf_counter()
                await handle.execute_update(
                    ApprovalGate.decide, GateDecision(decision="approve", actor=approver_actor)
                )
                t4s = time.perf_counter()
                await handle.result()

                resp = await http.post(
                    "/gates",
                    json={"name": "g", "approvers": [approver_actor]},
                    headers={**requester, "Idempotency-Key": str(uuid.uuid4())},
                )
                resp.raise_for_status()
                gate_id = resp.json()["gate_id"]
                # running, as each gate is before timing (POST /gates returns once started)
                await client.get_workflow_handle(gate_id).query(ApprovalGate.state)
                t5 = time.perf_counter()
                resp = await http.post(
                    f"/gates/{gate_id}/approve",
                    json={"comment": "ok"},
                    headers={**approver, "Idempotency-Key": str(uuid.uuid4())},
                )
                t6 = time.perf_counter()
                resp.raise_for_status()
                assert resp.json()["status"] == "approved", resp.text

                t6h = time.perf_counter()
                (await http.get("/health")).raise_for_status()
                t7h = time.perf_counter()

                handle = await open_gate()
                t7 = time.perf_counter()
                await handle.signal(
                    ApprovalGate.decide_signal,
                    GateDecision(decision="approve", actor=approver_actor),
                )
                await handle.result()
                t8 = time.perf_counter()
                if i >= 3:
                    floor_ms.append((t1 - t0) * 1000)
                    floor_settled_ms.append((t1s - t1s0) * 1000)
                    query_ms.append((t3 - t2) * 1000)
                    client_ms.append((t4 - t3) * 1000)
                    settled_ms.append((t4s - t3s) * 1000)
                    api_ms.append((t6 - t5) * 1000)
                    signal_ms.append((t8 - t7) * 1000)
                    health_ms.append((t7h - t6h) * 1000)
        await api.aclose()
    finally:
        server.stop()
    base_ms = statistics.median(floor_ms)
    settled_base_ms = statistics.median(floor_settled_ms)
    print(f"gates: {n} of each (dev server, SQLite WAL, one worker, API on loopback, this machine)")
    print(f"{'round trip':<40}{'p50 ms':>9}{'p90 ms':>9}{'p50 / floor':>13}")
    for name, values, floor_of in (
        ("floor: bare Update (FloorGate)", floor_ms, base_ms),
        ("decide Update, client", client_ms, base_ms),
        ("POST /gates/{id}/approve, HTTP", api_ms, base_ms),
        (f"floor, settled {settle_s:g} s", floor_settled_ms, settled_base_ms),
        (f"decide Update, client, settled {settle_s:g} s", settled_ms, settled_base_ms),
        ("query state (reference)", query_ms, base_ms),
        ("signal decide -> result (reference)", signal_ms, base_ms),
        ("GET /health, HTTP + 1 RPC (reference)", health_ms, base_ms),
    ):
        med = statistics.median(values)
        print(f"{name:<40}{med:>9.3f}{p90(values):>9.3f}{med / floor_of:>12.3f}x")
    print(f"ratio (API) {statistics.median(api_ms) / base_ms:.3f}")
    print(f"ratio (settled gate) {statistics.median(settled_ms) / settled_base_ms:.3f}")
    print(f"ratio {statistics.median(client_ms) / base_ms:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, default=50)
    parser.add_argument("--settle", type=float, default=0.3, help="seconds before a settled decide")
    args = parser.parse_args()
    asyncio.run(main(args.gates, args.settle))
