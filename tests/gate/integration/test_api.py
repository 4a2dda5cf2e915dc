"""The gate routes against the real dev server: auth matrix, refusals, idempotency keys,
reads, comments, and who sees which gate."""

from __future__ import annotations

import asyncio

import httpx

from api.idempotency import REPLAY_HEADER
from keel.gates import GateRequest
from store.db import make_engine, make_sessionmaker
from store.records import list_gate_events
from tests.support.api import assert_error, auth, listed_gates, open_gate
from workflows.gate import ApprovalGate


async def test_auth_matrix(http, api_settings):
    gate = await open_gate(http)
    gid = gate["gate_id"]
    url = f"/gates/{gid}/approve"
    assert_error(await http.post(url, json={}), 401, "unauthorized")
    assert_error(await http.post(url, json={}, headers=auth("nobody")), 401, "unauthorized")
    assert_error(
        await http.post(url, json={}, headers={"Authorization": "Basic Ym9iOnB3"}),
        401,
        "unauthorized",
    )
    assert_error(await http.get("/gates"), 401, "unauthorized")
    # carol holds no approver role
    assert_error(await http.post(url, json={}, headers=auth("carol")), 403, "forbidden")
    # alice requested this gate: no self-approval, even with the approver role
    assert_error(await http.post(url, json={}, headers=auth("alice")), 403, "self_approval")
    # dave is an approver, but not of this gate: to him it does not exist
    assert_error(await http.post(url, json={}, headers=auth("dave")), 404, "not_found")
    # carol cannot open gates? she can: she is a requester. bob cannot.
    resp = await http.post("/gates", json={"name": "x"}, headers=auth("bob"))
    assert_error(resp, 403, "forbidden")

    ok = await http.post(url, json={"comment": "fine"}, headers=auth("bob"))
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "approved" and ok.json()["decided_by"] == "bob"
    # closed now
    again = await http.post(f"/gates/{gid}/reject", json={}, headers=auth("bob"))
    assert again.status_code == 409 and again.json()["error"]["code"] in {
        "gate_closed",
        "gate_not_running",
    }
    sessions = make_sessionmaker(make_engine(api_settings.resolved_database_url))
    events = [e.event for e in list_gate_events(sessions, gid)]
    assert events == ["opened", "approved"]


async def test_a_refused_decision_answers_as_a_read_would(http):
    """A decision is one Update when it succeeds; a refused or failed one is explained by
    the same check as a read, so a caller who may not see the gate gets 404 whatever
    state it is in, and one who may gets the refusal."""
    gid = (await open_gate(http, approvers=["bob"]))["gate_id"]
    for path in (f"{gid}-nope", "no/such/gate/x", "plain-id"):
        resp = await http.post(f"/gates/{path}/approve", json={}, headers=auth("bob"))
        assert_error(resp, 404, "not_found")
    # dave holds the approver role but is not named: 404 while open and once closed.
    assert_error(
        await http.post(f"/gates/{gid}/approve", json={}, headers=auth("dave")), 404, "not_found"
    )
    ok = await http.post(f"/gates/{gid}/reject", json={}, headers=auth("bob"))
    assert ok.status_code == 200 and ok.json()["status"] == "rejected", ok.text
    assert_error(
        await http.post(f"/gates/{gid}/approve", json={}, headers=auth("dave")), 404, "not_found"
    )
    again = await http.post(f"/gates/{gid}/approve", json={}, headers=auth("bob"))
    assert_error(again, 409, "gate_closed")
    # root (admin) sees every gate: the refusal itself.
    assert_error(
        await http.post(f"/gates/{gid}/approve", json={}, headers=auth("root")), 409, "gate_closed"
    )


async def test_idempotency_keys(http, api_settings):
    gate = await open_gate(http)
    url = f"/gates/{gate['gate_id']}/approve"
    headers = {**auth("bob"), "Idempotency-Key": "approve-1"}
    first = await http.post(url, json={"comment": "yes"}, headers=headers)
    assert first.status_code == 200 and REPLAY_HEADER not in first.headers
    second = await http.post(url, json={"comment": "yes"}, headers=headers)
    assert second.status_code == 200 and second.headers[REPLAY_HEADER] == "true"
    assert second.json() == first.json()
    other = await http.post(url, json={"comment": "different"}, headers=headers)
    assert_error(other, 422, "idempotency_key_reused")
    # Opening a gate twice with one key starts one workflow.
    open_headers = {**auth("alice"), "Idempotency-Key": "open-1"}
    body = {"name": "release", "approvers": ["bob"]}
    a = await http.post("/gates", json=body, headers=open_headers)
    b = await http.post("/gates", json=body, headers=open_headers)
    assert a.status_code == b.status_code == 201
    assert a.json()["gate_id"] == b.json()["gate_id"]
    sessions = make_sessionmaker(make_engine(api_settings.resolved_database_url))
    events = [e.event for e in list_gate_events(sessions, gate["gate_id"])]
    assert events.count("approved") == 1


