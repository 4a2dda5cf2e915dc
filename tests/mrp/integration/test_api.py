"""``POST /mrp/jobs`` and ``GET /mrp/jobs/{run_id}`` against the real dev server and a real
worker (threads backend: these tests are about the API, not Ray)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import Client, WorkflowFailureError

from api.idempotency import REPLAY_HEADER
from client.mrp import failure_of, start_job
from keel.mrp.run import MRPJobInput
from keel.settings import Settings
from tests.support.api import auth

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "mrp"

JOB = """
dsl_version: "0.1"
job_id: api-wordcount
inputs:
  items: ["one two", "three four five", "six"]
  by: item
map:
  operator: word-count@1.0.0
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {kind: json, destination: api.json}
policy:
  max_workers: 2
  budget_units: "20"
"""


async def wait_done(
    http: httpx.AsyncClient, workflow_id: str, timeout: float = 120, actor: str = "alice"
) -> dict[str, Any]:
    """Poll a run by the workflow id ``POST /mrp/jobs`` answered: by its run id alone, a run
    whose compile step has not written its record yet is found through Temporal's
    visibility, which lags a start by a moment (``client/mrp.py:find_workflow_id``)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = await http.get(f"/mrp/jobs/{workflow_id}", headers=auth(actor))
        assert resp.status_code == 200, resp.text
        view = resp.json()
        if view["status"] != "running":
            return view
        assert time.monotonic() < deadline, view
        await asyncio.sleep(0.2)


async def test_submit_yaml_then_read_the_finished_run(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/mrp/jobs", json={"job_yaml": JOB, "backend": "threads"}, headers=auth("alice")
    )
    assert resp.status_code == 202, resp.text
    body = resp.json()
    assert body["job_id"] == "api-wordcount"
    assert body["workflow_id"] == f"mrp/api-wordcount/{body['run_id']}"
    assert body["status"] == "running"

    view = await wait_done(http, body["workflow_id"])
    assert view["status"] == "succeeded", view
    assert view["counters"]["total"] == 3 and view["counters"]["run"] == 3
    assert view["shards_total"] == 3 and view["shards_done"] == 3
    assert view["manifest_digest"].startswith("blake3:")
    assert view["run_manifest_digest"].startswith("blake3:")
    assert set(view["output_digests"]) == {"shards", "reduce", "produced:api.json",
                                           "produced:api.json.audit.jsonl"}  # fmt: skip
    # The workflow id names the same run.
    again = await http.get(f"/mrp/jobs/{body['workflow_id']}", headers=auth("alice"))
    assert again.status_code == 200 and again.json()["run_id"] == body["run_id"]


