"""``keel worker`` with the floor's ``FloorGate`` beside Keel's workflows: the worker
process of bench/gate_concurrency.py (started by bench/harness.keel_processes).

    python -m bench.gate_worker   # settings from KEEL_* as for `keel worker`

The same code as ``keel worker`` (``cli.keel._run_worker``: LiteLLM loaded first, the
telemetry runtime, ``workers.main.build_worker`` with its executor and workflow cache,
stopped by SIGTERM), so the bare Updates and Keel's decisions are answered by the same
kind of process, as ``keel up`` runs it. Each pause of the cycle collector of 100 ms or
more is logged (``GC_PAUSE_LOG``, its start on ``time.perf_counter``'s clock, which is
CLOCK_MONOTONIC and so the bench's too), for the bench to tell which decisions it stalled.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.floor import FloorGate  # noqa: E402
from bench.harness import GC_PAUSE_LOG  # noqa: E402
from cli.keel import _run_worker, _setup_logging  # noqa: E402
from cli.toolkit import load_settings  # noqa: E402

GC_PAUSE_MIN_S = 0.1


def log_gc_pauses() -> None:
    """Log each collection that stops the process for ``GC_PAUSE_MIN_S`` or more."""
    started = 0.0

    def callback(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
            return
        took = time.perf_counter() - started
        if took >= GC_PAUSE_MIN_S:
            print(
                f"{GC_PAUSE_LOG} {took * 1000:.0f} ms at {started:.3f} (generation"
                f" {info['generation']}, {info['collected']} objects collected)",
                file=sys.stderr,
                flush=True,
            )

    gc.callbacks.append(callback)


def main() -> None:
    log_gc_pauses()
    _setup_logging()
    settings = load_settings()
    settings.check_secrets()
    asyncio.run(_run_worker(settings, extra_workflows=[FloorGate]))


if __name__ == "__main__":
    main()
