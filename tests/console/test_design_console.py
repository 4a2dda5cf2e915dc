"""The console's design panels in headless Chromium, against the API on a loopback port, the
session's dev server and a real worker whose intake model is the scripted OpenAI server.

One session from free text to a downloaded repository: a question answered inline (a
refused value first), Reason Cards streaming in, a page reload that neither loses nor
repeats a card, the requester's own approval refused, a rejection with a comment and a
second planner round, approval, codegen as a second decision set, a file and its diff
opened, the zip fetched from its signed link. Screenshots of the centre and right panels
in light and dark mode go to ``test-artifacts/console/``; axe-core checks each.
"""

from __future__ import annotations

import io
import json
import re
import uuid
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import expect
from temporalio.client import Client
from temporalio.worker import Worker

from keel.design.steps import VALIDATORS
from keel.settings import Settings
from tests.console.test_console import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    api,
    check_accessibility,
    console_url,
    page,
    sign_in,
)
from tests.support.api import assert_error, auth
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

#: What the scripted intake model extracts: regions and budget stay open, so the pipeline
#: asks for regions (tests/design/integration/test_api.py, PARTIAL_FORM).
EXTRACTED = {"cloud": "aws", "workload_types": ["batch"], "data_classification": "internal"}
REQUIREMENTS = "Nightly batch training of a churn model on AWS; internal data only."
CODEGEN_WAIT_MS = 240_000
#: The validators the console's codegen round runs (in VALIDATORS' order).
CHOSEN_VALIDATORS = ("ruff", "hcl", "wiring")
FIRST_EVENT_WAIT_MS = 90_000


@pytest.fixture
async def worker(client: Client, settings: Settings, tmp_path: Path) -> AsyncIterator[Worker]:
    """The worker, its intake model answered by the scripted server."""
    reply = json.dumps({"constraints": EXTRACTED, "ambiguous": {}})
    with ScriptedOpenAIServer(default=ScriptedReply(content=reply)) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        w = build_worker(client, settings)
        async with w:
            yield w


async def panels(pg: Any, name: str) -> None:
    """Screenshots of the centre and right panels in light and dark mode, each checked
    by axe-core; the two modes must look different."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    backgrounds = []
    for scheme in ("light", "dark"):
        await pg.emulate_media(color_scheme=scheme)
        for panel in ("centre", "right"):
            await pg.locator(f"#{panel}").screenshot(
                path=str(ARTIFACTS / f"{name}-{panel}-{scheme}.png")
            )
        backgrounds.append(await pg.evaluate("getComputedStyle(document.body).backgroundColor"))
        await check_accessibility(pg, f"{name} ({scheme})")
    await pg.emulate_media(color_scheme="light")
    assert backgrounds[0] != backgrounds[1], backgrounds


async def seqs(pg: Any) -> list[int]:
    return [int(s) for s in await pg.locator("#timeline > li").evaluate_all(
        "els => els.map(e => e.dataset.seq)"
    )]  # fmt: skip


async def start_session(pg: Any, project: str) -> None:
    """Start a design session from the console's form, the repository not generated."""
    await pg.get_by_role("button", name="New design session").click()
    await pg.get_by_label("Project").fill(project)
    await pg.get_by_label("Requirements").fill(REQUIREMENTS)
    await pg.get_by_label("Generate the repository once the plan is approved").uncheck()
    await pg.get_by_role("button", name="Start session").click()


