"""``GET /gates`` and ``GET /runs`` ask Temporal for the caller's rows (``KeelReaders``) a
page at a time: among a few hundred workflows of several callers, each caller walks
exactly theirs across page boundaries, none twice, none missing; ``admin`` sees them all.

The workflows are started through Keel's own client calls (``client.gate.start_gate``,
``client.temporal.start_by_type`` with the API's access memo) on this test's task queue,
where no worker runs: the gates stay pending (terminated at the end), the runs are
terminated at once (a closed run is listed like any other). Names are unique to the test, since the dev server is shared.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from temporalio.client import Client
from temporalio.worker import Worker

from api.app import create_app
from client.gate import start_gate, start_search_attributes
from client.readers import migrate_readers
from client.temporal import READERS_KEY, encode_page_token, start_by_type
from keel.access import ACCESS_MEMO, READERS_SIGNAL, access_for
from keel.gates import GATE_WORKFLOW_TYPE, GateRequest, gate_workflow_id
from keel.mrp.run import WORKFLOW_TYPE as MRP_TYPE
from keel.rllm.run import WORKFLOW_TYPE as RLLM_TYPE
from keel.settings import ApiToken, Settings
from keel.srl.steps import COLLECTION_TYPE as SRL_TYPE
from tests.core.integration.test_cli import keel_env, run
from tests.support.api import asgi_client, assert_error

TAG = uuid.uuid4().hex[:8]
ME = f"scoped-me-{TAG}"  # a requester: their own gates and runs
APPROVER = f"scoped-appr-{TAG}"  # an approver: gates and runs that name them
# Other requesters: one whose name holds characters a visibility query cannot take as they
# are, and two whose names start or end like mine (a reader is a whole value, not a prefix).
OTHERS = [f"scoped-o{i}-{TAG}" for i in range(2)] + [
    f'o"hara\\ ♡ {TAG}',
    f"{ME}-2",
    f"x{ME}",
]
ADMIN = f"scoped-root-{TAG}"
ROLES: dict[str, list[str]] = {
    ME: ["requester"],
    APPROVER: ["approver"],
    ADMIN: ["admin"],
    **{o: ["requester"] for o in OTHERS},
}
PAGE = 3  # small, so every walk crosses page boundaries
SIGNALED = "workflow_execution_signaled_event_attributes"


def _auth(actor: str) -> dict[str, str]:
    return {"Authorization": f"Bearer tok-{abs(hash(actor))}-{TAG}"}


@pytest.fixture
async def scoped_http(settings: Settings, client: Client) -> AsyncIterator[httpx.AsyncClient]:
    tokens = [
        ApiToken(token=SecretStr(_auth(a)["Authorization"][7:]), actor=a, roles=r)  # type: ignore[arg-type]
        for a, r in ROLES.items()
    ]
    app = create_app(settings.model_copy(update={"api_tokens": tokens}), client=client)
    async with asgi_client(app) as c:
        yield c


async def _walk(
    http: httpx.AsyncClient, path: str, key: str, actor: str, **params: Any
) -> list[str]:
    """Every id ``actor`` gets from ``path``, following ``next_page_token`` to the end."""
    ids: list[str] = []
    token: str | None = None
    for _ in range(1000):
        query = {**params, **({"page_token": token} if token else {})}
        resp = await http.get(path, params=query, headers=_auth(actor))
        assert resp.status_code == 200, resp.text
        body = resp.json()
        rows = body[key]
        assert len(rows) <= params["limit"]
        ids += [r["gate_id" if key == "gates" else "workflow_id"] for r in rows]
        token = body["next_page_token"]
        if token is None:
            return ids
    raise AssertionError(f"{path} for {actor} never ended")


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    """Poll ``check`` until it holds: visibility lags the starts."""
    deadline = time.monotonic() + timeout_s
    while not await check() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)


async def test_each_caller_pages_through_exactly_their_gates_and_runs(
    scoped_http: httpx.AsyncClient, client: Client, settings: Settings
) -> None:
    http, queue = scoped_http, settings.task_queue
    started: list[str] = []
    limiter = asyncio.Semaphore(16)

    async def gate(n: int, requester: str, approvers: list[str]) -> str:
        gid = gate_workflow_id(f"scoped/{TAG}/{n}", "deploy")
        req = GateRequest(name="deploy", requester=requester, approvers=approvers)
        async with limiter:
            await start_gate(client, req, gate_id=gid, task_queue=queue)
        started.append(gid)
        return gid

    async def run(n: int, wf_type: str, owner: str | None, approvers: list[str]) -> str:
        wid = f"scoped-run/{TAG}/{n}"
        # As the API starts them: rllm and srl runs name no gates, an MRP job its approvers.
        gates = [approvers] if approvers else []
        memo = {ACCESS_MEMO: access_for(owner, gates)} if owner else None
        async with limiter:
            handle = await start_by_type(
                client, wf_type, {"scoped": n}, workflow_id=wid, task_queue=queue,
                result_type=dict, memo=memo,
            )  # fmt: skip
            # Ended at once: a run with no worker would hold each page on its progress
            # query; a closed run keeps its attributes and is listed all the same.
            await handle.terminate("listed closed")
        return wid

    types = [RLLM_TYPE, MRP_TYPE, SRL_TYPE]
    gate_specs: list[tuple[str, list[str]]] = (
        [(o, ["someone-else"]) for o in OTHERS for _ in range(35)]  # 140 of others'
        + [(ME, ["someone-else"])] * 7  # mine
        + [(OTHERS[0], [APPROVER, "x"])] * 5  # others', naming my approver
    )
    run_specs: list[tuple[str | None, list[str]]] = (
        [(o, ["someone-else"]) for o in OTHERS for _ in range(25)]  # 100 of others'
        + [(ME, [])] * 7  # mine
        + [(OTHERS[1], [APPROVER])] * 4  # others', naming my approver
        + [(None, [])] * 5  # started outside the API: no memo, no readers
    )
    try:
        gate_ids = await asyncio.gather(*(gate(n, r, a) for n, (r, a) in enumerate(gate_specs)))
        run_ids = await asyncio.gather(
            *(run(n, types[n % 3], o, a) for n, (o, a) in enumerate(run_specs))
        )
        mine_g = {g for g, (r, _) in zip(gate_ids, gate_specs, strict=True) if r == ME}
        appr_g = {g for g, (_, a) in zip(gate_ids, gate_specs, strict=True) if APPROVER in a}
        mine_r = {w for w, (o, _) in zip(run_ids, run_specs, strict=True) if o == ME}
        appr_r = {w for w, (_, a) in zip(run_ids, run_specs, strict=True) if APPROVER in a}
        ours = set(gate_ids) | set(run_ids)

        async def gates_of(actor: str) -> list[str]:
            return await _walk(http, "/gates", "gates", actor, limit=PAGE)

        async def runs_of(actor: str) -> list[str]:
            return await _walk(http, "/runs", "runs", actor, limit=PAGE)

        # Wait until visibility holds every start (admin, 100 a page, sees them all).
        async def all_visible() -> bool:
            seen = set(await _walk(http, "/gates", "gates", ADMIN, limit=100))
            seen |= set(await _walk(http, "/runs", "runs", ADMIN, limit=100))
            return ours <= seen

        await _until(all_visible)

        def once(rows: list[str]) -> bool:
            """None of this test's rows twice. Only ours: another test's run that closes
            while a caller pages moves in the newest-first order (visibility sorts open
            runs first), so it can show on two pages; ours are all settled by now."""
            own = [r for r in rows if r in ours]
            return len(own) == len(set(own))

        for actor, want_g, want_r in [(ME, mine_g, mine_r), (APPROVER, appr_g, appr_r)]:
            got_g, got_r = await gates_of(actor), await runs_of(actor)
            assert once(got_g) and once(got_r), actor
            # Other tests share this server: a gate naming no approver is every
            # approver's (role:approver), so compare among this test's own.
            assert set(got_g) & ours == want_g, actor
            assert set(got_r) & ours == want_r, actor
        # Each other requester: exactly their 35 gates and 25 runs (the quoted name too).
        for other in OTHERS:
            got_g = await gates_of(other)
            assert once(got_g)
            assert len(set(got_g) & ours) == 35 + (5 if other == OTHERS[0] else 0)
            want = {g for g, (r, _) in zip(gate_ids, gate_specs, strict=True) if r == other}
            assert set(got_g) & ours == want
        # admin pages through everyone's, the runs without readers too, none twice.
        got_g, got_r = await gates_of(ADMIN), await runs_of(ADMIN)
        assert once(got_g) and once(got_r)
        assert set(gate_ids) <= set(got_g) and set(run_ids) <= set(got_r)

        # A family filter narrows the same query; newest first within it.
        got = await _walk(http, "/runs", "runs", ME, limit=2, family="mrp")
        assert set(got) & ours == {w for w in mine_r if int(w.rsplit("/", 1)[1]) % 3 == 1}

        # Another caller's page token reads that caller's rows only: the filter is the
        # query, the token only where to go on.
        first = (await http.get("/runs", params={"limit": 2}, headers=_auth(ME))).json()
        assert first["next_page_token"]
        other = await http.get(
            "/runs",
            params={"limit": 100, "page_token": first["next_page_token"]},
            headers=_auth(APPROVER),
        )
        assert other.status_code == 200, other.text
        # Among this test's own: other tests' design runs naming no approver are every
        # approver's (role:approver) and may be on the page too.
        assert {r["workflow_id"] for r in other.json()["runs"]} & ours <= appr_r
    finally:

        async def end(wid: str) -> None:
            async with limiter:
                await client.get_workflow_handle(wid).terminate("test over")

        await asyncio.gather(*(end(w) for w in started), return_exceptions=True)


async def test_a_page_token_not_handed_out_is_refused(scoped_http: httpx.AsyncClient) -> None:
    """Garbage, an empty token, a non-JSON one, an oversize one: 422 at once, never a
    Temporal error. A JSON object of another shape may reach Temporal, which answers it as
    a cursor: still the caller's query, so no row that is not theirs (this caller has none)."""
    encode = encode_page_token
    for bad in ["!!!", "AAAA", "", encode(b"not json"), encode(b"[1, 2]"), "x" * 5000]:
        for path in ["/gates", "/runs"]:
            resp = await scoped_http.get(path, params={"page_token": bad}, headers=_auth(ME))
            if bad == "":  # no token: the first page
                assert resp.status_code == 200, resp.text
                continue
            assert_error(resp, 422, "validation_failed")
    foreign = encode(b'{"' + b"a" * 3000 + b'": 1}')
    for path, key in [("/gates", "gates"), ("/runs", "runs")]:
        resp = await scoped_http.get(path, params={"page_token": foreign}, headers=_auth(ME))
        if resp.status_code != 422:
            assert resp.status_code == 200, resp.text
            assert resp.json()[key] == []


