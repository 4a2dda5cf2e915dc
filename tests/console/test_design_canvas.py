"""Issue 38 §6 in headless Chromium: the canvas is the open session's while it runs (it
said "No design session yet." beside a running session until the run completed), and
the cost and policy show there once the run has them, before it ends."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from keel.settings import Settings
from tests.console.test_console import (  # noqa: F401 (fixtures)
    api,
    console_url,
    page,
    sign_in,
)
from tests.console.test_design_console import EXTRACTED, FIRST_EVENT_WAIT_MS, start_session
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker


@pytest.fixture
async def worker(client: Client, settings: Settings, tmp_path: Path) -> AsyncIterator[Worker]:
    """The worker, its intake model answered by the scripted server."""
    reply = json.dumps({"constraints": EXTRACTED, "ambiguous": {}})
    with ScriptedOpenAIServer(default=ScriptedReply(content=reply)) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings) as w:
            yield w


async def test_the_canvas_shows_the_running_session(
    console_url: str,  # noqa: F811
    api: httpx.AsyncClient,  # noqa: F811
    page: Any,  # noqa: F811 (last: the browser closes its stream before the server stops)
) -> None:
    project = f"canvas-{uuid.uuid4().hex[:6]}"
    await sign_in(page, console_url, "alice")
    assert "No design session yet" in await page.locator("#right").inner_text()
    await start_session(page, project)
    question = page.locator("#timeline li.event-questions")
    regions = question.get_by_role("textbox")
    await regions.wait_for(timeout=FIRST_EVENT_WAIT_MS)
    # Waiting for answers: the canvas names the session, not "no session".
    right = await page.locator("#right").inner_text()
    assert "No design session yet" not in right and project in right
    assert await page.locator("#canvas-empty").is_hidden()
    await regions.fill("us-east-1")
    await question.get_by_role("button", name="Send answers").click()
    # At the gate the run is not over, and the canvas already has its cost and policy.
    gate = page.locator("#timeline li.event-gate-waiting")
    await gate.get_by_role("button", name="Approve plan").wait_for()
    await page.locator("#cost-section").wait_for(state="visible")
    assert "a month" in await page.locator("#cost-total").inner_text()
    assert "policy: " in await page.locator("#reports-list").inner_text()
    assert await page.locator("#ds-status").inner_text() != "completed"
