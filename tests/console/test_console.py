"""The Keel console in a real browser: Debian's headless Chromium driven by Playwright,
against the API served by uvicorn on a loopback port over the session's dev server and a
real worker.

Screenshots of each panel in light and dark mode go to ``test-artifacts/console/``
(git-ignored); axe-core (vendored, ``tests/support/axe/``) checks each view for serious
or critical accessibility violations. The console's Content-Security-Policy stays on:
a policy refusal or a script error on the page fails the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.async_api import async_playwright
from temporalio.client import Client
from temporalio.worker import Worker

from api.app import create_app
from keel.settings import Settings
from services.processes import free_port
from services.up import ui_link
from tests.srl.conftest import HAND_TASKS
from tests.support.api import auth, open_gate, token

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "console"
AXE = ROOT / "tests" / "support" / "axe" / "axe.min.js"
AXE_SHA256 = "880970c081707360e64f34cea25ff91892f5bc95675b0776925b9709dd8a68bb"
WAIT_MS = 20_000


@pytest.fixture
async def console_url(api_settings: Settings, client: Client, worker: Worker) -> AsyncIterator[str]:
    """The API (and so the console) served by uvicorn on a loopback port."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(api_settings, client=client),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
        )
    )
    serving = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.05)
    assert server.started, "uvicorn did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


@pytest.fixture
async def api(console_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A plain HTTP client of the same server, for what the test does beside the page."""
    async with httpx.AsyncClient(base_url=console_url) as c:
        yield c


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Any]:
    """A page in a fresh Chromium profile at 1280x800."""
    assert CHROMIUM.exists(), "no /usr/bin/chromium: run scripts/bootstrap.sh as root"
    async with async_playwright() as pw:
        context = await pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1280, "height": 800},
        )
        # axe-core as an init script: a script tag (page.add_script_tag) is inline code,
        # which the console's Content-Security-Policy refuses, and bypassing the policy
        # would leave it untested. The page's own errors and policy refusals are collected.
        assert hashlib.sha256(AXE.read_bytes()).hexdigest() == AXE_SHA256
        await context.add_init_script(path=str(AXE))
        errors: list[str] = []
        try:
            page = context.pages[0] if context.pages else await context.new_page()
            page.set_default_timeout(WAIT_MS)
            page.on("pageerror", lambda err: errors.append(f"page error: {err}"))
            page.on(
                "console",
                lambda msg: (
                    errors.append(msg.text) if "Content Security Policy" in msg.text else None
                ),
            )
            yield page
        finally:
            await context.close()
        assert not errors, errors


async def sign_in(page: Any, url: str, actor: str) -> None:
    """Enter ``actor``'s token in the settings and save it."""
    await page.goto(f"{url}/ui")
    await page.get_by_role("button", name="Settings").click()
    await page.get_by_label("API token").fill(token(actor))
    await page.get_by_role("button", name="Save token").click()
    await page.wait_for_selector("#view-inbox:not([hidden])")


async def snapshot(page: Any, name: str) -> None:
    """Screenshots of the page in light and dark mode; both must differ."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    backgrounds = []
    for scheme in ("light", "dark"):
        await page.emulate_media(color_scheme=scheme)
        await page.screenshot(path=str(ARTIFACTS / f"{name}-{scheme}.png"), full_page=True)
        backgrounds.append(await page.evaluate("getComputedStyle(document.body).backgroundColor"))
        await check_accessibility(page, f"{name} ({scheme})")
    await page.emulate_media(color_scheme="light")
    assert backgrounds[0] != backgrounds[1], backgrounds


async def check_accessibility(page: Any, where: str) -> None:
    """axe-core finds no serious or critical violation on the page as it is."""
    assert await page.evaluate("typeof window.axe !== 'undefined'"), "axe-core is not loaded"
    result = await page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    bad = [
        f"{v['id']} ({v['impact']}): {[n['target'] for n in v['nodes']]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]
    assert not bad, f"{where}: {bad}"


async def test_inbox_approve_with_comment_and_a_refusal(
    page: Any, console_url: str, api: httpx.AsyncClient
) -> None:
    mine = await open_gate(api, subject=f"ship build {uuid.uuid4().hex[:6]}", expires_in_s=7200)
    own = await open_gate(
        api, name="own", subject=f"alice's own {uuid.uuid4().hex[:6]}", approvers=[]
    )

    # Without a token the console opens on its settings; Tab first reaches the skip link.
    await page.goto(f"{console_url}/ui")
    await page.wait_for_selector("#view-settings:not([hidden])")
    await page.keyboard.press("Tab")
    assert await page.evaluate("document.activeElement.textContent") == "Skip to content"
    await snapshot(page, "settings")

    # A token the API does not know: its refusal is shown, nothing is listed.
    await page.get_by_label("API token").fill("not-a-token")
    await page.get_by_role("button", name="Save token").click()
    await page.get_by_text(
        "The API refused the token: the bearer token is not valid (Settings)."
    ).wait_for()
    assert await page.locator("li.gate").count() == 0

    await sign_in(page, console_url, "bob")
    card = page.locator("li.gate", has_text=mine["subject"])
    await card.wait_for()
    assert await card.locator(".gate-requester").inner_text() == "alice"
    assert await card.locator(".gate-approvers").inner_text() == "bob"
    assert re.fullmatch(r"in (1h 59m|2h 0m)", await card.locator(".gate-expiry").inner_text())
    await page.locator("li.gate", has_text=own["subject"]).wait_for()
    # Bob is an approver of both gates (any approver may decide `own`).
    assert int(await page.locator("#inbox-count").inner_text()) >= 2
    # The canvas waits for a design session.
    assert "No design session yet" in await page.locator("#right").inner_text()
    await snapshot(page, "inbox")

    # By keyboard: the comment field by its label, then Tab to Approve and Enter.
    await card.get_by_label("Comment").fill("checked the eval report")
    await page.keyboard.press("Tab")
    focused = await page.evaluate("document.activeElement.getAttribute('aria-label')")
    assert focused == f"Approve: {mine['subject']}"
    await page.keyboard.press("Enter")
    await card.wait_for(state="detached")
    await page.get_by_text(f"Approved: {mine['subject']}").wait_for()
    # The count follows the list (other tests' gates on the shared server may come and go).
    assert int(await page.locator("#inbox-count").inner_text()) == (
        await page.locator("li.gate").count()
    )
    state = (await api.get(f"/gates/{mine['gate_id']}", headers=auth("bob"))).json()
    assert state["status"] == "approved" and state["decided_by"] == "bob"
    assert state["decision_comment"] == "checked the eval report"

    # Alice requested `own`: her approval is refused, with the API's own words.
    await sign_in(page, console_url, "alice")
    card = page.locator("li.gate", has_text=own["subject"])
    await card.get_by_role("button", name=f"Approve: {own['subject']}").click()
    refusal = card.locator(".refusal")
    await refusal.wait_for()
    assert await refusal.inner_text() == "Refused: alice requested this gate and cannot decide it"
    await card.wait_for()  # still pending, still listed
    state = (await api.get(f"/gates/{own['gate_id']}", headers=auth("alice"))).json()
    assert state["status"] == "pending"
    await snapshot(page, "inbox-refused")

    # Narrow: the canvas and the navigation fold behind buttons.
    await page.set_viewport_size({"width": 420, "height": 800})
    assert not await page.locator("#right").is_visible()
    assert not await page.locator("#left").is_visible()
    await page.get_by_role("button", name="Menu").click()
    assert await page.locator("#left").is_visible()
    await snapshot(page, "narrow-menu")


# A job that stops at its approval gate until bob decides (threads: the test is about the page).
GATED_JOB = """
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: ["one two", "three four five"]
  by: item
map:
  operator: word-count@1.0.0
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: console.json}}
policy:
  max_workers: 2
  budget_units: "20"