async def test_gates_started_without_readers_set_them_themselves(
    scoped_http: httpx.AsyncClient, client: Client, settings: Settings, worker: Worker
) -> None:
    """Gates started without ``KeelReaders`` (with the API's memo, or none at all, as
    ``temporal workflow start`` does) set it at their start from their own memo or else
    their request (patch ``gate-self-readers``), so nothing is left for
    ``migrate_readers`` (it still serves gates started before that patch: see
    ``test_migrate_command_lists_then_signals_the_gates_without_readers`` and the
    ``gate_readers_signal`` history)."""
    http, queue = scoped_http, settings.task_queue

    async def legacy(n: int, requester: str, with_memo: bool) -> str:
        gid = gate_workflow_id(f"legacy/{TAG}/{n}", "deploy")
        req = GateRequest(name="deploy", requester=requester, approvers=[APPROVER])
        memo = {ACCESS_MEMO: access_for(requester, [req.approvers])} if with_memo else None
        await client.start_workflow(
            GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue, memo=memo,
            search_attributes=start_search_attributes(req),
        )  # fmt: skip
        return gid

    with_memo, bare = await legacy(0, ME, True), await legacy(1, OTHERS[0], False)
    current = gate_workflow_id(f"legacy/{TAG}/2", "deploy")
    req = GateRequest(name="deploy", requester=ME, approvers=[APPROVER])
    await start_gate(client, req, gate_id=current, task_queue=queue)
    started = [with_memo, bare, current]
    try:

        async def listed(actor: str) -> set[str]:
            return set(await _walk(http, "/gates", "gates", actor, limit=50)) & set(started)

        async def approver_sees_all() -> bool:
            return await listed(APPROVER) == set(started)

        await _until(approver_sees_all)
        assert await listed(ADMIN) == set(started)
        assert await listed(APPROVER) == set(started)
        assert await listed(ME) == {with_memo, current}
        assert await listed(OTHERS[0]) == {bare}
        for gid in (with_memo, bare):
            desc = await client.get_workflow_handle(gid).describe()
            assert desc.typed_search_attributes.get(READERS_KEY) is not None
        assert await migrate_readers(client, dry_run=True, task_queue=queue) == []
    finally:
        await asyncio.gather(
            *(client.get_workflow_handle(g).terminate("test over") for g in started),
            return_exceptions=True,
        )


