"""MRP's fixtures: its operators config, Ray's shutdown, the API with job roots."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from api.app import create_app
from keel.settings import Settings
from tests.support.api import asgi_client, with_tokens
from workers.main import build_worker

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "mrp"


@pytest.fixture
def mrp_settings(settings: Settings) -> Settings:
    """``settings`` with the test MRP operators config (shipped operators plus
    tests/support/mrp_operators: flaky, slow, expensive)."""
    from tests.support.mrp_operators import TEST_CONFIG

    return settings.model_copy(update={"mrp_config": TEST_CONFIG})


@pytest.fixture(scope="module")
def ray_for_module() -> Iterator[None]:
    """Shut Ray down after the module (``pytestmark = pytest.mark.usefixtures(...)``):
    the Ray backend starts it once in this process and keeps it for the next run. (Kept
    for the session it saved its starts but left two idle clusters running beside every
    other test; the clean-clone suite was not faster.)"""
    yield
    from activities.fanout import ray_shutdown

    ray_shutdown()


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    """The API callers, and the shipped examples as the one job root."""
    return with_tokens(settings, mrp_job_roots=[EXAMPLES])


@pytest.fixture
async def http(api_settings: Settings, client: Client) -> AsyncIterator[httpx.AsyncClient]:
    """The API in process over a worker that sees the job roots too."""
    async with (
        build_worker(client, api_settings),
        asgi_client(create_app(api_settings, client=client)) as c,
    ):
        yield c
