"""``GET /mrp/jobs/{id}`` finds a run id with one visibility query: an unknown id is a 404
at once, even with 2,000 runs on the server (issue 15 §4). "At once" is shown by counting
the visibility RPCs each request makes (one, whatever the server holds), not by timing."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from api.app import create_app
from client.mrp import RUN_ID_KEY, find_workflow_id
from client.temporal import connect
from keel.mrp.run import WORKFLOW_TYPE, MRPJobInput, workflow_id_for
from keel.settings import Settings
from services.processes import TemporalDevServer, free_port
from tests.support.api import auth

JOBS = 2000


async def _start_idle_jobs(client: Client, job_id: str, n: int) -> list[str]:
    """``n`` MRPJob runs on a task queue no worker polls: visible, never progressing."""
    queue = f"keel-idle-{uuid.uuid4()}"
    gate = asyncio.Semaphore(32)
    run_ids = [uuid.uuid4().hex[:16] for _ in range(n)]

    async def one(run_id: str) -> None:
        async with gate:
            await client.start_workflow(
                WORKFLOW_TYPE,
                MRPJobInput(job_yaml="", run_id=run_id),
                id=workflow_id_for(job_id, run_id),
                task_queue=queue,
                search_attributes=TypedSearchAttributes([SearchAttributePair(RUN_ID_KEY, run_id)]),
            )

    await asyncio.gather(*(one(r) for r in run_ids))
    return run_ids


def count_visibility_rpcs(client: Client, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count the client's visibility RPCs (list/count/scan), by name, from now on.

    Every RPC of the Python SDK goes through its service client's ``_rpc_call``; workers
    sharing the client make no visibility RPCs, so only the requests under test count.
    """
    calls: Counter[str] = Counter()
    service = client.service_client
    rpc_call = service._rpc_call

    async def counting(*args: Any, **kwargs: Any) -> Any:
        rpc = str(kwargs.get("rpc", ""))
        if rpc.startswith(("list_", "count_", "scan_")):
            calls[rpc] += 1
        return await rpc_call(*args, **kwargs)

    monkeypatch.setattr(service, "_rpc_call", counting)
    return calls


@pytest.fixture
async def own_server(tmp_path: Path) -> AsyncIterator[Client]:
    """A Temporal dev server of this test's own: the 2,000 runs go with it when it stops,
    instead of 2,000 terminations on the session's server (half this test's time) and
    2,000 closed runs in its visibility for every later test that lists runs."""
    server = TemporalDevServer(
        db_file=tmp_path / "temporal.db", log_path=tmp_path / "temporal.log", port=free_port(),
        ui_port=None,
    )  # fmt: skip
    server.start()
    try:
        yield await connect(Settings(temporal_address=server.address))
    finally:
        server.stop()


@pytest.mark.slow
async def test_unknown_run_id_is_404_at_once_among_2000_jobs(
    api_settings: Settings, own_server: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = f"lookup-{uuid.uuid4().hex[:8]}"
    run_ids = await _start_idle_jobs(own_server, job_id, JOBS)
    await _lookups(api_settings, own_server, monkeypatch, job_id, run_ids)


async def _lookups(
    api_settings: Settings,
    client: Client,
    monkeypatch: pytest.MonkeyPatch,
    job_id: str,
    run_ids: list[str],
) -> None:
    # The last one started is listed once visibility has caught up: the server holds them all.
    for _ in range(100):
        if await find_workflow_id(client, run_ids[-1]):
            break
        await asyncio.sleep(0.1)
    assert await find_workflow_id(client, run_ids[-1]) == workflow_id_for(job_id, run_ids[-1])
    count = await client.count_workflows(f'WorkflowType = "{WORKFLOW_TYPE}"')
    assert count.count >= JOBS

    calls = count_visibility_rpcs(client, monkeypatch)
    app = create_app(api_settings, client=client)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://keel.test") as http:
        # Started without the API's keel_access memo, these runs are read by admin only.
        known = await http.get(f"/mrp/jobs/{run_ids[0]}", headers=auth("root"))
        assert known.status_code == 200, known.text
        assert known.json()["workflow_id"] == workflow_id_for(job_id, run_ids[0])
        # Found by one query filtered on the server, not by a walk over the 2,000.
        assert calls == Counter({"list_workflow_executions": 1}), calls
        for i in range(7):
            calls.clear()
            resp = await http.get(f"/mrp/jobs/no-such-{uuid.uuid4().hex}", headers=auth("bob"))
            assert resp.status_code == 404 and resp.json()["error"]["code"] == "not_found"
            # One visibility query answered "none", and nothing more was asked.
            assert calls == Counter({"list_workflow_executions": 1}), (i, calls)
