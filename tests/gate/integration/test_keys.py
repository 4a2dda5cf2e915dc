"""Gate idempotency keys are per caller and per action; gates are listed as pending from
their start (issue 15 §2, issue 14 §4)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

from temporalio import workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from keel.gates import GateRequest, GateState
from keel.search_attributes import GATE_STATUS_ATTRIBUTE
from services.processes import find_binary
from store.db import make_engine, make_sessionmaker
from store.records import list_gate_events
from tests.support.api import auth, open_gate
from workflows.gate import open_gate as open_child_gate


async def test_same_key_for_comment_then_approval_by_another_caller(http, api_settings):
    gate = await open_gate(http)
    gid = gate["gate_id"]
    key = {"Idempotency-Key": "K"}
    c = await http.post(
        f"/gates/{gid}/comments", json={"comment": "please"}, headers={**auth("alice"), **key}
    )
    assert c.status_code == 200, c.text
    a = await http.post(f"/gates/{gid}/approve", json={}, headers={**auth("bob"), **key})
    assert a.status_code == 200, a.text
    assert a.json()["status"] == "approved" and a.json()["decided_by"] == "bob"
    got = (await http.get(f"/gates/{gid}", headers=auth("bob"))).json()
    assert got["status"] == "approved"
    sessions = make_sessionmaker(make_engine(api_settings.resolved_database_url))
    events = [(e.event, e.actor) for e in list_gate_events(sessions, gid)]
    assert ("approved", "bob") in events and ("comment", "alice") in events


async def test_same_key_for_two_callers_comments_keeps_both(http):
    # Both callers may see the gate: its requester and an approver it names.
    gate = await open_gate(http, approvers=["bob", "dave"])
    gid = gate["gate_id"]
    for actor in ("alice", "dave"):
        r = await http.post(
            f"/gates/{gid}/comments",
            json={"comment": f"from {actor}"},
            headers={**auth(actor), "Idempotency-Key": "shared"},
        )
        assert r.status_code == 200, r.text
    comments = (await http.get(f"/gates/{gid}", headers=auth("bob"))).json()["comments"]
    assert [c["actor"] for c in comments] == ["alice", "dave"]
    # The same caller reusing its key on another route is refused, as before.
    again = await http.post(
        f"/gates/{gid}/approve", json={}, headers={**auth("dave"), "Idempotency-Key": "shared"}
    )
    assert again.status_code == 422 and again.json()["error"]["code"] == "idempotency_key_reused"


async def test_api_gate_starts_with_pending_search_attribute(http, client: Client):
    gate = await open_gate(http)
    history = await client.get_workflow_handle(gate["gate_id"]).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    fields = started.search_attributes.indexed_fields
    assert json.loads(fields[GATE_STATUS_ATTRIBUTE].data) == "pending"


@workflow.defn(name="GateParentForTest")
class GateParent:
    @workflow.run
    async def run(self, name: str) -> GateState:
        return await open_child_gate(GateRequest(name=name, requester="alice", expires_in_s=600))


async def test_child_gate_listed_pending_before_its_first_task(client: Client, temporal_address):
    # This worker knows the parent but not ApprovalGate: the child's first task never runs,
    # so only the attributes given at start can make it visible as pending.
    queue = f"keel-test-{uuid.uuid4()}"
    name = f"g{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[GateParent],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        parent = await client.start_workflow(
            GateParent.run, name, id=f"parent-{name}", task_queue=queue
        )
        child_id = f"{parent.id}/gate/{name}"
        query = f'{GATE_STATUS_ATTRIBUTE} = "pending" AND WorkflowId = "{child_id}"'
        listed: list[str] = []
        for _ in range(50):
            listed = [wf.id async for wf in client.list_workflows(query)]
            if listed:
                break
            await asyncio.sleep(0.1)
        assert listed == [child_id]
        cli = subprocess.run(
            [find_binary("temporal"), "workflow", "list", "--address", temporal_address,
             "--query", f'KeelGateStatus = "pending" AND WorkflowId = "{child_id}"',
             "--output", "json"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert [wf["execution"]["workflowId"] for wf in json.loads(cli.stdout)] == [child_id]
        await parent.terminate()  # the child goes with it (parent close policy)