async def test_migrate_command_lists_then_signals_the_gates_without_readers(
    client: Client, temporal_address: str, tmp_path: Path
) -> None:
    """``keel migrate-search-attributes``: ``--dry-run`` names them and signals none; the
    run signals each (the signal waits in history for a worker, none here)."""
    queue = f"migrate-cli-{TAG}"
    req = GateRequest(name="deploy", requester=ME, approvers=[APPROVER])
    gid = gate_workflow_id(f"migrate-cli/{TAG}", "deploy")
    await client.start_workflow(
        GATE_WORKFLOW_TYPE, req, id=gid, task_queue=queue,
        search_attributes=start_search_attributes(req),
    )  # fmt: skip
    handle = client.get_workflow_handle(gid)
    env = {**keel_env(tmp_path / "keel"), "KEEL_TEMPORAL_ADDRESS": temporal_address}
    args = ["migrate-search-attributes", "--task-queue", queue, "--text"]
    try:

        async def dry_run() -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(run, [*args, "--dry-run"], env, 60)

        proc = await dry_run()
        for _ in range(30):  # visibility lags the start
            if proc.stdout.split() == [gid]:
                break
            await asyncio.sleep(0.5)
            proc = await dry_run()
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [gid]
        assert "would signal 1 open workflow(s)" in proc.stderr
        signals = [e async for e in handle.fetch_history_events() if e.HasField(SIGNALED)]
        assert signals == []

        proc = await asyncio.to_thread(run, args, env, 60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [gid] and "signalled 1 open workflow(s)" in proc.stderr
        names = [
            e.workflow_execution_signaled_event_attributes.signal_name
            async for e in handle.fetch_history_events()
            if e.HasField(SIGNALED)
        ]
        assert names == [READERS_SIGNAL]
    finally:
        await handle.terminate("test over")