async def test_design_session_from_text_to_repository(
    console_url: str,  # noqa: F811
    api: httpx.AsyncClient,  # noqa: F811
    page: Any,  # noqa: F811 (last: the browser closes its stream before the server stops)
) -> None:
    project = f"churn-{uuid.uuid4().hex[:6]}"
    await sign_in(page, console_url, "alice")
    await start_session(page, project)

    # The intake left regions open: the question comes inline; a bad value is refused
    # in the API's words and nothing changes.
    question = page.locator("#timeline li.event-questions")
    regions = question.get_by_role("textbox")
    # The first intake in a fresh worker process imports LiteLLM: allow it time.
    await regions.wait_for(timeout=FIRST_EVENT_WAIT_MS)
    assert await regions.get_attribute("name") == "regions"
    assert 0 < await page.locator("#coverage-meter").evaluate("m => m.value") < 1
    await regions.fill("Mars 1")
    await question.get_by_role("button", name="Send answers").click()
    refusal = question.locator(".refusal")
    await refusal.wait_for()
    assert (await refusal.inner_text()).startswith("Refused: ") and "region" in (
        await refusal.inner_text()
    )
    await regions.fill("us-east-1")
    await question.get_by_role("button", name="Send answers").click()
    await page.locator("#timeline li.event-answers").wait_for()

    # Cards stream in up to the gate; a Reason Card opens to its candidates.
    gate = page.locator("#timeline li.event-gate-waiting")
    await gate.get_by_role("button", name="Approve plan").wait_for()
    assert await page.locator("#timeline li.event-reason-card").count() >= 2
    for kind in ("plan-ready", "cost-update", "policy-update", "coverage-update"):
        assert await page.locator(f"#timeline li.event-{kind}").count() >= 1, kind
    card = page.locator("#timeline li.event-reason-card").first
    await card.locator("summary").click()
    await card.get_by_text("Candidates").wait_for()
    assert await page.evaluate("document.querySelector('#coverage-meter').value") >= 0.8

    # A reload resumes the session: the same cards, once each, in seq order.
    before = await seqs(page)
    assert before == list(range(len(before)))
    await page.reload()
    await gate.get_by_role("button", name="Approve plan").wait_for()
    after = await seqs(page)
    assert after == before, (before, after)

    # alice requested the gate: her approval is refused as the API words it.
    await gate.get_by_role("button", name="Approve plan").click()
    refused = gate.locator(".refusal")
    await refused.wait_for()
    assert await refused.inner_text() == "Refused: alice requested this gate and cannot decide it"
    await panels(page, "design-session")
    ds = (await page.locator("#ds-heading").inner_text()).split(" / ")[1]

    # An admin opens alice's session from the left panel and rejects with a comment:
    # the planner runs again.
    await sign_in(page, console_url, "root")
    await page.get_by_role("button", name="New design session").click()
    await page.locator(f'button[data-ds="{ds}"]').click()
    await gate.get_by_label("Comment").fill("too expensive, cut the cost")
    await gate.get_by_role("button", name="Reject plan").click()
    await page.locator("#timeline li.event-plan-ready").nth(1).wait_for()
    assert "rejected by root" in await page.locator("#timeline li.event-approval").inner_text()
    second_gate = gate.nth(1)
    await second_gate.get_by_role("button", name="Approve plan").click()
    done = page.locator("#timeline li.event-run-complete")
    await done.wait_for()
    assert "completed" in await done.inner_text()
    stored = (await api.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))).json()
    assert await seqs(page) == [e["seq"] for e in stored["events"]]
    assert [e["type"] for e in stored["events"]].count("plan-ready") == 2

    # Codegen: a second decision set whose previous is the planned one, with three of the
    # validators chosen (this test is about the console; every validator runs on the
    # generated shapes in tests/design/integration/test_validators.py).
    await page.locator("#generate-validators summary").click()
    await check_accessibility(page, "the validators to run, open")
    await page.locator("#session-actions").screenshot(path=str(ARTIFACTS / "design-generate.png"))
    for box in await page.locator('#generate-validators input[name="validator"]').all():
        if await box.get_attribute("value") not in CHOSEN_VALIDATORS:
            await box.uncheck()
    await page.get_by_role("button", name="Generate the repository").click()
    # A locator wait: wait_for_function's string predicate is compiled by eval in the
    # page, which the console's CSP (script-src 'self') refuses once it polls.
    await expect(page.locator("#ds-heading")).not_to_have_text(
        re.compile(re.escape(ds) + "$"), timeout=30_000
    )
    code_ds = (await page.locator("#ds-heading").inner_text()).split(" / ")[1]
    await page.locator("#timeline li.event-run-complete").wait_for(timeout=CODEGEN_WAIT_MS)
    readme = page.get_by_role("button", name="Open README.md", exact=True)
    await readme.wait_for()
    await readme.click()
    viewer = page.locator("#viewer-text")
    await page.locator("#viewer-title").get_by_text("README.md").wait_for()
    await page.locator("#viewer-text[data-kind=file]").wait_for()
    shown = await viewer.text_content()
    assert "Against " + ds in await page.locator("#diff-against").inner_text()
    await panels(page, "design-canvas")
    await page.get_by_role("button", name="Diff of README.md").click()
    await page.locator("#viewer-title").get_by_text("Diff of README.md").wait_for()
    await page.locator("#viewer-text[data-kind=diff]").wait_for()
    diff = await viewer.text_content()
    assert diff.startswith("--- /dev/null\n+++ " + code_ds + "/README.md")

    # The zip from the page's signed link (no token), holding what the viewer showed.
    href = await page.locator("#download-link").get_attribute("href")
    async with httpx.AsyncClient() as anonymous:
        got = await anonymous.get(href)
    assert got.status_code == 200 and got.headers["content-type"] == "application/zip"
    archive = zipfile.ZipFile(io.BytesIO(got.content))
    assert archive.read("README.md").decode() == shown
    files = (await api.get(f"/design/decision-sets/{code_ds}/files", headers=auth("alice"))).json()
    assert [f["path"] for f in files["files"]] == sorted(archive.namelist())
    assert files["previous_decision_set"] == ds
    # The run ran the three chosen; the others were not selected.
    code = (await api.get(f"/design/decision-sets/{code_ds}", headers=auth("alice"))).json()
    summary = code["validation"]["summary"]
    assert {n: st for n, st in summary.items() if st != "not_run"} == dict.fromkeys(
        CHOSEN_VALIDATORS, "passed"
    ), summary

    # The console's own routes keep the design routes' scoping.
    for path in (
        f"/design/decision-sets/{code_ds}/files",
        f"/design/decision-sets/{code_ds}/files/README.md",
        f"/design/decision-sets/{code_ds}/diff",
        f"/design/decision-sets/{code_ds}/diff/README.md",
        f"/design/projects/{project}/decision-sets",
    ):
        assert_error(await api.get(path, headers=auth("carol")), 404, "not_found")
    listed = (
        await api.get(f"/design/projects/{project}/decision-sets", headers=auth("alice"))
    ).json()
    assert {d["id"] for d in listed["decision_sets"]} == {ds, code_ds}
    assert_error(
        await api.get(f"/design/decision-sets/{code_ds}/files/nope.txt", headers=auth("alice")),
        404,
        "not_found",
    )
    # A planned-only set has no repository to list.
    assert_error(
        await api.get(f"/design/decision-sets/{ds}/files", headers=auth("alice")), 404, "not_found"
    )


def test_the_consoles_validators_are_keels() -> None:
    """The Generate panel offers every validator, in Keel's order, each checked."""
    html = (Path(__file__).resolve().parents[2] / "api" / "ui" / "index.html").read_text()
    boxes = re.findall(r'<input type="checkbox" name="validator" value="([a-z]+)" checked>', html)
    assert tuple(boxes) == VALIDATORS
