"""The console on a decision set whose generated repository failed a validator, in
headless Chromium against the API, the session's dev server and a real worker whose
codegen model (the scripted OpenAI server) answers a repository with an unencrypted S3
bucket: the timeline says which validator failed and what to do, the status reads
``validation_failed`` and the download link is marked as failing, yet still serves the
archive. Screenshots go to ``test-artifacts/console/``; axe-core checks the page.
"""

from __future__ import annotations

import io
import json
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.worker import Worker

from keel.settings import Settings
from tests.console.test_console import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    api,
    check_accessibility,
    console_url,
    page,
    sign_in,
)
from tests.support.api import auth
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

FORM = {
    "cloud": "aws",
    "workload_types": ["batch"],
    "data_classification": "internal",
    "budget_band": "medium",
    "regions": ["us-east-1"],
}
UNENCRYPTED_BUCKET = 'resource "aws_s3_bucket" "raw" {\n  bucket = "raw-data"\n}\n'
CODEGEN_WAIT_MS = 300_000


@pytest.fixture
async def worker(client: Client, settings: Settings, tmp_path: Path) -> AsyncIterator[Worker]:
    """The worker, its codegen model answering a repository that fails checkov."""
    from activities.design.codegen import render_request
    from tests.design.codegen_cases import request_for

    tree = render_request(request_for("batch_training"))
    tree["infra/ingest/raw.tf"] = UNENCRYPTED_BUCKET
    reply = ScriptedReply(content=json.dumps({"files": tree}))
    with ScriptedOpenAIServer(default=reply) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        async with build_worker(client, settings) as w:
            yield w


async def test_a_failing_repository_is_shown_failing_and_still_downloads(
    console_url: str,  # noqa: F811
    api: httpx.AsyncClient,  # noqa: F811
    page: Any,  # noqa: F811 (last: the browser closes its stream before the server stops)
) -> None:
    project = f"vf-{uuid.uuid4().hex[:6]}"
    made = await api.post(
        "/design/projects", json={"id": project, "name": "Failing"}, headers=auth("alice")
    )
    assert made.status_code == 201, made.text
    started = await api.post(
        f"/design/projects/{project}/constraints",
        json={
            "intake": FORM,
            "require_approval": False,
            "codegen": "litellm",
            "codegen_model": "local",
            # The failing one and two that pass (the jailed ones would find nothing here);
            # the others are shown not run.
            "validators": ["checkov", "hcl", "wiring"],
        },
        headers=auth("alice"),
    )
    assert started.status_code == 202, started.text
    ds = started.json()["decision_set_id"]

    await sign_in(page, console_url, "alice")
    await page.get_by_role("button", name="New design session").click()
    await page.locator(f'button[data-ds="{ds}"]').click()
    done = page.locator("#timeline li.event-run-complete")
    await done.wait_for(timeout=CODEGEN_WAIT_MS)
    text = await done.inner_text()
    assert "validation_failed" in text and "marked as failing" in text, text
    failed = page.locator("#timeline li.event-validation .status-validation_failed")
    assert await failed.inner_text() == "Validation failed: checkov."

    link = page.locator("#download-link")
    # A locator wait: wait_for_function's predicate is compiled by eval in the page,
    # which the console's CSP (script-src 'self') refuses once it polls.
    await page.locator("#download-link.failing").wait_for(timeout=30_000)
    assert await link.inner_text() == "Download the repository (zip): fails validation (checkov)"
    assert await page.locator("#download-row").get_attribute("data-validation") == "failed"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.locator("#right").screenshot(path=str(ARTIFACTS / "design-validation-failed.png"))
    await check_accessibility(page, "validation failed")

    href = await link.get_attribute("href")
    async with httpx.AsyncClient() as anonymous:
        got = await anonymous.get(href)
    assert got.status_code == 200 and got.headers["x-keel-validation"] == "failed"
    archive = zipfile.ZipFile(io.BytesIO(got.content))
    assert archive.read("infra/ingest/raw.tf").decode() == UNENCRYPTED_BUCKET
