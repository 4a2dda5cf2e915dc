"""A gate list reads each gate's summary (requester, subject, approvers, expiry) from its
memo in the visibility row, not from its history (patch ``gate-summary-memo``).

Gates are started every way there is: ``client.gate.start_gate`` (the memo at the start),
bare ``temporal workflow start`` style (no memo: the gate sets it itself), as a child of
``KeelDemo`` (likewise), with an unreadable memo or one that is not its request's (the
gate replaces either), and as an older gate whose row carries no summary memo (started as
``start_gate`` did before the memo, on a task queue no worker polls, so its first task
never runs and nothing sets one). Every
row must show what its request says, exactly as the history read showed it before;
``client.gate.request_of`` (the history read) is counted and may be called for the older
gate only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from temporalio.client import Client

import client.gate as gates
from api.app import create_app
from client.gate import GateSummary, start_gate, start_search_attributes
from client.temporal import with_readers
from keel.access import (
    ACCESS_MEMO,
    RunAccess,
    access_for,
    may_read,
    reader_terms,
    user_reader,
)
from keel.demo import DemoInput
from keel.gates import (
    GATE_SUMMARY_MEMO,
    GATE_WORKFLOW_TYPE,
    GateRequest,
    GateState,
    GateSummaryMemo,
    gate_workflow_id,
    summary_memo,
)
from keel.settings import ApiToken, Settings
from tests.support.api import asgi_client
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker
from workflows.demo import KeelDemo

TAG = uuid.uuid4().hex[:8]
APPROVER = f"memo-appr-{TAG}"
ROLES = frozenset({"approver"})
TOKEN = f"tok-memo-{TAG}-0123456789"


async def _until(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


def summary_before(wf: Any, req: GateRequest) -> dict[str, Any]:
    """The row's summary as ``list_gates`` made it before the memo: from the request."""
    return {
        "requester": req.requester,
        "subject": req.subject,
        "approvers": req.approvers,
        "expires_at": wf.start_time + timedelta(seconds=req.expires_in_s),
    }


def shown(row: GateSummary) -> dict[str, Any]:
    return {
        "requester": row.requester,
        "subject": row.subject,
        "approvers": row.approvers,
        "expires_at": row.expires_at,
    }


@pytest.fixture
def history_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the gates whose history ``client.gate`` reads (``request_of``)."""
    reads: list[str] = []
    real = gates.request_of

    async def counted(client: Client, wf: Any) -> GateRequest | None:
        reads.append(wf.id)
        return await real(client, wf)

    monkeypatch.setattr(gates, "request_of", counted)
    return reads


@pytest.fixture
async def demo_worker(
    client: Client, settings: Settings, tmp_path: Path
) -> AsyncIterator[tuple[Settings, ScriptedOpenAIServer]]:
    """A Keel worker on this test's queue whose model is a scripted OpenAI server."""
    with ScriptedOpenAIServer(default=ScriptedReply(content="Keel keeps work durable.")) as llm:
        write_models_config(tmp_path / "models.yaml", llm.base_url)
        s = settings.model_copy(update={"models_config": tmp_path / "models.yaml"})
        async with build_worker(client, s):
            yield s, llm


