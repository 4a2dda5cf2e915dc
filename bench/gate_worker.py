"""``keel worker`` with the floor's ``FloorGate`` beside Keel's workflows: the worker
process of bench/gate_concurrency.py (started by bench/harness.keel_processes).

    python -m bench.gate_worker   # settings from KEEL_* as for `keel worker`

The same code as ``keel worker`` (``cli.keel._run_worker``: LiteLLM loaded first, the
telemetry runtime, ``workers.main.build_worker`` with its executor and workflow cache,
stopped by SIGTERM), so the bare Updates and Keel's decisions are answered by the same
kind of process, as ``keel up`` runs it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.floor import FloorGate  # noqa: E402
from cli.keel import _run_worker, _setup_logging  # noqa: E402
from cli.toolkit import load_settings  # noqa: E402


def main() -> None:
    _setup_logging()
    settings = load_settings()
    settings.check_secrets()
    asyncio.run(_run_worker(settings, extra_workflows=[FloorGate]))


if __name__ == "__main__":
    main()
