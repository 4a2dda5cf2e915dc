"""Shared fixtures: one real Temporal dev server per test session, a fresh task queue per test.

Set ``KEEL_TEST_TEMPORAL_ADDRESS`` to run against an existing server instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from keel.settings import Settings
from workers.client import connect
from workers.main import build_worker
from workers.model_server import LocalModelServer, unavailable_reason
from workers.services import TemporalDevServer, free_port


@pytest.fixture(scope="session")
def temporal_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    existing = os.environ.get("KEEL_TEST_TEMPORAL_ADDRESS")
    if existing:
        yield existing
        return
    d = tmp_path_factory.mktemp("temporal")
    server = TemporalDevServer(
        db_file=d / "temporal.db", log_path=d / "temporal.log", port=free_port(), ui_port=None
    )
    server.start()
    try:
        yield server.address
    finally:
        server.stop()


@pytest.fixture
def settings(tmp_path: Path, temporal_address: str) -> Settings:
    """Settings for one test: its own data dir, SQLite file and task queue."""
    return Settings(
        env="test",
        data_dir=tmp_path / "keel",
        temporal_address=temporal_address,
        task_queue=f"keel-test-{uuid.uuid4()}",
        webhook_url="",
        # Exact origins only: a test that delivers webhooks allows its receiver's URL.
        webhook_allowed_prefixes=[],
        metrics_port=0,
    )


@pytest.fixture(scope="session")
async def client(temporal_address: str) -> Client:
    return await connect(Settings(temporal_address=temporal_address))


@pytest.fixture
async def worker(client: Client, settings: Settings) -> AsyncIterator[Worker]:
    """A running Keel worker on this test's task queue."""
    w = build_worker(client, settings)
    async with w:
        yield w


@pytest.fixture(scope="module")
def local_model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelServer]:
    """The embedded local model (llama.cpp) on a free port, one per test module.

    Only for tests that skip without llama_cpp: with llama_cpp installed the weights must be
    too, so a missing model is a failure here, not a skip.
    """
    assert unavailable_reason() is None, unavailable_reason()
    log = tmp_path_factory.mktemp("model-server") / "server.log"
    server = LocalModelServer(port=free_port(), threads=2, ctx=2048, log_path=log)
    server.start(timeout_s=180)
    try:
        yield server
    finally:
        server.stop()
    assert server.pid is None


@pytest.fixture
def mrp_settings(settings: Settings) -> Settings:
    """``settings`` with the test MRP operators config (shipped operators plus
    tests/support/mrp_operators: flaky, slow, expensive)."""
    from tests.support.mrp_operators import TEST_CONFIG

    return settings.model_copy(update={"mrp_config": TEST_CONFIG})


@pytest.fixture(scope="module")
def ray_for_module() -> Iterator[None]:
    """Shut Ray down after the module (``pytestmark = pytest.mark.usefixtures(...)``):
    the Ray backend starts it once in this process and keeps it for the next run."""
    yield
    from activities.fanout import ray_shutdown

    ray_shutdown()