async def test_gate_list_reads_summaries_from_memos_not_histories(
    client: Client,
    demo_worker: tuple[Settings, ScriptedOpenAIServer],
    history_reads: list[str],
) -> None:
    settings, _ = demo_worker
    queue = settings.task_queue
    idle_queue = f"memo-idle-{TAG}"  # no worker polls it
    requests: dict[str, GateRequest] = {}

    def request(kind: str, **kw: Any) -> tuple[str, GateRequest]:
        gid = gate_workflow_id(f"memo/{TAG}/{kind}", "deploy")
        req = GateRequest(name="deploy", requester=f"req-{kind}-{TAG}", **kw)
        requests[gid] = req
        return gid, req

    # Through Keel's client: both memos and KeelReaders at the start.
    gid, req = request("api", approvers=[APPROVER, "z"], subject="ship v2", expires_in_s=900)
    await start_gate(client, req, gate_id=gid, task_queue=queue)
    # As ``temporal workflow start`` does: no memo, no KeelReaders.
    gid, req = request("bare", approvers=[APPROVER], subject='é ♡ "quoted"\n', expires_in_s=60)
    await client.start_workflow(
        GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue,
        search_attributes=start_search_attributes(req),
    )  # fmt: skip
    # A summary memo no one can read (not a GateSummaryMemo): the gate replaces it.
    gid, req = request("garbled", approvers=[APPROVER], subject="garbled memo")
    await client.start_workflow(
        GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue,
        memo={GATE_SUMMARY_MEMO: {"requester": ""}},
        search_attributes=start_search_attributes(req),
    )  # fmt: skip
    # A readable summary memo that is not the request's (as a hand-made ``temporal
    # workflow start --memo`` may be): the gate replaces it with its request's.
    gid, req = request("forged", approvers=[APPROVER], subject="the real one")
    forged = GateSummaryMemo(requester="mallory", subject="lie", approvers=[], expires_in_s=1)
    await client.start_workflow(
        GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue,
        memo={GATE_SUMMARY_MEMO: forged},
        search_attributes=start_search_attributes(req),
    )  # fmt: skip
    # An older gate: started as ``start_gate`` did before the summary memo (access memo
    # and KeelReaders, no summary), on a queue no worker polls: nothing ever sets one.
    old, req = request("old", approvers=[APPROVER], subject="from before", expires_in_s=7200)
    access = access_for(req.requester, [req.approvers])
    await client.start_workflow(
        GATE_WORKFLOW_TYPE, req, id=old, task_queue=idle_queue,
        memo={ACCESS_MEMO: access},
        search_attributes=with_readers(start_search_attributes(req), {ACCESS_MEMO: access}),
    )  # fmt: skip
    # A child of a workflow (KeelDemo's publish gate): no memo at its start either.
    demo_id = f"memo/{TAG}/demo"
    await client.start_workflow(
        KeelDemo.run,
        DemoInput(requester=f"req-demo-{TAG}", approvers=[APPROVER], expires_in_s=600),
        id=demo_id,
        task_queue=queue,
    )
    child = gate_workflow_id(demo_id, "publish")
    ids = [*requests, child]
    memo_d = [g for g in ids if g != old]
    query = "WorkflowId IN ({})".format(", ".join(f'"{g}"' for g in ids))
    try:

        async def rows_ready() -> bool:
            rows = {
                wf.id: await gates.summary_memo_of(wf) async for wf in client.list_workflows(query)
            }
            want = {g: summary_memo(r) for g, r in requests.items() if g != old}
            return (
                set(rows) == set(ids)
                and rows[old] is None
                and rows[child] is not None
                and all(rows[g] == m for g, m in want.items())
            )

        await _until(rows_ready, "every gate's row, with its request's summary memo where set")
        history_reads.clear()
        page = await gates.list_gates(
            client,
            limit=100,
            readers=reader_terms(APPROVER, ROLES),
            visible=lambda a: may_read(a, APPROVER, ROLES),
        )
        listed = {row.gate_id: row for row in page.gates if row.gate_id in ids}
        assert set(listed) == set(ids)
        # The one history read among this test's gates: the older gate's. (The approver
        # role also lists other tests' gates that name no approver; some have no memo.)
        assert [g for g in history_reads if g in ids] == [old]

        # Every row shows what its request says (read here from its start event, as the
        # list did before), and what the test asked for.
        child_req = None
        for gid in ids:
            wf = await client.get_workflow_handle(gid).describe()
            read = await _request_from_history(client, wf)
            assert read is not None
            req = read
            if gid == child:
                child_req = req
            else:
                assert req == requests[gid]
            assert shown(listed[gid]) == summary_before(wf, req), gid
            assert listed[gid].status == "pending"
        assert child_req is not None and child_req.requester == f"req-demo-{TAG}"
        assert listed[child].parent_id == demo_id and listed[child].approvers == [APPROVER]

        # The gates that set their own memo set the request's summary, not another.
        for gid in ("bare", "garbled", "forged"):
            wf_id = gate_workflow_id(f"memo/{TAG}/{gid}", "deploy")
            desc = await client.get_workflow_handle(wf_id).describe()
            memo = await desc.memo_value(GATE_SUMMARY_MEMO, type_hint=GateSummaryMemo)
            assert memo == summary_memo(requests[wf_id])

        # The access check (GET /gates/{id}) reads the memos too: the access memo where
        # the gate has one, else the summary memo (the bare, garbled, forged, child gates).
        history_reads.clear()
        for gid in memo_d:
            desc = await client.get_workflow_handle(gid).describe()
            got = await gates.access_of(client, desc)
            want = requests.get(gid) or child_req
            assert got is not None and want is not None
            assert (got.owner, APPROVER in got.approvers) == (want.requester, True)
        assert history_reads == []

        # What the approver receives over HTTP: the same rows, the same values, and the
        # gate itself (its access from the child's summary memo); still one history read.
        token = ApiToken(token=SecretStr(TOKEN), actor=APPROVER, roles=sorted(ROLES))
        app = create_app(settings.model_copy(update={"api_tokens": [token]}), client=client)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with asgi_client(app) as http:
            resp = await http.get("/gates", params={"limit": 100}, headers=auth)
            assert resp.status_code == 200, resp.text
            body = {r["gate_id"]: r for r in resp.json()["gates"] if r["gate_id"] in ids}
            assert set(body) == set(ids)
            for gid, row in body.items():
                assert GateSummary.model_validate(row) == listed[gid]
            resp = await http.get(f"/gates/{child}", headers=auth)
            assert resp.status_code == 200, resp.text
            assert GateState.model_validate(resp.json()).requester == f"req-demo-{TAG}"
        assert [g for g in history_reads if g in ids] == [old]
    finally:
        await asyncio.gather(
            *(client.get_workflow_handle(g).terminate("test over") for g in [*ids, demo_id]),
            return_exceptions=True,
        )


