"""The console's design stream across a worker restart, in headless Chromium.

The worker is a process of its own (``keel worker``, as in the fault tests), so it can be
killed with SIGKILL while the page holds the stream of a session that waits at its gate.
With no worker at all the page stays on its stream (no error card, no repeated card, the
stream never breaks); a new worker process then answers, the gate is approved from the
page and the run completes. The page's cards are then exactly the run's events, seq
0..n-1, each once.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import expect

from keel.settings import Settings
from services.processes import ManagedProcess, TemporalDevServer
from tests.console.test_console import (  # noqa: F401 (fixtures)
    api,
    console_url,
    page,
    sign_in,
)
from tests.console.test_design_console import (
    EXTRACTED,
    FIRST_EVENT_WAIT_MS,
    seqs,
    start_session,
)
from tests.support.api import auth
from tests.support.faults import sigkill, spawn_ready_worker
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config

pytestmark = pytest.mark.slow  # two worker processes start, and the outage is waited out

#: How long the page sits with no worker: past the events query's 5 s timeout
#: (client/design.py QUERY_TIMEOUT) and the stream's 10 s ping, so the SSE route has
#: answered "nothing yet" several times and pinged at least once.
OUTAGE_S = 12.0
#: After the restart: the sticky queue of the dead worker times out before the new
#: worker gets the gate's and the pipeline's tasks, then the planner persists.
AFTER_RESTART_MS = 120_000


class WorkerProcesses:
    """The test's ``keel worker`` processes, one at a time."""

    def __init__(
        self, settings: Settings, logs: Path, spawned: list[ManagedProcess | TemporalDevServer]
    ) -> None:
        self.settings = settings
        self.logs = logs
        self.spawned = spawned
        self.started: list[ManagedProcess] = []

    async def start(self) -> ManagedProcess:
        log = self.logs / f"worker-{len(self.started)}.log"
        proc = await spawn_ready_worker(self.settings, log, self.spawned)
        self.started.append(proc)
        return proc

    async def kill(self) -> None:
        await sigkill(self.started[-1])


@pytest.fixture
async def worker(
    settings: Settings, tmp_path: Path, spawned: list[ManagedProcess | TemporalDevServer]
) -> AsyncIterator[WorkerProcesses]:
    """A worker process (not the in-process fixture: this one can be SIGKILLed), its
    intake model answered by the scripted server; ``console_url`` waits for it."""
    reply = json.dumps({"constraints": EXTRACTED, "ambiguous": {}})
    with ScriptedOpenAIServer(default=ScriptedReply(content=reply)) as srv:
        settings.models_config = write_models_config(tmp_path / "models.yaml", srv.base_url)
        procs = WorkerProcesses(settings, tmp_path, spawned)
        await procs.start()
        yield procs


async def watch_stream_state(pg: Any) -> None:
    """Record every text the page's stream state shows from now on (a broken stream or
    a reconnect shows there, however briefly)."""
    await pg.evaluate(
        """() => {
          window.__streamStates = [];
          const node = document.querySelector('#stream-state');
          new MutationObserver(() => window.__streamStates.push(node.textContent))
            .observe(node, {childList: true, characterData: true, subtree: true});
        }"""
    )


async def test_stream_survives_a_worker_restart_mid_run(
    console_url: str,  # noqa: F811
    api: httpx.AsyncClient,  # noqa: F811
    worker: WorkerProcesses,
    page: Any,  # noqa: F811 (last: the browser closes its stream before the server stops)
) -> None:
    project = f"restart-{uuid.uuid4().hex[:6]}"
    await sign_in(page, console_url, "alice")
    await start_session(page, project)

    question = page.locator("#timeline li.event-questions")
    regions = question.get_by_role("textbox")
    await regions.wait_for(timeout=FIRST_EVENT_WAIT_MS)
    await regions.fill("us-east-1")
    await question.get_by_role("button", name="Send answers").click()
    gate = page.locator("#timeline li.event-gate-waiting")
    await gate.get_by_role("button", name="Approve plan").wait_for()
    ds = (await page.locator("#ds-heading").inner_text()).split(" / ")[1]

    # alice requested the gate; root (an admin) may decide it. root opens the session
    # while the worker is up, and holds its stream through the restart.
    await sign_in(page, console_url, "root")
    await page.get_by_role("button", name="New design session").click()
    await page.locator(f'button[data-ds="{ds}"]').click()
    await gate.get_by_role("button", name="Approve plan").wait_for()
    # Locator waits, not wait_for_function: its string predicate is compiled by eval in the
    # page, which the console's CSP (script-src 'self') refuses once it polls.
    await expect(page.locator("#stream-state")).to_have_text("Live.", timeout=30_000)
    before = await seqs(page)
    assert before == list(range(len(before))), before
    await watch_stream_state(page)

    await worker.kill()
    await asyncio.sleep(OUTAGE_S)
    # No worker: the page is still on its stream, with the same cards and no error.
    assert await seqs(page) == before
    assert await page.locator("#timeline li.event-run-error").count() == 0
    assert await page.locator("#stream-state").inner_text() == "Live."
    assert await page.locator("#ds-status").inner_text() == "waiting for approval"
    # The API answers too: a read while no worker answers the events query is "nothing
    # yet" after the query's 5 s timeout (client/design.py), not an error.
    during = await api.get(f"/design/decision-sets/{ds}/events", headers=auth("root"), timeout=30)
    assert during.status_code == 200, during.text
    assert (during.json()["status"], during.json()["done"]) == ("running", False)

    await worker.start()
    await gate.get_by_role("button", name="Approve plan").click()
    done = page.locator("#timeline li.event-run-complete")
    await done.wait_for(timeout=AFTER_RESTART_MS)
    assert "completed" in await done.inner_text()
    assert "approved by root" in await page.locator("#timeline li.event-approval").inner_text()

    # Every card once, in seq order, the ones from before the kill unchanged, and the
    # stream never broke or reconnected (the run's end closes it: "ended").
    after = await seqs(page)
    assert after == list(range(len(after))), after
    assert after[: len(before)] == before
    assert len(after) > len(before)
    stored = (await api.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))).json()
    assert stored["done"] is True
    assert after == [e["seq"] for e in stored["events"]]
    assert [e["type"] for e in stored["events"]].count("run-complete") == 1
    # The route ends the stream on its next read after run-complete, which may be one
    # more events query (up to its 5 s timeout) while the workflow closes.
    await expect(page.locator("#stream-state")).to_have_text(
        "The session has ended.", timeout=30_000
    )
    states = await page.evaluate("window.__streamStates")
    assert states == ["The session has ended."], states
    assert len(worker.started) == 2 and not worker.started[0].running()
