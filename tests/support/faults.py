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
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle

from keel.records import GateAuditEvent
from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer, group_exists
from store.db import make_engine, make_sessionmaker
from store.records import list_gate_events

REPO_ROOT = Path(__file__).resolve().parents[2]
GATE_EVENT_ACTIVITY = "records.gate_event"
# How long a killed process and what it started may take to be gone (torn down, reaped).
GONE_TIMEOUT_S = 30.0


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


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, process group) of ``pid`` from /proc, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def descendants(pid: int) -> set[int]:
    """PIDs of every live descendant of ``pid``, in its process group or not (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[1], []).append(int(entry))
    out: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def running(pid: int) -> bool:
    """The process exists and has not exited: a zombie (dead, not yet reaped by its
    parent) counts as gone."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def _survivors(pids: Iterable[int], pgid: int | None) -> list[str]:
    found = {p for p in pids if running(p)}
    if pgid is not None:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and (st := _stat(int(entry))) is not None and st[2] == pgid:
                found.add(int(entry))
    return [f"{p} {(_stat(p) or ('gone',))[0]} {cmdline(p)[:200]}" for p in sorted(found)]


async def wait_gone(
    pids: Iterable[int] = (),
    *,
    pgid: int | None = None,
    timeout_s: float = GONE_TIMEOUT_S,
    what: str,
) -> None:
    """Wait until none of ``pids`` runs and process group ``pgid`` is empty (every member
    reaped); fail naming the survivors after ``timeout_s``.

    Killed processes are not gone at once: the kernel tears each one down, and one whose
    parent died is reaped by init a moment later; so every check that something is gone
    waits for it, with a bound.
    """
    watched = set(pids)

    def gone() -> bool:
        return not any(running(p) for p in watched) and (pgid is None or not group_exists(pgid))

    deadline = time.monotonic() + timeout_s
    while not gone():
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s:.0f}s waiting for {what}; still there:\n"
                + "\n".join(_survivors(watched, pgid))
            )
        await asyncio.sleep(0.05)


def wait_gone_sync(pids: Iterable[int], *, timeout_s: float = GONE_TIMEOUT_S, what: str) -> None:
    """:func:`wait_gone` for synchronous tests (processes only)."""
    watched = set(pids)
    deadline = time.monotonic() + timeout_s
    while any(running(p) for p in watched):
        if time.monotonic() > deadline:
            pytest.fail(
                f"timed out after {timeout_s:.0f}s waiting for {what}; still there:\n"
                + "\n".join(_survivors(watched, None))
            )
        time.sleep(0.05)


async def sigkill(worker: ManagedProcess, *, timeout_s: float = GONE_TIMEOUT_S) -> None:
    """SIGKILL the worker's whole process group; wait (bounded) until the group is empty
    and every process the worker had started, in its group or not (the jail, a host
    tool, Ray), is gone with it."""
    assert worker.proc is not None
    pgid = worker.pid
    started = descendants(pgid)
    os.killpg(pgid, signal.SIGKILL)
    assert await asyncio.to_thread(worker.proc.wait, 10) == -signal.SIGKILL
    await wait_gone(
        started, pgid=pgid, timeout_s=timeout_s,
        what=f"the killed worker's process group {pgid} and its children to be gone",
    )  # fmt: skip


async def activity_attempts(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, int]]:
    """``(activity type, attempt)`` of each started activity in ``handle``'s history, in
    history order (an activity retried on another worker shows its later attempt)."""
    names: dict[int, str] = {}
    out: list[tuple[str, int]] = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names[event.event_id] = (
                event.activity_task_scheduled_event_attributes.activity_type.name
            )
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            a = event.activity_task_started_event_attributes
            out.append((names[a.scheduled_event_id], a.attempt))
    return out
