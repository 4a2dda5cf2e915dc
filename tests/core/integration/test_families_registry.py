"""A toy family registered through the families registry alone (keel/families.py and
workers/families.py) runs on a real worker, shows in ``GET /runs`` and has CLI exit codes;
and ``GET /runs`` reads a running run's progress from its memo: with the worker gone, the
list still answers at once, progress shown, where one Query would wait for its timeout."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from pydantic import BaseModel
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from api.app import create_app
from cli import toolkit
from client.temporal import start_by_type
from keel import families
from keel.access import ACCESS_MEMO, access_for
from keel.families import FamilySpec
from keel.progress import RunProgress
from keel.settings import Settings
from tests.support.api import asgi_client, auth, with_tokens
from workers import families as worker_families
from workers.main import build_worker
from workflows.readers import ProgressMemo

TOY_TYPE = "KeelToyRun"
TOY_STEP = "toy.step"


class ToyInput(BaseModel):
    steps: int = 3


class ToyStep(BaseModel):
    n: int


class ToyResult(BaseModel):
    steps: int


@activity.defn(name=TOY_STEP)
async def toy_step(inp: ToyStep) -> ToyStep:
    return ToyStep(n=inp.n + 1)


@workflow.defn(name=TOY_TYPE, sandboxed=False)
class ToyRun:
    """Steps through an activity, its progress in the memo, then waits to be finished."""

    def __init__(self) -> None:
        self._finish = False
        self._memo = ProgressMemo()

    @workflow.signal(name="toy_finish")
    def finish(self) -> None:
        self._finish = True

    @workflow.run
    async def run(self, inp: ToyInput) -> ToyResult:
        self._memo.start()
        n = 0
        while n < inp.steps:
            self._memo.show(RunProgress(phase="toy", done=n, total=inp.steps, unit="steps"))
            out = await workflow.execute_activity(
                TOY_STEP,
                ToyStep(n=n),
                result_type=ToyStep,
                start_to_close_timeout=timedelta(seconds=30),
            )
            n = out.n
        self._memo.show(RunProgress(phase="toy", done=n, total=inp.steps, unit="steps"))
        await workflow.wait_condition(lambda: self._finish)
        return ToyResult(steps=n)


TOY = FamilySpec(
    name="toy",
    label="toy run",
    workflow_types=(TOY_TYPE,),
    exit_codes={"ok": 0, "error": 1, "usage": 2, "toy_failed": 9},
    progress="memo",
)


@pytest.fixture
def toy_family() -> Iterator[FamilySpec]:
    """The toy family, registered for this test only."""
    families.register(TOY)
    worker_families.register(
        worker_families.WorkerFamily("toy", (ToyRun,), lambda deps: [toy_step])
    )
    try:
        yield TOY
    finally:
        worker_families.unregister("toy")
        families.unregister("toy")


async def _toy_row(http: httpx.AsyncClient, wid: str, **params: Any) -> dict[str, Any] | None:
    resp = await http.get("/runs", params={"limit": 100, **params}, headers=auth("alice"))
    assert resp.status_code == 200, resp.text
    return next((r for r in resp.json()["runs"] if r["workflow_id"] == wid), None)


async def _until_row(
    http: httpx.AsyncClient, wid: str, want: dict[str, Any], timeout_s: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    row = None
    while time.monotonic() < deadline:
        row = await _toy_row(http, wid, family="toy")
        if row is not None and all(row.get(k) == v for k, v in want.items()):
            return row
        await asyncio.sleep(0.3)
    raise AssertionError(f"{wid} never showed {want}: last {row}")


async def test_a_toy_family_through_the_registry_alone(
    toy_family: FamilySpec, client: Client, settings: Settings
) -> None:
    api_settings = with_tokens(settings)
    wid = f"toy/{uuid.uuid4().hex[:8]}"
    async with asgi_client(create_app(api_settings, client=client)) as http:
        # No cache: the second worker below gets the run's next task at once (no sticky queue).
        async with build_worker(client, settings, max_cached_workflows=0):
            handle: WorkflowHandle[Any, ToyResult] = await start_by_type(
                client,
                TOY_TYPE,
                ToyInput(steps=3),
                workflow_id=wid,
                task_queue=settings.task_queue,
                result_type=ToyResult,
                memo={ACCESS_MEMO: access_for("alice")},
            )
            row = await _until_row(http, wid, {"progress": "toy: 3/3 steps"})
        assert row["family"] == "toy" and row["label"] == "toy run"
        assert row["workflow_type"] == TOY_TYPE and row["status"] == "running"

        # The worker is gone: a Query of the run gets no answer (it waits for a worker that
        # polled moments ago, up to its timeout) ...
        with pytest.raises(RPCError):
            await handle.query("__stack_trace", rpc_timeout=timedelta(seconds=1))
        # ... while the list answers at once, progress from the run's memo: it sends none
        # (the old list waited 2 s here, its Query's limit).
        for params in ({"family": "toy"}, {}):
            t0 = time.perf_counter()
            resp = await http.get("/runs", params={"limit": 100, **params}, headers=auth("alice"))
            took = time.perf_counter() - t0
            assert resp.status_code == 200, resp.text
            row = next(r for r in resp.json()["runs"] if r["workflow_id"] == wid)
            assert row["progress"] == "toy: 3/3 steps"
            assert took < 0.9, f"GET /runs took {took:.3f} s with no worker"
        # Another requester does not see it; an unknown family is refused.
        resp = await http.get("/runs", params={"family": "toy"}, headers=auth("carol"))
        assert all(r["workflow_id"] != wid for r in resp.json()["runs"])
        resp = await http.get("/runs", params={"family": "nope"}, headers=auth("alice"))
        assert resp.status_code == 422 and resp.json()["error"]["code"] == "validation_failed"

        async with build_worker(client, settings):
            await handle.signal("toy_finish")
            assert (await handle.result()).steps == 3
        row = await _until_row(http, wid, {"status": "completed"})
        assert row["progress"] is None

    # The CLI toolkit's exit codes and error style come from the same entry.
    assert toolkit.EXIT_CODES["toy"]["toy_failed"] == 9
    assert toolkit.ERROR_STYLES["toy"] == "envelope"
    failure = toolkit.Family("toy").failure("toy_failed", "the toy failed")
    assert failure.error.exit_code == 9 and failure.error.family == "toy"


def test_an_unregistered_family_is_gone_everywhere() -> None:
    assert "toy" not in toolkit.EXIT_CODES
    assert all(f.name != "toy" for f in families.run_families())
    assert all(w.name != "toy" for w in worker_families.worker_families())
