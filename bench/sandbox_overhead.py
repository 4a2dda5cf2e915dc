"""What the jail costs per run, against starting the same interpreter bare.

    uv run python bench/sandbox_overhead.py [--runs 30]

Measured on this machine, one run at a time, after one warm-up run of each:

* bare: ``<python> -I -c pass`` as a subprocess (the interpreter the jail would use);
* jailed program: the same command through ``sandbox.run_async`` (nsjail, mounts,
  seccomp, cgroups where set, run directory made and removed);
* jailed block: ``run_python_block_async("y = x + 1")``, the path ``.rllm`` blocks take
  (runner, inputs and result file as JSON).

Prints the median and p90 of each in ms and each jailed median as a ratio to bare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import run_async, run_python_block_async
from sandbox.python_block import python_runtime


async def _timed(fn: Callable[[], Awaitable[object]], runs: int) -> list[float]:
    await fn()  # warm-up: the per-process probe and the page cache
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t0) * 1000)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    args = ap.parse_args()
    rt = python_runtime()

    async def bare() -> None:
        subprocess.run([rt.executable, "-I", "-c", "pass"], check=True)

    async def jailed() -> None:
        r = await run_async([rt.executable, "-I", "-c", "pass"], binds=rt.binds)
        assert r.ok, r

    async def block() -> None:
        r = await run_python_block_async("y = x + 1", inputs={"x": 1}, outputs=["y"])
        assert r.ok and r.outputs == {"y": 2}, r

    rows = [
        ("bare python -c", await _timed(bare, args.runs)),
        ("jailed python -c", await _timed(jailed, args.runs)),
        ("jailed block", await _timed(block, args.runs)),
    ]
    base = statistics.median(rows[0][1])
    print(f"interpreter: {rt.executable}; runs: {args.runs}")
    for name, xs in rows:
        med = statistics.median(xs)
        p90 = statistics.quantiles(xs, n=10)[-1]
        print(f"{name:18s} median {med:6.1f} ms  p90 {p90:6.1f} ms  x{med / base:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