approval:
  gate: ship
  approvers: [bob]
"""


async def test_runs_and_an_mrp_gate_approved_from_the_inbox(
    page: Any, console_url: str, api: httpx.AsyncClient, api_settings: Settings
) -> None:
    collection = f"console-{uuid.uuid4().hex[:8]}"
    resp = await api.post(
        "/srl/collections",
        json={"collection": collection, "tasks": HAND_TASKS[:2], "window": 2},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    srl_wid = resp.json()["workflow_id"]
    job_id = f"console-{uuid.uuid4().hex[:8]}"
    resp = await api.post(
        "/mrp/jobs",
        json={"job_yaml": GATED_JOB.format(job_id=job_id), "backend": "threads"},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    mrp_wid = resp.json()["workflow_id"]

    await sign_in(page, console_url, "alice")
    await page.get_by_role("button", name="Runs").click()
    srl_row = page.locator("#runs-body tr", has_text=srl_wid)
    await srl_row.wait_for()
    assert "SRL collection" in await srl_row.inner_text()
    link = srl_row.get_by_role("link", name=f"Open {srl_wid} in the Temporal Web UI")
    assert await link.get_attribute("href") == ui_link(api_settings, srl_wid)
    # The view refreshes itself: the collection ends, the job waits at its gate.
    await srl_row.locator(".status-completed").wait_for()
    mrp_row = page.locator("#runs-body tr", has_text=mrp_wid)
    await mrp_row.get_by_text("approval: ").wait_for()
    assert "MRP job" in await mrp_row.inner_text()
    assert await mrp_row.locator(".status-running").count() == 1

    # The theme switch overrides the system's setting.
    await page.get_by_role("button", name="Theme: system").click()
    assert await page.evaluate("document.documentElement.dataset.theme") == "light"
    await page.get_by_role("button", name="Theme: light").click()
    assert await page.evaluate("document.documentElement.dataset.theme") == "dark"
    await page.get_by_role("button", name="Theme: dark").click()
    assert await page.evaluate("document.documentElement.dataset.theme ?? null") is None
    await snapshot(page, "runs")

    # Bob approves the job's produce gate from the inbox; the job then completes.
    await sign_in(page, console_url, "bob")
    card = page.locator("li.gate", has_text=mrp_wid)
    assert await card.locator(".gate-parent").inner_text() == mrp_wid
    assert (await card.locator(".gate-subject").inner_text()).startswith(
        f"Produce MRP job {job_id}"
    )
    await card.get_by_label("Comment").fill("counts look right")
    await card.get_by_role("button", name="Approve: Produce MRP job").click()
    await card.wait_for(state="detached")
    await page.get_by_role("button", name="Runs").click()
    await page.locator("#runs-body tr", has_text=mrp_wid).locator(".status-completed").wait_for()
    gate = await api.get(f"/gates/{mrp_wid}/gate/ship", headers=auth("bob"))
    assert gate.json()["decision_comment"] == "counts look right"

    await page.get_by_role("button", name="New design session").click()
    await page.get_by_role("heading", name="Design session", exact=True).wait_for()
    await snapshot(page, "design")
