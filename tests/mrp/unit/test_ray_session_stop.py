"""A stopped Ray session settles every attempt it holds, and its lanes end.

The window stops its session when the budget is spent or a shard fails for good; its
queued attempts fail with ``ShardNotStarted``. A lane whose call timed out or whose actor
died after the stop queued that call's shards (and those of the calls behind it) again,
and then waited for a wake that never came: those shard coroutines, and the window with
them, waited for good. The actor pool and Ray calls are stand-ins here (asyncio futures
the test settles), the session is the real one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from activities import fanout
from activities.mrp.backends import (
    RaySession,
    ShardAttempt,
    ShardContext,
    ShardItem,
)
from activities.mrp.operators import OperatorHandle
from keel.mrp.registry import OperatorSpec

DIGEST = "blake3:" + "0" * 64


class Method:
    def __init__(self, calls: list[asyncio.Future[Any]]) -> None:
        self.calls = calls

    def remote(self, *args: Any) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls.append(fut)
        return fut


class Handle:
    def __init__(self, calls: list[asyncio.Future[Any]]) -> None:
        self.run_batch = Method(calls)


class Pool:
    """One actor at a time; its calls are futures the test settles."""

    def __init__(self) -> None:
        self.calls: list[asyncio.Future[Any]] = []
        self.discarded = 0
        self.released = 0

    async def acquire(self) -> fanout.PooledActor:
        return fanout.PooledActor(Handle(self.calls))

    def release(self, actor: fanout.PooledActor) -> None:
        self.released += 1

    def discard(self, actor: fanout.PooledActor, futs: Any = ()) -> None:
        self.discarded += 1


class Backend:
    def __init__(self) -> None:
        self.pool = Pool()
        # Attempts seen to be fast: batches of several shards from the start.
        self.slowest_ms = {DIGEST: 1.0}
        self.shard_nodes: dict[str, str] = {}


def _session(backend: Backend, timeout_s: float) -> RaySession:
    spec = OperatorSpec(
        name="stand-in",
        version="1.0.0",
        kind="map",  # type: ignore[arg-type]
        entrypoint="op:StandIn",
        code_digest=DIGEST,
    )
    context = ShardContext(
        run_id="run-1",
        workflow_id="wf-1",
        operator=OperatorHandle(spec=spec, folder="/nonexistent"),
    )
    return RaySession(backend, context, None, timeout_s, 1)  # type: ignore[arg-type]


async def _settle(runs: list[asyncio.Task[ShardAttempt]], session: RaySession) -> list[str]:
    """What each attempt ended with; fails (after cancelling) when one never ends."""
    _, pending = await asyncio.wait(runs, timeout=5)
    if pending:
        await asyncio.wait_for(session.close(), 5)
        for r in runs:
            r.cancel()
        await asyncio.gather(*runs, return_exceptions=True)
        pytest.fail(f"{len(pending)} of {len(runs)} attempts never ended after the stop")
    outcomes = []
    for r in runs:
        if r.cancelled():
            outcomes.append("cancelled")
            continue
        e = r.exception()
        outcomes.append(type(e).__name__ if e is not None else "ok")
    return outcomes


@pytest.fixture(autouse=True)
def _futures_as_refs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fanout, "as_future", lambda ref: ref)


@pytest.mark.timeout(60)
async def test_a_batch_that_times_out_after_the_stop_is_not_started() -> None:
    backend = Backend()
    session = _session(backend, timeout_s=0.3)
    runs = [
        asyncio.create_task(session.run(ShardItem(i, f"shard-{i}", DIGEST, i, 1))) for i in range(4)
    ]
    await asyncio.sleep(0.05)
    # Two calls in flight on the lane's actor (PIPELINE_DEPTH 2): shards 0-1, then 2 (the
    # queue is shared out between the calls); shard 3 is queued.
    assert len(backend.pool.calls) == 2
    session.stop()  # e.g. the budget was spent: shard 3 is not started
    # Neither call returns: the head one times out, its actor is killed, and its shards
    # and the one of the call behind it were queued again, after the stop.
    outcomes = await _settle(runs, session)
    assert outcomes == ["ShardNotStarted"] * 4
    assert backend.pool.discarded == 1
    await asyncio.wait_for(session.close(), 5)
    assert session.lanes == []


@pytest.mark.timeout(60)
async def test_an_actor_lost_after_the_stop_leaves_no_attempt_waiting() -> None:
    backend = Backend()
    session = _session(backend, timeout_s=60)
    runs = [
        asyncio.create_task(session.run(ShardItem(i, f"shard-{i}", DIGEST, i, 1))) for i in range(4)
    ]
    await asyncio.sleep(0.05)
    assert len(backend.pool.calls) == 2
    session.stop()
    backend.pool.calls[0].set_exception(RuntimeError("actor died"))
    outcomes = await _settle(runs, session)
    # The head call's shards get the actor's failure; the call behind it never ran, and
    # shard 3 was still queued at the stop.
    assert outcomes == ["RuntimeError", "RuntimeError", "ShardNotStarted", "ShardNotStarted"]
    await asyncio.wait_for(session.close(), 5)


@pytest.mark.timeout(60)
async def test_close_ends_a_lane_whose_call_returned_in_the_same_turn() -> None:
    """close() cancels the lanes; a lane whose head call had just returned lost that
    cancel (Python 3.11 wait_for) and waited for its next call in flight."""
    backend = Backend()
    session = _session(backend, timeout_s=60)
    runs = [
        asyncio.create_task(session.run(ShardItem(i, f"shard-{i}", DIGEST, i, 1))) for i in range(4)
    ]
    await asyncio.sleep(0.05)
    assert len(backend.pool.calls) == 2
    backend.pool.calls[0].set_result([ShardAttempt(ok=True, output_digest=DIGEST)] * 2)
    # The second call never returns: close() must not wait for it.
    closing = asyncio.create_task(session.close())
    finished, _ = await asyncio.wait({closing}, timeout=5)
    if not finished:
        closing.cancel()
        await asyncio.gather(closing, *runs, return_exceptions=True)
        pytest.fail("close() waited for a call in flight after cancelling its lane")
    outcomes = await _settle(runs, session)
    # The lane was cancelled with both calls on it: their shards are cancelled, the
    # actor killed; shard 3 was still queued at the stop (the window closes its session after its shards, or when it fails).
    assert outcomes == ["cancelled", "cancelled", "cancelled", "ShardNotStarted"]
    assert backend.pool.discarded == 1
    assert session.lanes == []


@pytest.mark.timeout(60)
async def test_a_retry_after_the_stop_is_not_started() -> None:
    """A shard whose retry backoff ran past the stop asks for its next attempt then; the
    lanes have ended, so nothing would take it."""
    backend = Backend()
    session = _session(backend, timeout_s=60)
    first = asyncio.create_task(session.run(ShardItem(0, "shard-0", DIGEST, 0, 1)))
    await asyncio.sleep(0.05)
    backend.pool.calls[0].set_result([ShardAttempt(ok=False, error="flaky")])
    assert not (await first).ok
    session.stop()
    await asyncio.sleep(0.05)  # the lane ends
    retry = asyncio.create_task(session.run(ShardItem(0, "shard-0", DIGEST, 0, 2)))
    assert await _settle([retry], session) == ["ShardNotStarted"]
    assert len(backend.pool.calls) == 1
    await asyncio.wait_for(session.close(), 5)


class FailingPool(Pool):
    """An actor that cannot start (its creation task failed: an import error on the
    node), then one that can."""

    def __init__(self) -> None:
        super().__init__()
        self.failures = 1

    async def acquire(self) -> fanout.PooledActor:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("The actor with name ShardRunner failed to import")
        return await super().acquire()


async def test_an_actor_that_cannot_start_fails_the_queued_attempts_not_hangs() -> None:
    """The lane's acquire raised, the lane ended, and the queued attempts waited for good
    (a map window heartbeating ``done 0`` for minutes). Now they fail with the error, and
    the next attempt runs on an actor that starts."""
    backend = Backend()
    backend.pool = FailingPool()
    session = _session(backend, timeout_s=60)
    runs = [
        asyncio.create_task(session.run(ShardItem(i, f"shard-{i}", DIGEST, i, 1))) for i in range(4)
    ]
    assert await _settle(runs, session) == ["RuntimeError"] * 4
    again = asyncio.create_task(session.run(ShardItem(0, "shard-0", DIGEST, 0, 2)))
    for _ in range(100):
        if backend.pool.calls:
            break
        await asyncio.sleep(0.01)
    assert len(backend.pool.calls) == 1, "the retry was sent to a new actor"
    backend.pool.calls[0].set_result([ShardAttempt(ok=True, output_digest=DIGEST)])
    assert (await asyncio.wait_for(again, 5)).ok
    await session.close()
