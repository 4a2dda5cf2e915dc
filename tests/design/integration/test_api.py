"""The design API over real HTTP (uvicorn on loopback) against the session's dev server and
a real worker: projects, constraints, the SSE stream (with a disconnect and a resume by
Last-Event-ID), answers, approval, codegen, signed downloads, scoping and webhooks."""

from __future__ import annotations

import asyncio
import io
import json
import time
import uuid
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from temporalio.client import Client
from temporalio.worker import Worker

from api.app import create_app
from keel import signed_urls, webhooks
from keel.design.validation import tree_digest
from keel.settings import Settings
from services.processes import free_port
from store.design import decision_sets_of
from store.design_git import git, repo_path
from tests.support.api import asgi_client, assert_error, auth, with_tokens
from tests.support.webhook_receiver import WebhookReceiver
from workers.main import build_worker

#: A guided form that covers the intake: no questions, straight to the planner.
FULL_FORM: dict[str, Any] = {
    "cloud": "aws",
    "workload_types": ["batch"],
    "data_classification": "internal",
    "budget_band": "medium",
    "regions": ["us-east-1"],
}
#: Leaves budget and regions open: the pipeline asks for regions.
PARTIAL_FORM: dict[str, Any] = {
    "cloud": "aws",
    "workload_types": ["batch"],
    "data_classification": "internal",
}
TERMINAL = ("run-complete", "run-error")


@dataclass
class Api:
    app: FastAPI
    http: httpx.AsyncClient
    base_url: str


@pytest.fixture
async def api(api_settings: Settings, client: Client, worker: Worker) -> AsyncIterator[Api]:
    """The API served by uvicorn on a loopback port: a real socket, so a client can drop
    a stream half way (the in-process transport buffers whole responses)."""
    app = create_app(api_settings, client=client)
    app.state.sse_ping_s = 0.2
    app.state.sse_poll_s = 0.1
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.05)
    assert server.started, "uvicorn did not start"
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            yield Api(app, http, base)
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)


@dataclass
class Frame:
    id: int | None
    event: str
    data: dict[str, Any]


async def read_sse(
    http: httpx.AsyncClient,
    ds: str,
    actor: str,
    *,
    until: str | None = None,
    last_event_id: int | None = None,
    timeout_s: float = 60,
) -> list[Frame]:
    """Frames of ``/design/streams/{ds}`` until the stream ends, or (``until``) until the first
    event of that type, after which the client hangs up."""
    headers = auth(actor)
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    frames: list[Frame] = []
    fields: dict[str, str] = {}
    async with asyncio.timeout(timeout_s):
        async with http.stream("GET", f"/design/streams/{ds}", headers=headers) as resp:
            assert resp.status_code == 200, await resp.aread()
            assert resp.headers["content-type"].startswith("text/event-stream")
            async for line in resp.aiter_lines():
                if line:
                    name, _, value = line.partition(": ")
                    fields[name] = value
                    continue
                frame = Frame(
                    int(fields["id"]) if "id" in fields else None,
                    fields["event"],
                    json.loads(fields["data"]),
                )
                fields = {}
                frames.append(frame)
                if until is not None and frame.event == until:
                    return frames
    return frames


def events_only(frames: list[Frame]) -> list[Frame]:
    return [f for f in frames if f.event != "ping"]


async def new_project(http: httpx.AsyncClient, actor: str = "alice") -> str:
    project = f"p-{uuid.uuid4().hex[:8]}"
    resp = await http.post(
        "/design/projects", json={"id": project, "name": "Churn"}, headers=auth(actor)
    )
    assert resp.status_code == 201, resp.text
    assert resp.json() == {"project_id": project}
    return project


async def submit(
    http: httpx.AsyncClient, project: str, actor: str = "alice", **body: Any
) -> dict[str, Any]:
    resp = await http.post(
        f"/design/projects/{project}/constraints", json=body, headers=auth(actor)
    )
    assert resp.status_code == 202, resp.text
    started: dict[str, Any] = resp.json()
    assert started["stream_url"] == f"/design/streams/{started['decision_set_id']}"
    return started