async def test_read_list_comment_and_errors(http):
    gate = await open_gate(http, parent_id="design/p1/ds7", name="pre-codegen")
    gid = gate["gate_id"]
    assert gid == "design/p1/ds7/gate/pre-codegen"
    got = await http.get(f"/gates/{gid}", headers=auth("bob"))
    assert got.status_code == 200 and got.json()["status"] == "pending"
    for _ in range(100):
        listed = await listed_gates(http, "bob")
        if any(g["gate_id"] == gid for g in listed):
            break
        await asyncio.sleep(0.1)
    assert any(g["gate_id"] == gid and g["name"] == "pre-codegen" for g in listed)
    c = await http.post(f"/gates/{gid}/comments", json={"comment": "why?"}, headers=auth("bob"))
    assert c.status_code == 200 and c.json()["comments"][0]["actor"] == "bob"

    assert_error(await http.get("/gates/no/such/gate/x", headers=auth("bob")), 404, "not_found")
    assert_error(await http.get("/gates/plain-id", headers=auth("bob")), 404, "not_found")
    bad = await http.post(f"/gates/{gid}/approve", json={"comment": 5}, headers=auth("bob"))
    assert_error(bad, 422, "validation_failed")
    assert bad.json()["error"]["details"][0]["loc"] == ["body", "comment"]
    bad = await http.post("/gates", json={"name": "bad name!"}, headers=auth("alice"))
    assert_error(bad, 422, "validation_failed")
    await http.post(f"/gates/{gid}/reject", json={}, headers=auth("bob"))


async def listed_ids(http: httpx.AsyncClient, actor: str) -> set[str]:
    return {g["gate_id"] for g in await listed_gates(http, actor, limit=500)}


async def test_each_caller_sees_only_their_gates(http):
    """A gate is seen by its requester, the approvers it names and admin; to anyone else
    its id answers as a missing one does (issue 14 §3)."""
    named = (await open_gate(http, name="named", approvers=["bob"]))["gate_id"]
    anyone = (await open_gate(http, name="anyone", approvers=[]))["gate_id"]
    for _ in range(100):
        if {named, anyone} <= await listed_ids(http, "root"):
            break
        await asyncio.sleep(0.1)
    assert {named, anyone} <= await listed_ids(http, "alice")  # she requested both
    assert {named, anyone} <= await listed_ids(http, "bob")
    # dave may decide the gate that names no approvers, not the one that names bob.
    dave = await listed_ids(http, "dave")
    assert anyone in dave and named not in dave
    assert not {named, anyone} & await listed_ids(http, "erin")
    for actor, gid in (("erin", named), ("erin", anyone), ("dave", named)):
        missing = f"{gid}-nope"
        for path in (gid, missing):
            resp = await http.get(f"/gates/{path}", headers=auth(actor))
            assert_error(resp, 404, "not_found")
            assert resp.json()["error"]["message"] == f"no gate {path!r}"
        comment = await http.post(
            f"/gates/{gid}/comments", json={"comment": "hello"}, headers=auth(actor)
        )
        assert_error(comment, 404, "not_found")
    for actor in ("alice", "bob", "root"):
        assert (await http.get(f"/gates/{named}", headers=auth(actor))).status_code == 200
    assert (await http.get(f"/gates/{anyone}", headers=auth("dave"))).status_code == 200
    for gid in (named, anyone):
        await http.post(f"/gates/{gid}/reject", json={}, headers=auth("bob"))


async def test_a_gate_started_outside_the_api_is_scoped_by_its_request(http, client, api_settings):
    """No memo (a workflow's child gate, ``temporal workflow start``): the gate's own
    requester and approvers decide who sees it."""
    gid = f"outside/{api_settings.task_queue}/gate/deploy"
    await client.start_workflow(
        ApprovalGate.run,
        GateRequest(name="deploy", requester="alice", approvers=["bob"]),
        id=gid,
        task_queue=api_settings.task_queue,
    )
    for _ in range(100):
        if gid in await listed_ids(http, "bob"):
            break
        await asyncio.sleep(0.1)
    assert gid in await listed_ids(http, "bob")
    assert gid in await listed_ids(http, "alice")
    assert gid not in await listed_ids(http, "erin")
    assert gid not in await listed_ids(http, "dave")
    assert (await http.get(f"/gates/{gid}", headers=auth("bob"))).status_code == 200
    assert_error(await http.get(f"/gates/{gid}", headers=auth("erin")), 404, "not_found")
    await http.post(f"/gates/{gid}/reject", json={}, headers=auth("bob"))
