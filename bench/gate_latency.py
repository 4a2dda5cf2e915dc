"""Approval round trips on a real dev server: Update vs Signal, against a Query baseline.

    uv run python bench/gate_latency.py [--gates 30]

For each gate: a Query round trip (the baseline: one RPC answered by the worker), a
``decide`` Update round trip (validator, handler, audit activity, answer), and for other
gates the time from sending the ``decide_signal`` Signal to the gate's result. Prints
medians and p90s and each as a ratio of the Query baseline, all measured in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from keel.gates import GateDecision, GateRequest
from keel.settings import Settings
from workers.client import connect
from workers.main import build_worker
from workers.services import TemporalDevServer, free_port
from workflows.gate import ApprovalGate


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) > 1 else values[0]


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="keel-bench-"))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)
    server.start()
    try:
        settings = Settings(
            env="test", data_dir=tmp / "keel", temporal_address=server.address,
            task_queue=f"bench-{uuid.uuid4()}",
        )  # fmt: skip
        client = await connect(settings)
        query_ms: list[float] = []
        update_ms: list[float] = []
        signal_ms: list[float] = []
        async with build_worker(client, settings):

            async def open_gate() -> object:
                handle = await client.start_workflow(
                    ApprovalGate.run,
                    GateRequest(name="g", requester="alice", approvers=["bob"]),
                    id=f"bench/{uuid.uuid4()}/gate/g",
                    task_queue=settings.task_queue,
                )
                await handle.query(ApprovalGate.state)  # warm: the gate is running
                return handle

            for i in range(n + 3):  # the first three warm up connections and caches
                handle = await open_gate()
                t0 = time.perf_counter()
                await handle.query(ApprovalGate.state)  # type: ignore[attr-defined]
                t1 = time.perf_counter()
                await handle.execute_update(  # type: ignore[attr-defined]
                    ApprovalGate.decide, GateDecision(decision="approve", actor="bob")
                )
                t2 = time.perf_counter()
                await handle.result()  # type: ignore[attr-defined]

                handle = await open_gate()
                t3 = time.perf_counter()
                await handle.signal(  # type: ignore[attr-defined]
                    ApprovalGate.decide_signal, GateDecision(decision="approve", actor="bob")
                )
                await handle.result()  # type: ignore[attr-defined]
                t4 = time.perf_counter()
                if i >= 3:
                    query_ms.append((t1 - t0) * 1000)
                    update_ms.append((t2 - t1) * 1000)
                    signal_ms.append((t4 - t3) * 1000)
        base = statistics.median(query_ms)
        print(f"gates: {n} (dev server, SQLite WAL, one worker, this machine)")
        print(f"{'round trip':<28}{'p50 ms':>9}{'p90 ms':>9}{'p50 / query':>13}")
        for name, values in (
            ("query state (baseline)", query_ms),
            ("update decide", update_ms),
            ("signal decide -> result", signal_ms),
        ):
            med = statistics.median(values)
            print(f"{name:<28}{med:>9.1f}{pct(values, 90):>9.1f}{med / base:>12.1f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, default=30)
    asyncio.run(main(parser.parse_args().gates))
