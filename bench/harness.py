"""What the API benches share: a dev server, Keel's settings on it, the API on loopback,
and starting thousands of workflows fast.

* :func:`dev_server`: a Temporal dev server (SQLite WAL) on a free loopback port in a
  temporary folder, stopped by its PID on exit;
* :func:`bench_settings`: ``Settings`` for that server, a fresh task queue and store;
* :func:`serve_api`: the API (``uvicorn`` on loopback, in this process) while the block
  runs; its base URL is what the block gets;
* :func:`bench_worker`: a worker of Keel's workflows and activities and ``FloorGate``
  (bench/floor.py) on ``settings.task_queue``;
* :func:`keel_processes`: the same worker and the API as two processes of their own, as
  ``keel up`` runs them (``keel worker`` with ``FloorGate``, ``keel api``), each started
  and stopped by its PID; its base URL is what the block gets;
* :func:`role_token`: the actor and bearer token of the first API token with a role;
* :func:`in_chunks`: run one coroutine per item, at most ``chunk`` at once
  (``asyncio.gather`` per chunk), and say how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from temporalio.client import Client
from temporalio.worker import Worker

from api.app import create_app
from bench.floor import FloorGate
from keel.settings import Settings
from services.processes import ManagedProcess, ServiceError, TemporalDevServer, free_port, tail
from workers.main import WORKFLOWS, build_activities

ROOT = Path(__file__).resolve().parents[1]

T = TypeVar("T")
R = TypeVar("R")


@contextlib.contextmanager
def dev_server(prefix: str) -> Iterator[tuple[TemporalDevServer, Path]]:
    """A dev server in a fresh temporary folder (also handed back for the store).

    SIGTERM to the bench ends it as Ctrl-C does (SystemExit through the ``finally``), so
    the server is stopped by its PID either way, not left running."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    server = TemporalDevServer(tmp / "t.db", tmp / "t.log", port=free_port(), ui_port=None)

    def terminated(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    server.start()
    try:
        yield server, tmp
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


def bench_settings(server: TemporalDevServer, tmp: Path, **overrides: Any) -> Settings:
    """Keel's settings on ``server``: test env, a fresh task queue, the store under ``tmp``."""
    values: dict[str, Any] = {
        "env": "test",
        "data_dir": tmp / "keel",
        "temporal_address": server.address,
        "task_queue": f"bench-{uuid.uuid4()}",
        "api_port": free_port(),
    }
    return Settings(**(values | overrides))


@contextlib.asynccontextmanager
async def serve_api(settings: Settings, client: Client) -> AsyncIterator[str]:
    """The API on ``127.0.0.1:settings.api_port`` in this process; yields its base URL."""
    api = uvicorn.Server(
        uvicorn.Config(
            create_app(settings, client=client),
            host="127.0.0.1",
            port=settings.api_port,
            log_level="warning",
        )
    )
    serving = asyncio.create_task(api.serve())
    try:
        while not api.started:
            if serving.done():
                serving.result()  # raises what stopped it
            await asyncio.sleep(0.05)
        yield f"http://127.0.0.1:{settings.api_port}"
    finally:
        api.should_exit = True
        await serving


async def in_chunks(
    items: Sequence[T], run: Callable[[T], Awaitable[R]], *, chunk: int = 200
) -> tuple[list[R], float]:
    """``run(item)`` for every item, ``chunk`` at a time; the results and seconds taken."""
    t0 = time.perf_counter()
    out: list[R] = []
    for i in range(0, len(items), chunk):
        out.extend(await asyncio.gather(*(run(x) for x in items[i : i + chunk])))
    return out, time.perf_counter() - t0


def bench_worker(client: Client, settings: Settings) -> Worker:
    """Keel's workflows and activities (``workers.main``) and ``FloorGate``."""
    from concurrent.futures import ThreadPoolExecutor

    return Worker(
        client,
        task_queue=settings.task_queue,
        workflows=[*WORKFLOWS, FloorGate],
        activities=build_activities(settings),
        # build_activities has sync activities (design.load), which need an executor.
        activity_executor=ThreadPoolExecutor(max_workers=8),
    )


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``KEEL_*`` variables that give a child process ``settings``' server, task queue,
    store and API port."""
    return {
        "KEEL_ENV": settings.env,
        "KEEL_DATA_DIR": str(settings.data_dir.resolve()),
        "KEEL_DATABASE_URL": settings.resolved_database_url,
        "KEEL_TEMPORAL_ADDRESS": settings.resolved_temporal_address,
        "KEEL_TEMPORAL_NAMESPACE": settings.temporal_namespace,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_API_HOST": "127.0.0.1",
        "KEEL_API_PORT": str(settings.api_port),
        "KEEL_WEBHOOK_URL": settings.webhook_url,
        "KEEL_METRICS_PORT": str(settings.metrics_port),
        "KEEL_OTEL_EXPORTER": settings.otel_exporter,
        "KEEL_WORKER_MAX_CACHED_WORKFLOWS": str(settings.worker_max_cached_workflows),
        "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH")] if p),
    }


WORKER_READY = "worker ready on task queue"
#: How bench/gate_worker.py logs a pause of its cycle collector.
GC_PAUSE_LOG = "cycle collector paused"


@contextlib.contextmanager
def keel_processes(settings: Settings, logs: Path, timeout_s: float = 120) -> Iterator[str]:
    """A worker process (``python -m bench.gate_worker``: ``keel worker`` with
    ``FloorGate``) and an API process (``python -m cli.keel api``: uvicorn on
    ``127.0.0.1:settings.api_port``) on ``settings``, their logs under ``logs``; yields the
    API's base URL. The worker is up (it logged that it polls) before the API starts, so
    the two do not migrate the store at once; both are stopped by their PIDs on exit."""
    env = settings_env(settings)
    worker = ManagedProcess(
        "worker", [sys.executable, "-m", "bench.gate_worker"], logs / "worker.log", env=env
    )
    api = ManagedProcess(
        "api", [sys.executable, "-m", "cli.keel", "api"], logs / "api.log", env=env
    )
    try:
        worker.start()
        deadline = time.monotonic() + timeout_s
        while WORKER_READY not in worker.log_path.read_text(errors="replace"):
            if not worker.running() or time.monotonic() > deadline:
                raise ServiceError(
                    f"the worker did not start (log {worker.log_path}):\n{tail(worker.log_path)}"
                )
            time.sleep(0.1)
        api.start()
        api.wait_port(settings.api_port, timeout_s)
        yield f"http://127.0.0.1:{settings.api_port}"
    finally:
        api.stop()
        worker.stop()


def role_token(settings: Settings, role: str) -> tuple[str, str]:
    """The actor and bearer token of the first of ``settings.api_tokens`` with ``role``."""
    tok = next(t for t in settings.api_tokens if role in t.roles)
    return tok.actor, tok.token.get_secret_value()