async def _request_from_history(client: Client, wf: Any) -> GateRequest | None:
    """The request from the gate's start event, not through the counted ``request_of``."""
    handle = client.get_workflow_handle(wf.id, run_id=wf.run_id)
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        (req,) = await client.data_converter.decode(payloads, [GateRequest])
        return req  # type: ignore[no-any-return]
    return None


async def test_unreadable_or_missing_summary_memo_falls_back_to_the_request(
    client: Client, history_reads: list[str]
) -> None:
    """Rows without a readable summary memo (no worker: nothing replaces them) are still
    listed with their request's values, one history read each."""
    queue = f"memo-none-{TAG}"
    who = f"memo-req-{TAG}"
    ids: list[str] = []
    for kind, memo in (("none", None), ("garbled", {GATE_SUMMARY_MEMO: "not a summary"})):
        gid = gate_workflow_id(f"memo-fallback/{TAG}/{kind}", "deploy")
        req = GateRequest(name="deploy", requester=who, approvers=[APPROVER], subject=kind)
        access = access_for(who, [req.approvers])
        await client.start_workflow(
            GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue,
            memo={ACCESS_MEMO: access, **(memo or {})},
            search_attributes=with_readers(start_search_attributes(req), {ACCESS_MEMO: access}),
        )  # fmt: skip
        ids.append(gid)
    try:

        async def listed() -> dict[str, GateSummary]:
            # Only this requester's rows (``role:approver`` would add other tests' gates).
            page = await gates.list_gates(client, limit=50, readers=[user_reader(who)])
            return {r.gate_id: r for r in page.gates}

        async def both() -> bool:
            return set(await listed()) == set(ids)

        await _until(both, "both rows")
        history_reads.clear()
        rows = await listed()
        assert sorted(history_reads) == sorted(ids)
        for gid, kind in zip(ids, ("none", "garbled"), strict=True):
            row = rows[gid]
            assert (row.requester, row.subject, row.approvers) == (who, kind, [APPROVER])
            assert row.expires_at == row.started_at + timedelta(hours=24)  # type: ignore[operator]
            desc = await client.get_workflow_handle(gid).describe()
            assert await gates.access_of(client, desc) == RunAccess(owner=who, approvers=[APPROVER])
    finally:
        await asyncio.gather(
            *(client.get_workflow_handle(g).terminate("test over") for g in ids),
            return_exceptions=True,
        )