async def approve(http: httpx.AsyncClient, ds: str, actor: str = "bob") -> httpx.Response:
    return await http.post(
        f"/design/decision-sets/{ds}/approve",
        json={"status": "approve", "comment": "fine"},
        headers=auth(actor),
    )


async def timeline(http: httpx.AsyncClient, ds: str) -> list[dict[str, Any]]:
    resp = await http.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    events: list[dict[str, Any]] = resp.json()["events"]
    return events


async def test_disconnect_and_resume_by_last_event_id(api: Api, client: Client) -> None:
    http = api.http
    project = await new_project(http)
    ds = (await submit(http, project, intake=PARTIAL_FORM, generate=False, approvers=["bob"]))[
        "decision_set_id"
    ]

    # First connection: up to the questions, then the client hangs up.
    first = await read_sse(http, ds, "alice", until="questions")
    got = events_only(first)
    assert got[-1].event == "questions" and got[-1].data["fields"] == ["regions"]
    assert [f.id for f in got] == list(range(len(got)))
    # The server noticed the hang-up: the stream's generator ended, nothing left running.
    for _ in range(100):
        if api.app.state.design_streams == 0:
            break
        await asyncio.sleep(0.05)
    assert api.app.state.design_streams == 0

    # While it waits for answers, the details show the open questions.
    details = (await http.get(f"/design/decision-sets/{ds}", headers=auth("alice"))).json()
    assert details["live"]["phase"] == "waiting_for_answers"
    assert [q["field"] for q in details["live"]["questions"]] == ["regions"]
    # Not persisted yet: the row's status is the run's, not a stale "submitted".
    assert details["stored"]["version"] == 0
    assert details["stored"]["status"] == "running" and details["run_status"] == "running"
    listed = (
        await http.get(f"/design/projects/{project}/decision-sets", headers=auth("alice"))
    ).json()
    assert [d["status"] for d in listed["decision_sets"] if d["id"] == ds] == ["running"]

    # A refused answer names its field; nothing changes. Approving now has no gate.
    bad = assert_error(
        await http.post(
            f"/design/decision-sets/{ds}/answers",
            json={"answers": {"regions": ["Mars 1"]}},
            headers=auth("alice"),
        ),
        422,
        "validation_failed",
    )
    assert "regions" in json.dumps(bad["details"]) and bad["run_id"] == f"design/{project}/{ds}"
    no_gate = assert_error(await approve(http, ds), 409, "no_open_gate")
    assert no_gate["run_id"] == f"design/{project}/{ds}" and no_gate["node_name"]

    # A second stream resumes after the last event seen, with pings while the run waits.
    resume_task = asyncio.create_task(
        read_sse(http, ds, "alice", last_event_id=got[-1].id, until="gate-waiting")
    )
    await asyncio.sleep(0.6)
    ok = await http.post(
        f"/design/decision-sets/{ds}/answers",
        json={"answers": {"budget_band": "medium", "regions": ["us-east-1"]}},
        headers=auth("alice"),
    )
    assert ok.status_code == 200, ok.text
    assert_error(
        await http.post(
            f"/design/decision-sets/{ds}/answers",
            json={"answers": {"budget_band": "high"}},
            headers=auth("alice"),
        ),
        409,
        "no_open_questions",
    )
    second = await resume_task
    assert any(f.event == "ping" and f.data == {} and f.id is None for f in second)
    resumed = events_only(second)
    assert resumed[0].id == got[-1].id + 1 and resumed[0].event == "answers"

    # Approved by bob (carol, not an approver, cannot); the third stream runs to the end.
    assert_error(await approve(http, ds, "carol"), 403, "forbidden")
    decided = await approve(http, ds)
    assert decided.status_code == 200, decided.text
    assert decided.json()["status"] == "approved" and decided.json()["decided_by"] == "bob"
    third = events_only(await read_sse(http, ds, "alice", last_event_id=resumed[-1].id))
    assert third[-1].event == "run-complete" and third[-1].data["version"] == 1

    streamed = got + resumed + third
    stored = await timeline(http, ds)
    # No event lost, none repeated: the streams together are the timeline.
    assert [(f.id, f.event, f.data) for f in streamed] == [
        (e["seq"], e["type"], e["payload"]) for e in stored
    ]
    assert [f.id for f in streamed] == list(range(len(stored)))
    assert {"coverage-update", "questions", "answers", "plan-ready", "gate-waiting"} <= {
        e["type"] for e in stored
    }
    assert all(e["payload"]["decision_set_id"] == ds for e in stored)


