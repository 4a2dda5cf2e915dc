"""Helpers of the volume benches (``bench/mrp_scale.py``, ``bench/srl_scale.py``):
history sizes counted from the server, and a real ``keel worker`` subprocess."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from keel.settings import Settings
from services.processes import ManagedProcess
from tests.support.faults import descendants, running

ROOT = Path(__file__).resolve().parents[1]


async def chain_events(
    client: Client, workflow_id: str, first_run_id: str
) -> AsyncIterator[tuple[str, HistoryEvent]]:
    """``("<workflow id>/<run id>", event)`` for every event of every run of
    ``workflow_id`` from ``first_run_id`` on (its continue-as-new chain) and of every
    child any of them started, recursively."""
    pending: list[tuple[str, str]] = [(workflow_id, first_run_id)]
    while pending:
        wid, run_id = pending.pop()
        handle = client.get_workflow_handle(wid, run_id=run_id)
        async for e in handle.fetch_history_events():
            yield f"{wid}/{run_id}", e
            if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = e.child_workflow_execution_started_event_attributes.workflow_execution
                pending.append((child.workflow_id, child.run_id))
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = e.workflow_execution_continued_as_new_event_attributes
                pending.append((wid, attrs.new_execution_run_id))


async def history_sizes(client: Client, workflow_id: str, first_run_id: str) -> dict[str, int]:
    """Events of each run in :func:`chain_events`: ``{"<workflow id>/<run id>": events}``."""
    sizes: dict[str, int] = {}
    async for run, _ in chain_events(client, workflow_id, first_run_id):
        sizes[run] = sizes.get(run, 0) + 1
    return sizes


def history_line(sizes: dict[str, int], limit: int = 10_000) -> str:
    """``histories: N (runs and children), largest E events (<id>); all under LIMIT: yes``."""
    largest = max(sizes, key=lambda k: sizes[k])
    under = all(v < limit for v in sizes.values())
    return (
        f"histories: {len(sizes)} (runs and children), largest {sizes[largest]} events "
        f"({largest.split('/')[0]}); every one under {limit:,}: {'yes' if under else 'NO'}"
    )


def keel_worker(settings: Settings, log: Path, extra_env: dict[str, str]) -> ManagedProcess:
    """Start ``python -m cli.keel worker`` (its own process group) matching ``settings``."""
    env = {
        "KEEL_ENV": settings.env,
        "KEEL_TEMPORAL_ADDRESS": settings.resolved_temporal_address,
        "KEEL_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_DATABASE_URL": settings.resolved_database_url,
        "KEEL_DATA_DIR": str(settings.data_dir),
        "KEEL_WEBHOOK_URL": "",
        "KEEL_METRICS_PORT": "0",
        "KEEL_OTEL_EXPORTER": "none",
        "PYTHONPATH": str(ROOT),
    } | extra_env
    worker = ManagedProcess(
        "keel worker", [sys.executable, "-m", "cli.keel", "worker"], log_path=log, env=env
    )
    worker.start()
    return worker


async def wait_ready(worker: ManagedProcess, log: Path, timeout_s: float = 180) -> None:
    """Until the worker logs ``worker ready`` (schema migrated, polling)."""
    deadline = time.monotonic() + timeout_s
    while "worker ready" not in log.read_text(errors="replace"):
        if not worker.running():
            raise SystemExit(f"keel worker exited early:\n{log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            raise SystemExit(f"keel worker not ready after {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


def _tree(pid: int) -> set[int]:
    """``pid`` and every live descendant (from /proc)."""
    return descendants(pid) | {pid}


def _ray_dirs(tree: set[int]) -> set[str]:
    """The Ray temp dirs (``/tmp/keel-ray-*``) that processes of ``tree`` name."""
    cmdlines = []
    for p in tree:
        with contextlib.suppress(OSError):
            cmdlines.append(Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace"))
    return {m for c in cmdlines for m in re.findall(r"/tmp/keel-ray-[A-Za-z0-9_]+", c)}


def stop_worker(worker: ManagedProcess) -> None:
    """Stop a worker that still runs (SIGTERM, then SIGKILL, to its group) and remove
    the Ray temp dir it started, should it not have removed it itself."""
    if worker.proc is None or worker.proc.poll() is not None:
        return
    ray_dirs = _ray_dirs(_tree(worker.pid))
    worker.stop()
    for d in ray_dirs:
        shutil.rmtree(d, ignore_errors=True)


async def kill9(worker: ManagedProcess, timeout_s: float = 30) -> None:
    """SIGKILL the worker's process group (it, its Ray cluster, Ray's workers); wait,
    bounded, until all of them are gone; remove the Ray temp dir it cannot remove."""
    tree = _tree(worker.pid)
    ray_dirs = _ray_dirs(tree)
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.proc is not None
    await asyncio.to_thread(worker.proc.wait, 10)
    deadline = time.monotonic() + timeout_s
    while any(running(p) for p in tree):
        if time.monotonic() > deadline:
            raise SystemExit(f"processes of the killed worker still run: {sorted(tree)}")
        await asyncio.sleep(0.05)
    for d in ray_dirs:
        shutil.rmtree(d, ignore_errors=True)
