"""``GET /gates`` and ``GET /runs`` for a caller with 5 rows among 10,000 of each, against
one bare visibility query of the same filter.

    uv run python bench/inbox_scale.py [--gates 10000] [--runs 10000] [--mine 5]
                                       [--callers 20] [--repeat 100] [--chunk 200]

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

Then, interleaved ``--repeat`` times, each timed from this process:

* floor: one ``client.list_workflows`` page (``page_size`` 100) of the query the route
  sends (workflow type, status, ``KeelReaders IN (the caller's terms)``);
* Keel: ``GET /gates?limit=100`` and ``GET /runs?limit=100`` as the caller (bearer token),
  each asserted to hold exactly the caller's rows.

Before timing, each list is walked two rows a page (``next_page_token``) to check that
every one of the caller's rows comes back, once, and nothing else.

Prints setup times, p50 and p99 of each and its ratio to its floor, and ends with
``floor ... Keel ... ratio <x>``: the worst of the four ratios (p50 and p99, gates and runs).
The default size is the issue's (10,000 of each), not scaled down. Run time, estimated
from small runs on the shared 2-core machine under load (``nice -n 19``, 2026-11-27): at
1,000 of each, 80 gate starts and 31 run start+terminate pairs a second, 56 s in all; the
setup is linear, so 10,000 of each takes about 125 + 320 s to set up and about 8 minutes
in all (less on an idle machine). ``--chunk`` sets the starts in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from pydantic import SecretStr  # noqa: E402
from temporalio.client import Client  # noqa: E402

from api.routes.runs import FAMILY_TYPES  # noqa: E402
from bench.harness import bench_settings, dev_server, in_chunks, serve_api  # noqa: E402
from bench.stats import p99  # noqa: E402
from client.gate import start_gate  # noqa: E402
from client.temporal import connect, list_page, readers_clause, start_by_type  # noqa: E402
from keel.access import ACCESS_MEMO, access_for, reader_terms  # noqa: E402
from keel.gates import GATE_WORKFLOW_TYPE, GateRequest, gate_workflow_id  # noqa: E402
from keel.search_attributes import GATE_STATUS_ATTRIBUTE  # noqa: E402
from keel.settings import ApiToken  # noqa: E402

ME, ME_TOKEN = "bench-me", "tok-bench-me-0123456789"
ME_ROLES = frozenset({"approver", "requester"})
PAGE = 100
RUN_TYPES = list(FAMILY_TYPES.values())


def queries() -> dict[str, str]:
    """The visibility query each route sends for the caller (api/routes, client/gate.py)."""
    clause = readers_clause(reader_terms(ME, ME_ROLES))
    gates = f'WorkflowType = "{GATE_WORKFLOW_TYPE}" AND {GATE_STATUS_ATTRIBUTE} = "pending"'
    runs = 'WorkflowType IN ({}) AND ExecutionStatus != "ContinuedAsNew"'.format(
        ", ".join(f'"{t}"' for t in RUN_TYPES)
    )
    return {"gates": f"{gates} AND {clause}", "runs": f"{runs} AND {clause}"}


def mine_at(total: int, mine: int) -> set[int]:
    """``mine`` indices spread evenly through ``range(total)``."""
    return {(i * total) // mine + total // (2 * mine) for i in range(mine)}


async def wait_count(client: Client, query: str, want: int, timeout_s: float = 120) -> None:
    """Until visibility counts ``want`` rows for ``query`` (it lags the starts)."""
    deadline = time.monotonic() + timeout_s
    while (count := (await client.count_workflows(query)).count) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} of {want} rows visible for {query}")
        await asyncio.sleep(0.2)


async def main(n_gates: int, n_runs: int, mine: int, callers: int, repeat: int, chunk: int) -> None:
    with dev_server("keel-bench-inbox-") as (server, tmp):
        token = ApiToken(token=SecretStr(ME_TOKEN), actor=ME, roles=sorted(ME_ROLES))
        settings = bench_settings(server, tmp, api_tokens=[token])
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

        _, gates_s = await in_chunks(range(n_gates), open_gate, chunk=chunk)
        print(f"{n_gates} pending gates started in {gates_s:.1f} s ({n_gates / gates_s:.0f}/s)")
        _, runs_s = await in_chunks(range(n_runs), finished_run, chunk=chunk)
        print(f"{n_runs} runs started and ended in {runs_s:.1f} s ({n_runs / runs_s:.0f}/s)")
        await wait_count(client, f'WorkflowType = "{GATE_WORKFLOW_TYPE}"', n_gates)
        await wait_count(client, 'ExecutionStatus = "Terminated"', n_runs)
        want = {
            "gates": {gate_ids[n] for n in my_gates},
            "runs": {run_ids[n] for n in my_runs},
        }
        q = queries()
        for name in want:
            await wait_count(client, q[name], len(want[name]))

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
                k: [] for k in ("gates floor", "gates", "runs floor", "runs")
            }
            for i in range(repeat + 3):  # the first three warm up connections and caches
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

    print(
        f"{n_gates} pending gates, {n_runs} finished runs, {callers} callers; the caller's:"
        f" {mine} of each; {repeat} reads of each (dev server, SQLite WAL, API on loopback)"
    )
    print(f"{'read':<34}{'p50 ms':>9}{'p99 ms':>9}{'p50 / floor':>13}{'p99 / floor':>13}")
    worst = (0.0, "", 0.0, 0.0)
    for name, label in (("gates", "GET /gates?limit=100"), ("runs", "GET /runs?limit=100")):
        floor, keel = times[f"{name} floor"], times[name]
        f50, f99 = statistics.median(floor), p99(floor)
        k50, k99 = statistics.median(keel), p99(keel)
        print(f"{'floor: list_workflows, ' + name:<34}{f50:>9.1f}{f99:>9.1f}")
        print(f"{label:<34}{k50:>9.1f}{k99:>9.1f}{k50 / f50:>12.2f}x{k99 / f99:>12.2f}x")
        for stat, f, k in (("p50", f50, k50), ("p99", f99, k99)):
            if k / f > worst[0]:
                worst = (k / f, f"{label} {stat}", f, k)
    ratio, what, f, k = worst
    print(f"floor {f:.1f} ms, Keel {k:.1f} ms ({what}, the worst of four), ratio {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gates", type=int, default=10_000, help="pending gates in all")
    parser.add_argument("--runs", type=int, default=10_000, help="finished runs in all")
    parser.add_argument("--mine", type=int, default=5, help="the caller's gates and runs")
    parser.add_argument("--callers", type=int, default=20, help="callers the rest belong to")
    parser.add_argument("--repeat", type=int, default=100, help="timed reads of each")
    parser.add_argument("--chunk", type=int, default=200, help="starts at once")
    args = parser.parse_args()
    if not 1 <= args.mine <= min(args.gates, args.runs) or args.callers < 1:
        parser.error("need 1 <= --mine <= --gates, --runs and --callers >= 1")
    asyncio.run(main(args.gates, args.runs, args.mine, args.callers, args.repeat, args.chunk))