async def test_submit_a_file_under_a_job_root(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/mrp/jobs",
        json={"path": "wordcount.yaml", "backend": "threads", "run_id": "from-file-1"},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    assert resp.json()["workflow_id"] == "mrp/example-wordcount/from-file-1"
    view = await wait_done(http, resp.json()["workflow_id"])
    # inputs.files resolved beside the job file, on the worker: four files, four shards.
    assert view["status"] == "succeeded", view
    assert view["counters"]["total"] == 4


async def test_paths_outside_the_roots_are_refused(http: httpx.AsyncClient, tmp_path: Path) -> None:
    outside = tmp_path / "job.yaml"
    outside.write_text(JOB)
    for body in (
        {"path": str(outside)},
        {"path": "../../pyproject.toml"},
        {"job_yaml": JOB, "base_dir": str(tmp_path)},
    ):
        resp = await http.post("/mrp/jobs", json=body, headers=auth("alice"))
        assert resp.status_code == 403, (body, resp.text)
        assert resp.json()["error"]["code"] == "path_not_allowed"
    missing = await http.post("/mrp/jobs", json={"path": "nope.yaml"}, headers=auth("alice"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


async def test_idempotency_key_starts_one_run(http: httpx.AsyncClient) -> None:
    headers = {**auth("alice"), "Idempotency-Key": "mrp-key-1"}
    body = {"job_yaml": JOB, "backend": "threads"}
    first = await http.post("/mrp/jobs", json=body, headers=headers)
    second = await http.post("/mrp/jobs", json=body, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert second.headers.get(REPLAY_HEADER) == "true"
    other = await http.post(
        "/mrp/jobs", json={**body, "backend": "ray"}, headers=headers
    )  # same key, another body
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    view = await wait_done(http, first.json()["workflow_id"])
    assert view["status"] == "succeeded"


async def test_auth_and_validation(http: httpx.AsyncClient) -> None:
    assert (await http.post("/mrp/jobs", json={"job_yaml": JOB})).status_code == 401
    forbidden = await http.post("/mrp/jobs", json={"job_yaml": JOB}, headers=auth("bob"))
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "forbidden"
    both = await http.post(
        "/mrp/jobs", json={"job_yaml": JOB, "path": "wordcount.yaml"}, headers=auth("alice")
    )
    assert both.status_code == 422
    bad = await http.post(
        "/mrp/jobs", json={"job_yaml": JOB.replace("budget_units", "budget_unit")},
        headers=auth("alice"),
    )  # fmt: skip
    assert bad.status_code == 422, bad.text
    err = bad.json()["error"]
    assert err["code"] == "invalid_job"
    assert "policy.budget_unit" in err["message"] and "job.yaml:16:" in err["message"]
    assert (await http.get("/mrp/jobs/no-such-run", headers=auth("bob"))).status_code == 404
    assert (await http.get("/mrp/jobs/no-such-run")).status_code == 401


async def test_a_refused_job_reads_as_failed_with_the_rule(http: httpx.AsyncClient) -> None:
    # Valid YAML, but over the service's worker cap: refused in the run's compile step.
    resp = await http.post(
        "/mrp/jobs",
        json={"job_yaml": JOB.replace("max_workers: 2", "max_workers: 64"), "backend": "threads"},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    view = await wait_done(http, resp.json()["workflow_id"])
    assert view["status"] == "failed"
    assert view["error_type"] == "MrpCompileError"
    assert "MRP-P001" in view["error"]


WORDCOUNT = (EXAMPLES / "wordcount.yaml").read_text()


async def test_inline_files_without_a_root_are_refused(http: httpx.AsyncClient) -> None:
    # Without base_dir the worker would glob its own checkout (.venv, .env, .keel/).
    greedy = WORDCOUNT.replace('files: ["data/*.txt"]', 'files: ["**/*.py"]')
    for text in (WORDCOUNT, greedy):
        resp = await http.post(
            "/mrp/jobs", json={"job_yaml": text, "backend": "threads"}, headers=auth("alice")
        )
        assert resp.status_code == 403, resp.text
        err = resp.json()["error"]
        assert err["code"] == "path_not_allowed" and "base_dir" in err["message"]


async def test_inline_files_under_a_root_are_allowed(http: httpx.AsyncClient) -> None:
    resp = await http.post(
        "/mrp/jobs",
        json={
            "job_yaml": WORDCOUNT,
            "base_dir": str(EXAMPLES),
            "backend": "threads",
            "run_id": "inline-rooted-1",
        },
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    view = await wait_done(http, resp.json()["workflow_id"])
    assert view["status"] == "succeeded", view
    assert view["counters"]["total"] == 4


async def test_the_worker_refuses_files_without_a_base_dir(
    http: httpx.AsyncClient, client: Client, api_settings: Settings
) -> None:
    """A run started around the API (as ``temporal workflow start`` does) is held to the
    same rule by the compile activity: no base_dir, no worker files."""
    job = WORDCOUNT.replace('files: ["data/*.txt"]', 'files: ["pyproject.toml"]')
    handle = await start_job(
        client,
        MRPJobInput(job_yaml=job, source="job.yaml", run_id="no-base-dir-1", backend="threads"),
        workflow_id="mrp/example-wordcount/no-base-dir-1",
        task_queue=api_settings.task_queue,
    )
    with pytest.raises(WorkflowFailureError) as info:
        await handle.result()
    kind, message = failure_of(info.value)
    assert kind == "MrpCompileError"
    assert "no base_dir" in message


async def test_a_second_requester_gets_404_for_the_first_ones_job(
    http: httpx.AsyncClient,
) -> None:
    resp = await http.post(
        "/mrp/jobs",
        json={"job_yaml": JOB, "backend": "threads", "run_id": "alices-run-1"},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    wid = resp.json()["workflow_id"]
    view = await wait_done(http, wid)
    assert view["status"] == "succeeded", view
    for ref in ("alices-run-1", wid):
        for other in ("carol", "bob"):
            got = await http.get(f"/mrp/jobs/{ref}", headers=auth(other))
            # The same answer as for an id that does not exist: nothing is confirmed.
            assert got.status_code == 404, (other, got.text)
            error = got.json()["error"]
            assert (error["code"], error["message"]) == ("not_found", f"no MRP run {ref!r}")
        assert (await http.get(f"/mrp/jobs/{ref}", headers=auth("root"))).status_code == 200


async def test_the_approvers_of_a_jobs_gate_read_it(
    http: httpx.AsyncClient, client: Client
) -> None:
    gated = JOB + "approval:\n  gate: ship\n  approvers: [bob]\n"
    resp = await http.post(
        "/mrp/jobs",
        json={"job_yaml": gated, "backend": "threads", "run_id": "gated-run-1"},
        headers=auth("alice"),
    )
    assert resp.status_code == 202, resp.text
    # By the workflow id the POST answered: a run id is found through visibility, which
    # lags a start by a moment (client/mrp.find_workflow_id; a loaded suite run saw 404).
    wid = resp.json()["workflow_id"]
    assert (await http.get(f"/mrp/jobs/{wid}", headers=auth("bob"))).status_code == 200
    assert (await http.get(f"/mrp/jobs/{wid}", headers=auth("carol"))).status_code == 404
    await client.get_workflow_handle(wid).terminate("test over")
