"""The console's inbox and runs list follow the API's page token: a caller with more gates
and runs than one page (50) sees the first page, a "More" button, and after it the rest,
none twice; the button goes when there is no next page.

The caller is new to this test (the dev server is shared), so their rows are exactly the
ones started here, through Keel's client calls on a task queue no worker polls: the gates
stay pending, the runs are ended at once (a closed run is listed like any other).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import Client

from client.gate import start_gate
from client.temporal import start_by_type
from keel.access import ACCESS_MEMO, access_for
from keel.gates import GateRequest, gate_workflow_id
from keel.rllm.run import WORKFLOW_TYPE as RLLM_TYPE
from keel.settings import ApiToken, Settings
from tests.console.test_console import (  # noqa: F401 (fixtures)
    api,
    console_url,
    page,
    sign_in,
)
from tests.support.api import auth, token, with_tokens

TAG = uuid.uuid4().hex[:8]
# New to this test and named as the approver of each gate, but without the approver role:
# that role also reads every gate naming no approver, which other tests on this server open.
READER = f"pages-{TAG}"
COUNT = 57  # more than one console page (50)


@pytest.fixture
def api_settings(settings: Settings) -> Settings:
    base = with_tokens(settings)
    extra = ApiToken(token=SecretStr(token(READER)), actor=READER, roles=["requester"])
    return base.model_copy(update={"api_tokens": [*base.api_tokens, extra]})


async def test_inbox_and_runs_show_more_than_one_page(
    page: Any,  # noqa: F811
    console_url: str,  # noqa: F811
    api: httpx.AsyncClient,  # noqa: F811
    client: Client,
) -> None:
    queue = f"no-worker-{TAG}"
    limiter = asyncio.Semaphore(16)
    gate_ids: list[str] = []

    async def gate(n: int) -> None:
        gid = gate_workflow_id(f"pages/{TAG}/{n}", "ship")
        req = GateRequest(name="ship", requester="someone", approvers=[READER], subject=gid)
        async with limiter:
            await start_gate(client, req, gate_id=gid, task_queue=queue)
        gate_ids.append(gid)

    async def run(n: int) -> str:
        wid = f"pages-run/{TAG}/{n}"
        async with limiter:
            handle = await start_by_type(
                client, RLLM_TYPE, {"n": n}, workflow_id=wid, task_queue=queue,
                result_type=dict, memo={ACCESS_MEMO: access_for(READER)},
            )  # fmt: skip
            await handle.terminate("listed closed")
        return wid

    try:
        await asyncio.gather(*(gate(n) for n in range(COUNT)))
        run_ids = set(await asyncio.gather(*(run(n) for n in range(COUNT))))

        # Visibility lags the starts: wait until the API lists them all.
        for _ in range(60):
            gates = await api.get("/gates", params={"limit": 100}, headers=auth(READER))
            runs = await api.get("/runs", params={"limit": 100}, headers=auth(READER))
            if len(gates.json()["gates"]) == len(runs.json()["runs"]) == COUNT:
                break
            await asyncio.sleep(0.5)

        await sign_in(page, console_url, READER)
        cards, more = page.locator("li.gate"), page.locator("#inbox-more")
        await more.wait_for(state="visible")
        assert await cards.count() == 50
        await more.click()
        await more.wait_for(state="hidden")
        subjects = await page.locator("li.gate .gate-subject").all_inner_texts()
        assert sorted(subjects) == sorted(gate_ids)
        assert int(await page.locator("#inbox-count").inner_text()) == COUNT

        await page.locator(".nav-item[data-view=runs]").click()
        rows, more_runs = page.locator("#runs-body tr"), page.locator("#runs-more")
        await more_runs.wait_for(state="visible")
        assert await rows.count() == 50
        await more_runs.click()
        await more_runs.wait_for(state="hidden")
        shown = await page.locator("#runs-body td.run-id").all_inner_texts()
        assert len(shown) == len(set(shown)) and set(shown) == run_ids
    finally:
        await asyncio.gather(
            *(client.get_workflow_handle(g).terminate("test over") for g in gate_ids),
            return_exceptions=True,
        )
