"""``POST /srl/collections`` and ``GET /srl/collections/{id}`` against the real dev server,
a real worker, the real jail."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import httpx
from temporalio.client import Client

from tests.srl.conftest import HAND_TASKS, collection_events
from tests.support.api import assert_error, auth


async def _until_done(http: httpx.AsyncClient, collection: str, actor: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        resp = await http.get(f"/srl/collections/{collection}", headers=auth(actor))
        assert resp.status_code == 200, resp.text
        body: dict[str, Any] = resp.json()
        if body["status"] != "running":
            return body
        await asyncio.sleep(0.3)
    raise AssertionError(f"collection {collection} still running")


async def test_start_and_read_a_collection(http: httpx.AsyncClient) -> None:
    collection = f"api-{uuid.uuid4().hex[:8]}"
    resp = await http.post(
        "/srl/collections",
        json={"collection": collection, "tasks": HAND_TASKS[:3], "window": 3},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    assert resp.json() == {
        "collection": collection,
        "workflow_id": f"srl/{collection}",
        "task_count": 3,
        "status": "running",
    }
    body = await _until_done(http, collection, "alice")
    assert body["status"] == "completed"
    assert body["totals"]["verified_steps"] == 3 and body["done"] == 3
    assert body["recorded"] == {"steps": 3, "verified": 3, "format_errors": 0}

    # Another requester does not see it; admin does.
    assert_error(
        await http.get(f"/srl/collections/{collection}", headers=auth("carol")), 404, "not_found"
    )
    assert (
        await http.get(f"/srl/collections/{collection}", headers=auth("root"))
    ).status_code == 200


async def test_samples_then_a_run_naming_another_source_is_a_409(
    http: httpx.AsyncClient,
) -> None:
    collection = f"api-samples-{uuid.uuid4().hex[:8]}"
    body = {"collection": collection, "tasks": HAND_TASKS[:2], "samples": 2, "seed": 7}
    resp = await http.post("/srl/collections", json=body, headers=auth("alice"))
    assert resp.status_code == 202, resp.text
    done = await _until_done(http, collection, "alice")
    assert done["status"] == "completed" and done["totals"]["episodes"] == 4
    assert done["recorded"]["steps"] == 4

    other = {**body, "source": "teacher", "model": "local"}
    err = assert_error(
        await http.post("/srl/collections", json=other, headers=auth("alice")), 409, "conflict"
    )
    assert "source 'gold_replay'" in err["message"] and "source 'teacher'" in err["message"]


async def test_a_collection_with_batch_runs_its_episodes_in_srl_episodes(
    http: httpx.AsyncClient, client: Client
) -> None:
    """``batch`` in the body reaches the workflow: three tasks in batches of two are two
    ``srl.episodes`` activities and no child workflow."""
    collection = f"api-batch-{uuid.uuid4().hex[:8]}"
    body = {"collection": collection, "tasks": HAND_TASKS[:3], "batch": 2}
    resp = await http.post("/srl/collections", json=body, headers=auth("alice"))
    assert resp.status_code == 202, resp.text
    done = await _until_done(http, collection, "alice")
    assert done["status"] == "completed", done
    assert done["totals"]["verified_episodes"] == 3 and done["recorded"]["steps"] == 3
    types, activities = await collection_events(client, collection)
    assert activities == ["srl.window", "srl.episodes", "srl.episodes"], activities
    assert "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in types


async def test_refusals(http: httpx.AsyncClient) -> None:
    task = HAND_TASKS[0]
    both = {"collection": "x", "tasks": [task], "tasks_digest": "blake3:" + "0" * 64}
    assert_error(
        await http.post("/srl/collections", json=both, headers=auth("alice")),
        422,
        "validation_failed",
    )
    missing = {"collection": "x", "tasks_digest": "blake3:" + "0" * 64}
    assert_error(
        await http.post("/srl/collections", json=missing, headers=auth("alice")), 404, "not_found"
    )
    twice = {"collection": "x", "tasks": [task, task]}
    err = assert_error(
        await http.post("/srl/collections", json=twice, headers=auth("alice")),
        422,
        "validation_failed",
    )
    assert "repeats" in err["message"]
    for batch, says in ((-1, "greater than or equal to 0"), (1001, "less than or equal")):
        err = assert_error(
            await http.post(
                "/srl/collections",
                json={"collection": "x", "tasks": [task], "batch": batch},
                headers=auth("alice"),
            ),
            422,
            "validation_failed",
        )
        [problem] = err["details"]
        assert problem["loc"] == ["body", "batch"] and says in problem["msg"], err
    bad_lang = {"collection": "x", "tasks": [{**task, "language": "cobol"}]}
    assert_error(
        await http.post("/srl/collections", json=bad_lang, headers=auth("alice")),
        422,
        "validation_failed",
    )
    # Approvers may not start collections; nobody unauthenticated may read one.
    assert_error(
        await http.post(
            "/srl/collections", json={"collection": "x", "tasks": [task]}, headers=auth("bob")
        ),
        403,
        "forbidden",
    )
    assert (await http.get("/srl/collections/x")).status_code == 401
    assert_error(await http.get("/srl/collections/nope", headers=auth("root")), 404, "not_found")