async def test_whole_flow_with_codegen_and_signed_download(
    api: Api, api_settings: Settings
) -> None:
    http = api.http
    project = await new_project(http)
    planned = await submit(http, project, intake=FULL_FORM, generate=False, approvers=["bob"])
    ds = planned["decision_set_id"]
    waiting = events_only(await read_sse(http, ds, "alice", until="gate-waiting"))
    assert waiting[-1].data["gate"] == "plan-r1"
    assert (await approve(http, ds)).status_code == 200
    frames = events_only(await read_sse(http, ds, "alice"))
    assert frames[-1].event == "run-complete"
    assert {"reason-card", "cost-update", "policy-update", "approval"} <= {f.event for f in frames}

    details = (await http.get(f"/design/decision-sets/{ds}", headers=auth("alice"))).json()
    assert details["stored"]["status"] == "completed" and details["stored"]["version"] == 1
    assert details["cost"]["monthly_usd"] > 0 and details["policy"]["overall"] in ("pass", "warn")
    assert details["artifacts"] == []  # planned only
    assert_error(
        await http.get(f"/design/decision-sets/{ds}/download", headers=auth("alice")),
        404,
        "not_found",
    )

    # Codegen: a new decision set over this one. Its validators are chosen: this test is
    # about the API (the whole set runs on these shapes in test_validators.py and in the
    # free-text run to the archive, test_pipeline.py); an unknown name is refused first.
    refused = await http.post(
        f"/design/decision-sets/{ds}/generate", headers=auth("alice"), json={"validators": ["lint"]}
    )
    assert_error(refused, 422, "validation_failed")
    assert "unknown validator(s) lint" in refused.text
    none = await http.post(
        f"/design/decision-sets/{ds}/generate", headers=auth("alice"), json={"validators": []}
    )
    assert_error(none, 422, "validation_failed")
    assert "name at least one validator, or leave validators out" in none.text
    gen = await http.post(
        f"/design/decision-sets/{ds}/generate",
        headers=auth("alice"),
        json={"validators": ["wiring", "ruff", "hcl"]},
    )
    assert gen.status_code == 202, gen.text
    code_ds = gen.json()["decision_set_id"]
    assert gen.json()["previous_decision_set"] == ds and code_ds != ds
    done = events_only(await read_sse(http, code_ds, "alice", timeout_s=240))
    assert done[-1].event == "run-complete", done[-1]
    (validation,) = [f.data for f in done if f.event == "validation"]
    # The three chosen ran and passed; the others were not selected, so not run.
    ran = {name: status for name, status in validation["summary"].items() if status != "not_run"}
    assert ran == {"ruff": "passed", "hcl": "passed", "wiring": "passed"}, validation
    assert len(validation["summary"]) == 11 and validation["failed"] == []
    code = (await http.get(f"/design/decision-sets/{code_ds}", headers=auth("alice"))).json()
    assert code["stored"]["parent_id"] == ds
    archive = [a for a in code["artifacts"] if a["kind"] == "archive"]
    assert (
        len(archive) == 1
        and archive[0]["download_url"] == f"/design/decision-sets/{code_ds}/download"
    )

    link = await http.get(archive[0]["download_url"], headers=auth("alice"))
    assert link.status_code == 200, link.text
    url = link.json()["url"]
    assert url.startswith(api.base_url + "/design/artifacts/blake3:")
    # The signed URL needs no token.
    async with httpx.AsyncClient() as anonymous:
        got = await anonymous.get(url)
        assert got.status_code == 200, got.text
        assert got.headers["content-type"] == "application/zip"
        zf = zipfile.ZipFile(io.BytesIO(got.content))
        names = zf.namelist()
        assert names and any(n.endswith(".md") for n in names)
        # An iteration: the diff is in the tree, and the tree validated is the archive's.
        assert "reports/diff.json" in names
        shipped = {n: zf.read(n) for n in names}
        assert code["validation"]["tree_digest"] == tree_digest(shipped)
        assert got.headers["x-keel-validation"] == "passed"
        assert len(got.content) == archive[0]["size_bytes"]

        # Tampered: another expiry, another signature, no signature.
        parts = urlsplit(url)
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        later = (
            f"{api.base_url}{parts.path}?expires={int(query['expires']) + 3600}&sig={query['sig']}"
        )
        assert_error(await anonymous.get(later), 403, "forbidden")
        bad_sig = url[:-1] + ("0" if url[-1] != "0" else "1")
        assert_error(await anonymous.get(bad_sig), 403, "forbidden")
        assert_error(await anonymous.get(api.base_url + parts.path), 403, "forbidden")
        # Expired: correctly signed with the server's key, but in the past.
        key = signed_urls.derive_key(api_settings.webhook_secret.get_secret_value())
        past = signed_urls.signed_path(key, parts.path, int(time.time()) - 1)
        assert_error(await anonymous.get(api.base_url + past), 403, "forbidden")

    # The repository's files and diffs come from the project's git history: the commit of
    # the decision set holds what the archive holds, plus the plan.md it adds.
    repo = repo_path(api_settings.design_repos_dir, project)
    committed = git(repo, "ls-tree", "-r", "--name-only", f"ds/{code_ds}").stdout.split()
    assert sorted(committed) == sorted([*shipped, "plan.md"])
    files = (await http.get(f"/design/decision-sets/{code_ds}/files", headers=auth("alice"))).json()
    assert [f["path"] for f in files["files"]] == sorted(shipped)
    assert {f["path"]: f["size_bytes"] for f in files["files"]} == {
        n: len(b) for n, b in shipped.items()
    }
    readme = await http.get(
        f"/design/decision-sets/{code_ds}/files/README.md", headers=auth("alice")
    )
    assert readme.json()["text"] == shipped["README.md"].decode()
    for missing in ("plan.md", "nope.txt"):
        assert_error(
            await http.get(
                f"/design/decision-sets/{code_ds}/files/{missing}", headers=auth("alice")
            ),
            404,
            "not_found",
        )
    # Against a planned-only set every file is added, and a file's diff is the whole file.
    changes = (
        await http.get(f"/design/decision-sets/{code_ds}/diff", headers=auth("alice"))
    ).json()
    assert changes["previous_decision_set"] == ds and changes["previous_has_files"] is False
    assert {c["path"]: c["status"] for c in changes["changes"]} == dict.fromkeys(shipped, "added")
    one = (
        await http.get(f"/design/decision-sets/{code_ds}/diff/README.md", headers=auth("alice"))
    ).json()
    assert one["status"] == "added"
    assert one["diff"].startswith(f"--- /dev/null\n+++ {code_ds}/README.md\n@@ -0,0 +1,")
    added = [ln[1:] for ln in one["diff"].splitlines(keepends=True)[3:] if ln[0] == "+"]
    assert "".join(added) == shipped["README.md"].decode()
    assert_error(
        await http.get(f"/design/decision-sets/{ds}/diff", headers=auth("alice")), 404, "not_found"
    )
    # The old, unprefixed paths are gone.
    for old in ("/projects", f"/decision-sets/{code_ds}", f"/decision-sets/{code_ds}/files"):
        assert (await http.get(old, headers=auth("alice"))).status_code == 404, old

    # Generating twice from one planned set is refused once it has a repository.
    assert_error(
        await http.post(f"/design/decision-sets/{code_ds}/generate", headers=auth("alice")),
        409,
        "conflict",
    )


