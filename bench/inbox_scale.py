"""``GET /gates`` and ``GET /runs`` for a caller with 5 rows among 10,000 of each, and
``GET /runs`` for a caller with 500 running runs, each against one bare visibility query
of the same filter.

    uv run python bench/inbox_scale.py [--gates 10000] [--runs 10000] [--mine 5]
                                       [--running 500] [--callers 20] [--repeat 100]
                                       [--chunk 200]

One dev server (SQLite WAL) and the API (uvicorn on loopback) run in this process; no
worker. Setup, timed and printed (starts batched ``--chunk`` at once):

* ``--gates`` pending gates (``client.gate.start_gate``, as ``POST /gates`` starts them:
  memo and ``KeelReaders``), requested by ``--callers`` callers, each naming one of them as
  approver; the bench's caller is approver of ``--mine`` of them, spread through the rest;
* ``--runs`` finished runs, of the three run types ``GET /runs`` lists (``RllmApp``,
  ``MRPJob``, ``SRLCollection``, in turn), each started by type with its owner's access
  memo exactly as the API starts a run (``client.temporal.start_by_type``: memo and
  ``KeelReaders``), then terminated: a closed row of its type, all that ``GET /runs`` reads
  for a finished run. They are not run by a worker: a real run costs a worker's time per
  run (an LLM call, a Ray map), which this bench does not measure; the visibility rows are
  the same but for the close status. The caller owns ``--mine`` of them.
* ``--running`` running runs of a second caller (``bench-busy``), of the same types in
  turn, started with its access memo and a progress memo (``keel.progress``) exactly as a
  run's own upsert leaves them in its visibility row, and left running: no worker takes
  them. ``GET /runs`` shows each one's progress; before the progress memo it sent one
  Temporal Query per running row of the page (all at once, 2 s timeout each), so with no
  worker every page waited 2 s, and with a worker it was 100 round trips through it. The
  bench times that too, a few times (``--old-repeat``): the 100 Queries of one page.

Then, interleaved ``--repeat`` times, each timed from this process:

* floor: one ``client.list_workflows`` page (``page_size`` 100) of the query the route
  sends (workflow type, status, ``KeelReaders IN (the caller's terms)``);
* Keel: ``GET /gates?limit=100`` and ``GET /runs?limit=100`` as the caller (bearer token),
  each asserted to hold exactly the caller's rows;
* the busy caller's floor and ``GET /runs?limit=100``: a page of 100 running runs, each
  row asserted to show its progress.

Before timing, each list is walked two rows a page (``next_page_token``) to check that
every one of the caller's rows comes back, once, and nothing else.

Prints setup times, p50 and p99 of each and its ratio to its floor (3 decimals, the
ratio of the unrounded times), and ends with ``floor ... Keel ... ratio <x>``: the worst of
the six ratios (p50 and p99; gates, runs and running runs).
The default size is the issue's (10,000 of each), not scaled down. Run time, estimated
from small runs on the shared 2-core machine under load (``nice -n 19``, 2026-11-27): at
1,000 of each, 80 gate starts and 31 run start+terminate pairs a second, 56 s in all; the
setup is linear, so 10,000 of each takes about 125 + 320 s to set up and about 8 minutes
in all (less on an idle machine). ``--chunk`` sets the starts in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from temporalio.client import Client  # noqa: E402

from api.routes.runs import runs_query  # noqa: E402
from bench.harness import bench_settings, dev_server, in_chunks, serve_api  # noqa: E402
from bench.stats import p99  # noqa: E402
from client.gate import start_gate  # noqa: E402
from client.temporal import connect, list_page, readers_clause, start_by_type  # noqa: E402
from keel.access import ACCESS_MEMO, access_for, reader_terms  # noqa: E402
from keel.families import run_families  # noqa: E402
from keel.gates import GATE_WORKFLOW_TYPE, GateRequest, gate_workflow_id  # noqa: E402
from keel.progress import PROGRESS_MEMO, RunProgress  # noqa: E402
from keel.search_attributes import GATE_STATUS_ATTRIBUTE  # noqa: E402
from keel.settings import ApiToken  # noqa: E402

ME, ME_TOKEN = "bench-me", "tok-bench-me-0123456789"
ME_ROLES = frozenset({"approver", "requester"})
BUSY, BUSY_TOKEN = "bench-busy", "tok-bench-busy-0123456789"
BUSY_ROLES = frozenset({"requester"})
PAGE = 100
RUN_TYPES = [t for f in run_families() for t in f.workflow_types]
# Types whose progress GET /runs reads from the memo (design keeps none yet).
PROGRESS_TYPES = [t for f in run_families() if f.progress == "memo" for t in f.workflow_types]
# What the old GET /runs waited for each running row's Query.
OLD_QUERY_TIMEOUT = timedelta(seconds=2)


def queries() -> dict[str, str]:
    """The visibility query each route sends for the caller (api/routes, client/gate.py)."""
    clause = readers_clause(reader_terms(ME, ME_ROLES))
    busy = readers_clause(reader_terms(BUSY, BUSY_ROLES))
    gates = f'WorkflowType = "{GATE_WORKFLOW_TYPE}" AND {GATE_STATUS_ATTRIBUTE} = "pending"'
    runs = runs_query(run_families())
    return {
        "gates": f"{gates} AND {clause}",
        "runs": f"{runs} AND {clause}",
        "running": f"{runs} AND {busy}",
    }


def mine_at(total: int, mine: int) -> set[int]:
    """``mine`` indices spread evenly through ``range(total)``."""
    return {(i * total) // mine + total // (2 * mine) for i in range(mine)}


async def query_progress(client: Client, workflow_id: str) -> None:
    """What the old ``GET /runs`` sent each running row: its progress Query, 2 s at most."""
    with contextlib.suppress(Exception):
        await client.get_workflow_handle(workflow_id).query(
            "progress", rpc_timeout=OLD_QUERY_TIMEOUT
        )


async def wait_count(client: Client, query: str, want: int, timeout_s: float = 120) -> None:
    """Until visibility counts ``want`` rows for ``query`` (it lags the starts)."""
    deadline = time.monotonic() + timeout_s
    while (count := (await client.count_workflows(query)).count) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} of {want} rows visible for {query}")
        await asyncio.sleep(0.2)


async def main(
    n_gates: int,
    n_runs: int,
    mine: int,
    n_running: int,
    callers: int,
    repeat: int,
    old_repeat: int,
    chunk: int,
) -> None:
    with dev_server("keel-bench-inbox-") as (server, tmp):
        tokens = [
            ApiToken(token=SecretStr(ME_TOKEN), actor=ME, roles=sorted(ME_ROLES)),
            ApiToken(token=SecretStr(BUSY_TOKEN), actor=BUSY, roles=sorted(BUSY_ROLES)),
        ]
        settings = bench_settings(server, tmp, api_tokens=tokens)
        client = await connect(settings)
        tag = uuid.uuid4().hex[:8]

        my_gates = mine_at(n_gates, mine)
        gate_ids: dict[int, str] = {}

        async def open_gate(n: int) -> None:
            who = f"caller-{n % callers}"
            approvers = (
                [ME, f"approver-{n % callers}"] if n in my_gates else [f"approver-{n % callers}"]
            )
            gid = gate_workflow_id(f"bench-{tag}/{n}", "g")
            gate_ids[n] = gid
            await start_gate(
                client,
                GateRequest(name="g", requester=who, approvers=approvers),
                gate_id=gid,
                task_queue=settings.task_queue,
            )

        my_runs = mine_at(n_runs, mine)
        run_ids: dict[int, str] = {}

        async def finished_run(n: int) -> None:
            owner = ME if n in my_runs else f"caller-{n % callers}"
            wid = f"bench-{tag}/run/{n}"
            run_ids[n] = wid
            handle = await start_by_type(
                client,
                RUN_TYPES[n % len(RUN_TYPES)],
                {"bench": n},
                workflow_id=wid,
                task_queue=settings.task_queue,
                result_type=dict,
                memo={ACCESS_MEMO: access_for(owner)},
            )
            await handle.terminate("bench: a finished run's row")

        running_ids: list[str] = []

        async def running_run(n: int) -> None:
            wid = f"bench-{tag}/running/{n}"
            running_ids.append(wid)
            progress = RunProgress(phase="map", done=n % 8, total=8, unit="windows")
            await start_by_type(
                client,
                PROGRESS_TYPES[n % len(PROGRESS_TYPES)],
                {"bench": n},
                workflow_id=wid,
                task_queue=settings.task_queue,
                result_type=dict,
                memo={ACCESS_MEMO: access_for(BUSY), PROGRESS_MEMO: progress},
            )

        _, gates_s = await in_chunks(range(n_gates), open_gate, chunk=chunk)
        print(f"{n_gates} pending gates started in {gates_s:.1f} s ({n_gates / gates_s:.0f}/s)")
        _, runs_s = await in_chunks(range(n_runs), finished_run, chunk=chunk)
        print(f"{n_runs} runs started and ended in {runs_s:.1f} s ({n_runs / runs_s:.0f}/s)")
        _, running_s = await in_chunks(range(n_running), running_run, chunk=chunk)
        print(
            f"{n_running} running runs started in {running_s:.1f} s"
            f" ({n_running / max(running_s, 1e-9):.0f}/s)"
        )
        await wait_count(client, f'WorkflowType = "{GATE_WORKFLOW_TYPE}"', n_gates)
        await wait_count(client, 'ExecutionStatus = "Terminated"', n_runs)
        want = {
            "gates": {gate_ids[n] for n in my_gates},
            "runs": {run_ids[n] for n in my_runs},
        }
        q = queries()
        for name in want:
            await wait_count(client, q[name], len(want[name]))
        await wait_count(client, q["running"], n_running)

        async with (
            serve_api(settings, client) as base,
            httpx.AsyncClient(
                base_url=base, timeout=60, headers={"Authorization": f"Bearer {ME_TOKEN}"}
            ) as http,
        ):

            async def get(name: str, **params: Any) -> tuple[list[str], str | None]:
                resp = await http.get(f"/{name}", params=params)
                assert resp.status_code == 200, resp.text
                body = resp.json()
                key = "gate_id" if name == "gates" else "workflow_id"
                return [row[key] for row in body[name]], body["next_page_token"]

            busy_auth = {"Authorization": f"Bearer {BUSY_TOKEN}"}

            async def get_running() -> list[dict[str, Any]]:
                resp = await http.get("/runs", params={"limit": PAGE}, headers=busy_auth)
                assert resp.status_code == 200, resp.text
                rows: list[dict[str, Any]] = resp.json()["runs"]
                return rows

            for name, ids in want.items():  # every row of the caller's, across pages
                seen: list[str] = []
                page_token: str | None = None
                while True:
                    params: dict[str, Any] = {"limit": 2}
                    if page_token:
                        params["page_token"] = page_token
                    rows, page_token = await get(name, **params)
                    seen += rows
                    if not page_token:
                        break
                assert sorted(seen) == sorted(ids), (name, seen, ids)
                print(f"GET /{name}, 2 a page: all {len(ids)} of the caller's rows, once")

            times: dict[str, list[float]] = {
                k: []
                for k in ("gates floor", "gates", "runs floor", "runs", "running floor", "running")
            }
            page_rows = min(PAGE, n_running)
            for i in range(repeat + 3):  # the first three warm up connections and caches
                if n_running:
                    t0 = time.perf_counter()
                    floor_rows, _ = await list_page(client, q["running"], page_size=PAGE)
                    t1 = time.perf_counter()
                    assert len(floor_rows) == page_rows
                    running_rows = await get_running()
                    t2 = time.perf_counter()
                    assert len(running_rows) == page_rows, len(running_rows)
                    assert all(r["status"] == "running" and r["progress"] for r in running_rows), (
                        running_rows[:3]
                    )
                    if i >= 3:
                        times["running floor"].append((t1 - t0) * 1000)
                        times["running"].append((t2 - t1) * 1000)
                for name in ("gates", "runs"):
                    t0 = time.perf_counter()
                    floor_rows, _ = await list_page(client, q[name], page_size=PAGE)
                    t1 = time.perf_counter()
                    assert {r.id for r in floor_rows} == want[name]
                    keel_rows, _ = await get(name, limit=PAGE)
                    t2 = time.perf_counter()
                    assert sorted(keel_rows) == sorted(want[name]), (name, keel_rows)
                    if i >= 3:
                        times[f"{name} floor"].append((t1 - t0) * 1000)
                        times[name].append((t2 - t1) * 1000)

            # Before the progress memo: one Query per running row of the page, at once.
            old: list[float] = []
            if n_running:
                floor_rows, _ = await list_page(client, q["running"], page_size=PAGE)
                for _ in range(old_repeat):
                    t0 = time.perf_counter()
                    await asyncio.gather(
                        *(query_progress(client, wf.id) for wf in floor_rows),
                    )
                    old.append((time.perf_counter() - t0) * 1000)

    print(
        f"{n_gates} pending gates, {n_runs} finished runs, {callers} callers; the caller's:"
        f" {mine} of each; {n_running} running runs of a second caller (a page: {PAGE});"
        f" {repeat} reads of each (dev server, SQLite WAL, API on loopback, no worker)"
    )
    print(f"{'read':<38}{'p50 ms':>10}{'p99 ms':>10}{'p50 / floor':>13}{'p99 / floor':>13}")
    worst = (0.0, "", 0.0, 0.0)
    reads = [("gates", "GET /gates?limit=100"), ("runs", "GET /runs?limit=100")]
    if n_running:
        reads.append(("running", "GET /runs?limit=100, running"))
    for name, label in reads:
        floor, keel = times[f"{name} floor"], times[name]
        f50, f99 = statistics.median(floor), p99(floor)
        k50, k99 = statistics.median(keel), p99(keel)
        print(f"{'floor: list_workflows, ' + name:<38}{f50:>10.3f}{f99:>10.3f}")
        print(f"{label:<38}{k50:>10.3f}{k99:>10.3f}{k50 / f50:>12.3f}x{k99 / f99:>12.3f}x")
        for stat, f, k in (("p50", f50, k50), ("p99", f99, k99)):
            if k / f > worst[0]:
                worst = (k / f, f"{label} {stat}", f, k)
    if old:
        o50 = statistics.median(old)
        print(
            f"{'before: 1 Query per running row':<38}{o50:>10.3f}{max(old):>10.3f}"
            f"  ({len(old)} pages of {min(PAGE, n_running)} Queries, {OLD_QUERY_TIMEOUT.total_seconds():.0f} s"
            " timeout each, p50 and max)"
        )
    ratio, what, f, k = worst
    print(
        f"floor {f:.3f} ms, Keel {k:.3f} ms ({what}, the worst of {2 * len(reads)}),"
        f" ratio {ratio:.3f}"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, default=10_000, help="pending gates in all")
    parser.add_argument("--runs", type=int, default=10_000, help="finished runs in all")
    parser.add_argument("--mine", type=int, default=5, help="the caller's gates and runs")
    parser.add_argument(
        "--running", type=int, default=500, help="running runs of a second caller (0: none)"
    )
    parser.add_argument(
        "--old-repeat", type=int, default=3, help="pages timed the old way (a Query a row)"
    )
    parser.add_argument("--callers", type=int, default=20, help="callers the rest belong to")
    parser.add_argument("--repeat", type=int, default=100, help="timed reads of each")
    parser.add_argument("--chunk", type=int, default=200, help="starts at once")
    args = parser.parse_args()
    if not 1 <= args.mine <= min(args.gates, args.runs) or args.callers < 1:
        parser.error("need 1 <= --mine <= --gates, --runs and --callers >= 1")
    asyncio.run(
        main(
            args.gates,
            args.runs,
            args.mine,
            args.running,
            args.callers,
            args.repeat,
            args.old_repeat,
            args.chunk,
        )
    )
