"""``POST /rllm/runs`` and ``GET /rllm/runs/{id}`` on the real dev server, a real worker and a
scripted OpenAI-compatible model server: results, errors in the one shape, idempotency, auth."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from api.app import create_app
from api.idempotency import REPLAY_HEADER
from keel.settings import Settings
from tests.support.api import asgi_client, assert_error, auth, with_tokens
from tests.support.rllm import summary_body
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, models_yaml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
GOOD = json.dumps({"summary": "Temporal keeps workflows durable.", "sentences": 1})


@pytest.fixture
def model_server() -> Iterator[ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(default=ScriptedReply(content=GOOD)) as srv:
        yield srv


@pytest.fixture
def settings(settings: Settings, tmp_path: Path, model_server: ScriptedOpenAIServer) -> Settings:
    """The conftest settings, with models pointing at the scripted server and API tokens."""
    cfg = tmp_path / "models.yaml"
    cfg.write_text(models_yaml(model_server.base_url))
    return with_tokens(settings, models_config=cfg)


@pytest.fixture
async def http(settings, client, worker) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(create_app(settings, client=client)) as c:
        yield c


async def test_run_and_wait_returns_the_result(http, model_server):
    resp = await http.post("/rllm/runs", json=summary_body(wait=True), headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    view = resp.json()
    assert view["status"] == "completed" and view["exit_code"] == 0
    assert view["workflow_id"].startswith("rllm/summary/")
    assert view["result"]["output"] == json.loads(GOOD)
    assert view["result"]["app"] == "summary" and view["result"]["model"] == "local"
    assert len(model_server.chat_requests) == 1
    got = await http.get(f"/rllm/runs/{view['workflow_id']}", headers=auth("alice"))
    assert got.status_code == 200 and got.json()["result"]["output"] == json.loads(GOOD)


async def test_run_without_wait_is_202_then_polled(http):
    resp = await http.post("/rllm/runs", json=summary_body(), headers=auth("alice"))
    assert resp.status_code == 202, resp.text
    wid = resp.json()["workflow_id"]
    assert resp.json()["status"] == "running" and resp.json()["run_id"]
    for _ in range(200):
        view = (await http.get(f"/rllm/runs/{wid}", headers=auth("alice"))).json()
        if view["status"] != "running":
            break
        await asyncio.sleep(0.1)
    assert view["status"] == "completed" and view["result"]["output"]["sentences"] == 1


async def test_path_read_by_the_worker(http):
    """Without files, path is read by the worker, relative to its working directory."""
    body = {"path": "examples/summary.rllm", "input": "A text.", "wait": True}
    resp = await http.post("/rllm/runs", json=body, headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    assert resp.json()["workflow_id"].startswith("rllm/summary/")


async def test_app_errors_use_the_error_shape(http, model_server):
    bad_input = await http.post(
        "/rllm/runs", json=summary_body(input={"txt": "x"}, wait=True), headers=auth("alice")
    )
    err = assert_error(bad_input, 422, "RLLM_INPUT_SCHEMA_MISMATCH")
    assert err["details"]["error_type"] == "InputSchemaError"  # type: ignore[index]
    assert err["details"]["expected_schema"]["required"] == ["text"]  # type: ignore[index]

    model_server.enqueue(*[ScriptedReply(content="not json") for _ in range(2)])
    exhausted = await http.post(
        "/rllm/runs", json=summary_body(max_retries=1, wait=True), headers=auth("alice")
    )
    err = assert_error(exhausted, 502, "RLLM_RETRY_EXHAUSTED")
    attempts = err["details"]["details"]["attempts"]  # type: ignore[index]
    assert len(attempts) == 2

    files = {"summary.rllm": "no frontmatter here\n"}
    broken = await http.post(
        "/rllm/runs", json={"path": "summary.rllm", "files": files}, headers=auth("alice")
    )
    err = assert_error(broken, 422, "RLLM_PARSE_ERROR")
    assert err["details"]["details"]["line"] == 1  # type: ignore[index]


async def test_failed_run_reads_back_with_its_exit_code(http):
    resp = await http.post(
        "/rllm/runs", json=summary_body(input={"text": ""}), headers=auth("alice")
    )
    wid = resp.json()["workflow_id"]
    for _ in range(200):
        view = (await http.get(f"/rllm/runs/{wid}", headers=auth("alice"))).json()
        if view["status"] != "running":
            break
        await asyncio.sleep(0.1)
    assert view["status"] == "failed" and view["exit_code"] == 13
    assert view["error"]["error_code"] == "RLLM_INPUT_SCHEMA_MISMATCH"


async def test_idempotency_key_starts_one_run(http, model_server):
    headers = {**auth("alice"), "Idempotency-Key": "summary-1"}
    first = await http.post("/rllm/runs", json=summary_body(wait=True), headers=headers)
    second = await http.post("/rllm/runs", json=summary_body(wait=True), headers=headers)
    assert first.status_code == second.status_code == 200
    assert second.headers.get(REPLAY_HEADER) == "true"
    assert first.json()["workflow_id"] == second.json()["workflow_id"]
    assert len(model_server.chat_requests) == 1
    other = await http.post(
        "/rllm/runs", json=summary_body(input={"text": "other"}), headers=headers
    )
    assert_error(other, 422, "idempotency_key_reused")


async def test_auth_and_request_checks(http):
    assert_error(await http.post("/rllm/runs", json=summary_body()), 401, "unauthorized")
    assert_error(
        await http.post("/rllm/runs", json=summary_body(), headers=auth("bob")), 403, "forbidden"
    )
    for path in ("../secret.rllm", "/etc/app.rllm", "notes.txt"):
        resp = await http.post(
            "/rllm/runs", json={"path": path, "input": {}}, headers=auth("alice")
        )
        assert_error(resp, 422, "validation_failed")
    missing_root = await http.post(
        "/rllm/runs", json=summary_body(path="other.rllm"), headers=auth("alice")
    )
    assert_error(missing_root, 422, "validation_failed")
    assert_error(await http.get("/rllm/runs/rllm/nope/1", headers=auth("alice")), 404, "not_found")
    assert_error(await http.get("/rllm/runs/rllm/nope/1"), 401, "unauthorized")


async def test_a_second_requester_gets_404_for_the_first_ones_run(http):
    resp = await http.post("/rllm/runs", json=summary_body(wait=True), headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    wid = resp.json()["workflow_id"]
    for actor in ("alice", "root"):
        got = await http.get(f"/rllm/runs/{wid}", headers=auth(actor))
        assert got.status_code == 200 and got.json()["status"] == "completed", (actor, got.text)
    for actor in ("carol", "bob"):
        # The same answer as for an id that does not exist: nothing is confirmed.
        for ref in (wid, f"{wid}-nope"):
            error = assert_error(
                await http.get(f"/rllm/runs/{ref}", headers=auth(actor)), 404, "not_found"
            )
            assert error["message"] == f"no .rllm run {ref!r}"