async def test_scoping_idempotency_and_bad_bodies(api: Api, client: Client) -> None:
    http = api.http
    project = await new_project(http)
    # The same owner again: 200; another owner: 409; an approver-only caller: 403.
    again = await http.post("/design/projects", json={"id": project}, headers=auth("alice"))
    assert again.status_code == 200 and again.json() == {"project_id": project}
    assert_error(
        await http.post("/design/projects", json={"id": project}, headers=auth("carol")),
        409,
        "conflict",
    )
    assert_error(
        await http.post("/design/projects", json={"id": "x"}, headers=auth("bob")), 403, "forbidden"
    )
    mine = (await http.get("/design/projects", headers=auth("alice"))).json()["projects"]
    assert project in [p["id"] for p in mine] and all(p["owner_id"] == "alice" for p in mine)
    theirs = (await http.get("/design/projects", headers=auth("carol"))).json()["projects"]
    assert project not in [p["id"] for p in theirs]
    every = (await http.get("/design/projects", headers=auth("root"))).json()["projects"]
    assert project in [p["id"] for p in every]

    # Another requester cannot post to the project: it reads as absent.
    assert_error(
        await http.post(f"/design/projects/{project}/constraints", json={"intake": PARTIAL_FORM}, headers=auth("carol")),
        404,
        "not_found",
    )  # fmt: skip

    # Bad bodies: a field the API sets itself, values out of range.
    for body in (
        {"intake": PARTIAL_FORM, "project": "other"},
        {"intake": PARTIAL_FORM, "requester": "mallory"},
        {"intake": PARTIAL_FORM, "coverage_threshold": 2},
        # Policy is the organisation's: a caller cannot loosen the cost gate of its run.
        {"intake": PARTIAL_FORM, "policy": {"gate_delta_usd": 1e9}},
        {"intake": PARTIAL_FORM, "gate_expires_in_s": 10 * 365 * 24 * 3600},
    ):
        assert_error(
            await http.post(
                f"/design/projects/{project}/constraints", json=body, headers=auth("alice")
            ),
            422,
            "validation_failed",
        )
    assert_error(
        await http.post(
            f"/design/projects/{project}/constraints",
            json={"intake": PARTIAL_FORM, "previous_decision_set": "ds-nope"},
            headers=auth("alice"),
        ),
        422,
        "validation_failed",
    )

    # Idempotent: the same key and body start one decision set.
    body = {"intake": PARTIAL_FORM, "generate": False, "approvers": ["dave"]}
    key = {"Idempotency-Key": f"k-{uuid.uuid4()}"}
    url = f"/design/projects/{project}/constraints"
    one = await http.post(url, json=body, headers={**auth("alice"), **key})
    two = await http.post(url, json=body, headers={**auth("alice"), **key})
    assert one.status_code == two.status_code == 202
    assert one.json() == two.json() and two.headers["Idempotent-Replayed"] == "true"
    other = await http.post(url, json={**body, "generate": True}, headers={**auth("alice"), **key})
    assert_error(other, 422, "idempotency_key_reused")
    ds = one.json()["decision_set_id"]
    listed = (await http.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))).json()
    assert listed["project_id"] == project
    assert [r["id"] for r in decision_sets_of(api.app.state.sessions, project)] == [ds]

    # bob (an approver, not of this run) and carol see nothing of it; admin does.
    for actor in ("bob", "carol"):
        for path in (f"/design/decision-sets/{ds}", f"/design/decision-sets/{ds}/events", f"/design/streams/{ds}",
                     f"/design/decision-sets/{ds}/download"):  # fmt: skip
            assert_error(await http.get(path, headers=auth(actor)), 404, "not_found")
    assert_error(await approve(http, ds, "bob"), 404, "not_found")
    assert (await http.get(f"/design/decision-sets/{ds}", headers=auth("root"))).status_code == 200
    assert_error(
        await http.get("/design/decision-sets/ds-none", headers=auth("alice")), 404, "not_found"
    )

    # A terminated run's stream and timeline end with run-error.
    await read_sse(http, ds, "alice", until="questions")
    await client.get_workflow_handle(f"design/{project}/{ds}").terminate("test over")
    frames = events_only(await read_sse(http, ds, "alice", last_event_id=0))
    assert frames[-1].event == "run-error" and frames[-1].data["status"] == "terminated"
    assert (await timeline(http, ds))[-1]["type"] == "run-error"


