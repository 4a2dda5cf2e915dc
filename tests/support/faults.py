"""Helpers for fault tests: processes we start and must stop, audit rows, polling with deadlines.

Every process a fault test starts is registered with the ``spawned`` fixture, which stops
whatever still runs by its own PID (its process group) when the test ends, pass or fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from keel.records import GateAuditEvent
from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer, pid_alive
from store.db import make_engine, make_sessionmaker
from store.records import list_gate_events

REPO_ROOT = Path(__file__).resolve().parents[2]
GATE_EVENT_ACTIVITY = "records.gate_event"


def fault_settings(data_dir: Path, temporal_address: str) -> Settings:
    """Settings for one fault test: its own SQLite file and a fresh task queue."""
    return Settings(
        env="test",
        data_dir=data_dir,
        temporal_address=temporal_address,
        task_queue=f"keel-fault-{uuid.uuid4()}",
        webhook_url="",
        metrics_port=0,
        otel_exporter="none",
    )


def worker_env(settings: Settings, *, temporal_address: str | None = None) -> dict[str, str]:
    """The KEEL_* environment that makes ``python -m cli.keel worker`` match ``settings``."""
    return {
        "KEEL_ENV": settings.env,
        "KEEL_TEMPORAL_ADDRESS": temporal_address or settings.resolved_temporal_address,
        "KEEL_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_DATABASE_URL": settings.resolved_database_url,
        "KEEL_DATA_DIR": str(settings.data_dir),
        "KEEL_MODELS_CONFIG": str(settings.models_config),
        "KEEL_WEBHOOK_URL": "",
        "KEEL_METRICS_PORT": "0",
        "KEEL_OTEL_EXPORTER": "none",
        # The child imports Keel from this checkout whatever directory pytest runs in.
        "PYTHONPATH": str(REPO_ROOT),
    }


def audit_rows(settings: Settings, gate_id: str) -> list[GateAuditEvent]:
    """The gate's audit rows; none while the worker has not created the schema yet."""
    engine = make_engine(settings.resolved_database_url)
    try:
        return list_gate_events(make_sessionmaker(engine), gate_id)
    except OperationalError:  # no table yet: the worker process is still starting
        return []
    finally:
        engine.dispose()


async def wait_until(
    check: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float,
    what: str,
    interval_s: float = 0.05,
) -> None:
    """Poll ``check`` until it holds; fail the test with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f}s waiting for {what}")
        await asyncio.sleep(interval_s)


async def activity_events(handle: WorkflowHandle, event_type: EventType.ValueType) -> list[str]:
    """Activity type names of the ``event_type`` events in the workflow's history."""
    names: dict[int, str] = {}
    found: list[str] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[event.event_id] = (
                event.activity_task_scheduled_event_attributes.activity_type.name
            )
        if event.event_type != event_type:
            continue
        if event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            found.append(names[event.event_id])
        elif event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            found.append(names[event.activity_task_completed_event_attributes.scheduled_event_id])
    return found


@pytest.fixture
def spawned() -> Iterator[list[ManagedProcess | TemporalDevServer]]:
    """Register processes here before starting them; whatever still runs is stopped at the end.

    A process the test already killed and reaped is skipped: its PID may belong to
    someone else by now.
    """
    items: list[ManagedProcess | TemporalDevServer] = []
    yield items
    for item in reversed(items):
        proc = item.process if isinstance(item, TemporalDevServer) else item
        if proc is not None and proc.running():
            with contextlib.suppress(Exception):
                item.stop()


def spawn_worker(
    settings: Settings,
    log_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
    *,
    temporal_address: str | None = None,
) -> ManagedProcess:
    worker = ManagedProcess(
        "keel worker",
        [sys.executable, "-m", "cli.keel", "worker"],
        log_path=log_path,
        env=worker_env(settings, temporal_address=temporal_address),
    )
    spawned.append(worker)
    worker.start()
    return worker


async def spawn_ready_worker(
    settings: Settings,
    log_path: Path,
    spawned: list[ManagedProcess | TemporalDevServer],
    *,
    temporal_address: str | None = None,
) -> ManagedProcess:
    """:func:`spawn_worker`, then wait until it polls (its schema migrated, worker ready)."""
    worker = spawn_worker(settings, log_path, spawned, temporal_address=temporal_address)
    await wait_until(
        lambda: not worker.running() or "worker ready" in log_path.read_text(errors="replace"),
        timeout_s=120,
        what="the worker process to start (schema migrated)",
    )
    assert worker.running(), f"worker exited early:\n{log_path.read_text()}"
    return worker


def sigkill(worker: ManagedProcess) -> None:
    """SIGKILL the worker's whole process group and check that nothing of it is left."""
    assert worker.proc is not None
    pgid = worker.pid
    os.killpg(pgid, signal.SIGKILL)
    assert worker.proc.wait(timeout=10) == -signal.SIGKILL
    assert not pid_alive(pgid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
