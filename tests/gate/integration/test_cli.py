"""``keel gates`` as an approver runs it: list, show, comment, approve and reject a real
gate on the dev server, with refusals and missing gates through the error envelope."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from typing import Any

from client import gate as gates
from keel.gates import GateRequest, GateStatus, gate_workflow_id
from keel.settings import Settings

KEEL = [sys.executable, "-m", "cli.keel", "gates"]


async def keel_gates(settings: Settings, *args: str, user: str = "bob") -> tuple[int, Any, str]:
    """Run ``keel gates ARGS --json`` as ``user``; the exit code, the JSON and stderr."""
    env = {
        **os.environ,
        "KEEL_TEMPORAL_ADDRESS": settings.temporal_address,
        "KEEL_TASK_QUEUE": settings.task_queue,
        "KEEL_DATA_DIR": str(settings.data_dir),
        "KEEL_USER": user,
    }
    proc = await asyncio.create_subprocess_exec(
        *KEEL, *args, "--json", env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if out.strip() else None, err.decode()


async def open_gate(client: Any, settings: Settings, name: str = "deploy", **kw: Any) -> str:
    gate_id = gate_workflow_id(f"cli-test/{uuid.uuid4()}", name)
    req = GateRequest(name=name, requester="alice", approvers=["bob"], subject="ship v2", **kw)
    await gates.open_gate(client, req, gate_id=gate_id, task_queue=settings.task_queue)
    return gate_id


async def test_an_approver_works_a_gate_from_the_terminal(client, settings, worker):
    gate_id = await open_gate(client, settings)

    code, doc, _ = await keel_gates(settings, "list", "--limit", "500")
    assert code == 0
    row = next(g for g in doc["gates"] if g["gate_id"] == gate_id)
    assert (row["requester"], row["approvers"], row["subject"]) == ("alice", ["bob"], "ship v2")

    code, doc, _ = await keel_gates(settings, "comment", gate_id, "looks fine", user="carol")
    assert code == 0 and [c["comment"] for c in doc["comments"]] == ["looks fine"]

    # The gate's rules hold from the terminal: its requester and a non-approver are refused.
    code, doc, err = await keel_gates(settings, "approve", gate_id, user="alice")
    assert code == 4 and doc["error"]["details"] == {"refusal": "self_approval"}, err
    code, doc, _ = await keel_gates(settings, "approve", gate_id, user="mallory")
    assert code == 4 and doc["error"]["details"] == {"refusal": "not_an_approver"}

    code, doc, _ = await keel_gates(settings, "approve", gate_id, "--comment", "lgtm")
    assert code == 0
    assert (doc["status"], doc["decided_by"], doc["decision_comment"]) == (
        "approved",
        "bob",
        "lgtm",
    )
    code, doc, _ = await keel_gates(settings, "show", gate_id)
    assert code == 0 and doc["status"] == "approved"

    # Decided: a second decision says the gate is closed.
    code, doc, _ = await keel_gates(settings, "reject", gate_id)
    assert code == 5 and doc["error"]["type"] == "closed"


async def test_reject_and_the_errors_a_user_meets(client, settings, worker):
    gate_id = await open_gate(client, settings, name="release")
    code, doc, _ = await keel_gates(settings, "reject", gate_id, "--comment", "not yet")
    assert code == 0 and doc["status"] == GateStatus.REJECTED.value

    missing = gate_workflow_id(f"cli-test/{uuid.uuid4()}", "nope")
    for args in (["show", missing], ["approve", missing], ["comment", missing, "hi"]):
        code, doc, err = await keel_gates(settings, *args)
        assert code == 3 and doc["error"]["type"] == "not_found", (args, err)
        assert "no gate" in err
    code, doc, _ = await keel_gates(settings, "show", "not-a-gate-id")
    assert code == 3
    code, doc, err = await keel_gates(settings, "list", "--status", "sideways")
    assert code == 2 and "no gate status" in err