async def _until_done(http: httpx.AsyncClient, ds: str) -> list[dict[str, Any]]:
    for _ in range(600):
        resp = await http.get(f"/design/decision-sets/{ds}/events", headers=auth("alice"))
        assert resp.status_code == 200, resp.text
        if resp.json()["done"]:
            events: list[dict[str, Any]] = resp.json()["events"]
            return events
        await asyncio.sleep(0.1)
    raise AssertionError(f"decision set {ds} did not finish")


async def test_webhooks_signed_for_plan_gate_complete_and_error(
    client: Client, settings: Settings
) -> None:
    with WebhookReceiver() as receiver:
        # The worker posts only to allowed URLs; the API refuses others at once.
        settings.webhook_allowed_prefixes = [receiver.url]
        app = create_app(with_tokens(settings), client=client)
        async with build_worker(client, settings), asgi_client(app) as http:
            project = await new_project(http)
            assert_error(
                await http.post(
                    f"/design/projects/{project}/constraints",
                    json={"intake": FULL_FORM, "webhook_url": "http://127.0.0.1:1/elsewhere"},
                    headers=auth("alice"),
                ),
                422,
                "validation_failed",
            )
            hooks = {"webhook_url": receiver.url, "generate": False}
            ds = (await submit(http, project, intake=FULL_FORM, approvers=["bob"], **hooks))[
                "decision_set_id"
            ]
            for _ in range(100):
                resp = await approve(http, ds)
                if resp.status_code == 200:
                    break
                assert_error(resp, 409, "no_open_gate")
                await asyncio.sleep(0.1)
            assert resp.status_code == 200, resp.text
            assert (await _until_done(http, ds))[-1]["type"] == "run-complete"

            bad = {**PARTIAL_FORM, "regions": ["Mars 1"]}
            failed = (await submit(http, project, intake=bad, **hooks))["decision_set_id"]
            assert (await _until_done(http, failed))[-1]["type"] == "run-error"

    secret = settings.webhook_secret.get_secret_value()
    by_ds: dict[str, list[dict[str, Any]]] = {}
    for d in receiver.deliveries:
        ts = int(d.headers["X-Keel-Timestamp"])
        assert webhooks.verify(secret, ts, d.body, d.headers["X-Keel-Signature"], now=time.time())
        assert d.headers["X-Keel-Event"] == d.json["event"] and d.headers["Idempotency-Key"]
        by_ds.setdefault(d.json["decision_set_id"], []).append(d.json)
    ok = by_ds[ds]
    assert [n["event"] for n in ok if n["event"] != "gate.waiting"][-1] == "run.complete"
    assert sorted(n["event"] for n in ok) == [
        "gate.waiting",
        "plan.ready",
        "run.complete",
    ]
    gate = next(n for n in ok if n["event"] == "gate.waiting")
    assert gate["gate_id"] == f"design/{project}/{ds}/gate/plan-r1" and gate["plan_round"] == 1
    done = next(n for n in ok if n["event"] == "run.complete")
    assert done["status"] == "completed" and done["version"] == 1
    [error] = by_ds[failed]
    assert error["event"] == "run.error" and "regions" in error["message"]
    # A forged signature does not verify.
    d = receiver.deliveries[0]
    assert not webhooks.verify(
        "not-the-secret", int(d.headers["X-Keel-Timestamp"]), d.body,
        d.headers["X-Keel-Signature"], now=time.time(),
    )  # fmt: skip
