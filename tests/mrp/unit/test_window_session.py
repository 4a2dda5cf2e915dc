"""A map window on a Ray session: first attempts settle by callback, the rest by task.

``MapWindow._run_on_session`` queues each shard's first attempt with a callback instead of
a task per shard (the worker's interpreter bounds the map at 100,000 shards,
docs/mrp-runtime.md). These drive it with a session whose attempts answer in later loop
turns, as the lanes do: every shard settles once, whatever its first attempt did
(succeeded, succeeded with model calls to record, failed and retried, timed out, raised,
or was never started after a stop), and the window never waits for good.
"""

from __future__ import annotations

import asyncio
import collections
from decimal import Decimal
from typing import Any

import pytest

import activities.mrp.window as window_module
from activities.mrp.backends import AttemptTimeout, ShardAttempt, ShardItem, ShardNotStarted
from keel.records import LLMCallLog
from tests.mrp.unit.test_window_end import DIGEST, _window

Outcome = Any  # a ShardAttempt, or an exception the attempt raises


class FakeSession:
    """What ``MapWindow`` uses of a ``RaySession``: ``submit``/``run`` queue an attempt,
    answered a few loop turns later by ``answer(item)``; ``stop`` fails what is queued
    with ``ShardNotStarted``, as the real one does."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.queue: collections.deque[tuple[ShardItem, asyncio.Future[ShardAttempt]]] = (
            collections.deque()
        )
        self.stopped = False
        self.attempts: list[tuple[int, int]] = []
        self.worker: asyncio.Task[None] | None = None

    def submit(self, item: ShardItem) -> asyncio.Future[ShardAttempt]:
        fut: asyncio.Future[ShardAttempt] = asyncio.get_running_loop().create_future()
        if self.stopped:
            fut.set_exception(ShardNotStarted())
            return fut
        self.queue.append((item, fut))
        if self.worker is None:
            self.worker = asyncio.create_task(self._work())
        return fut

    async def run(self, item: ShardItem) -> ShardAttempt:
        return await self.submit(item)

    async def _work(self) -> None:
        while True:
            await asyncio.sleep(0)
            for _ in range(min(len(self.queue), 16)):  # a batch a turn
                item, fut = self.queue.popleft()
                if fut.done():
                    continue
                self.attempts.append((item.shard_index, item.attempt))
                out = self.answer(item)
                if isinstance(out, BaseException):
                    fut.set_exception(out)
                else:
                    fut.set_result(out)

    def stop(self) -> None:
        self.stopped = True
        while self.queue:
            _, fut = self.queue.popleft()
            if not fut.done():
                fut.set_exception(ShardNotStarted())

    async def close(self) -> None:
        self.stop()
        if self.worker is not None:
            self.worker.cancel()


def ok(**kw: Any) -> ShardAttempt:
    return ShardAttempt(ok=True, output_digest=DIGEST, units=Decimal(1), **kw)


def _run(
    monkeypatch: pytest.MonkeyPatch, shards: int, answer: Any, retries: int = 0, **inp: Any
) -> tuple[Any, FakeSession, list[int], asyncio.Task[None]]:
    written: list[int] = []
    monkeypatch.setattr(
        window_module,
        "record_shards",
        lambda sessions, batch: written.extend(r.shard_index for r in batch),
    )
    monkeypatch.setattr(window_module.activity, "heartbeat", lambda *a: None)
    window, tasks, handle, ir = _window(shards)
    ir.limits.max_shard_retries = retries
    window.inp = window.inp.model_copy(update=inp)
    session = FakeSession(answer)
    window.session = session  # type: ignore[assignment]
    run = asyncio.create_task(window._run_shards(tasks, handle, ir, None, 64))  # type: ignore[arg-type]
    return window, session, written, run


async def _ended(run: asyncio.Task[None]) -> None:
    finished, _ = await asyncio.wait({run}, timeout=10)
    if not finished:
        run.cancel()
        pytest.fail("the window did not end")


@pytest.mark.timeout(60)
async def test_every_shard_settles_once_by_callback_or_task(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    recorded: list[list[LLMCallLog]] = []
    log = LLMCallLog.model_construct()

    def answer(item: ShardItem) -> Outcome:
        i, attempt = item.shard_index, item.attempt
        if i % 7 == 3:  # model calls to record: its task records them
            return ok(llm_calls=1, llm_call_logs=[log])
        if i % 5 == 1 and attempt == 1:  # fails once, then succeeds on its retry
            return ShardAttempt(ok=False, error="flaky", retryable=True, units=Decimal(1))
        if i % 11 == 2 and attempt == 1:  # runs past the shard timeout once
            return AttemptTimeout("past the shard timeout")
        return ok()

    monkeypatch.setattr(window_module, "RETRY_BACKOFF_S", 0.0)
    window, session, written, run = _run(monkeypatch, 300, answer, retries=2)

    async def record_llm_calls(logs: list[LLMCallLog]) -> None:
        if logs:
            recorded.append(logs)

    window.acts.record_llm_calls = record_llm_calls
    await _ended(run)
    run.result()
    assert sorted(written) == list(range(300))  # each recorded once
    assert window.done == 300 and window.counters.run == 300
    retried = {i for i in range(300) if i % 7 != 3 and (i % 5 == 1 or i % 11 == 2)}
    assert window.counters.retried == len(retried)
    assert sorted(i for i, a in session.attempts if a == 2) == sorted(retried)
    assert len(recorded) == len([i for i in range(300) if i % 7 == 3])
    # Units: one per attempt, failed and timed-out ones too (a timeout costs the weight).
    assert window.units == Decimal(300 + len(retried))


@pytest.mark.timeout(60)
async def test_an_attempt_that_raises_fails_the_window_and_stops_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def answer(item: ShardItem) -> Outcome:
        return RuntimeError("actor lost") if item.shard_index == 40 else ok()

    _, session, written, run = _run(monkeypatch, 500, answer)
    await _ended(run)
    with pytest.raises(RuntimeError, match="actor lost"):
        run.result()
    assert session.stopped
    # What finished before is recorded; shard 40 and what never started are not.
    assert 40 not in written
    assert len(written) == len(set(written)) and len(written) < 500


@pytest.mark.timeout(60)
async def test_a_shard_that_fails_for_good_stops_the_window_with_its_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def answer(item: ShardItem) -> Outcome:
        if item.shard_index == 17:
            return ShardAttempt(ok=False, error="bad input", retryable=False)
        return ok()

    window, session, written, run = _run(monkeypatch, 400, answer)
    await _ended(run)
    run.result()  # the window's run() raises window.failure
    assert window.failure is not None and "shard-000017" in str(window.failure)
    assert session.stopped and 17 in written and window.counters.failed == 1
    assert window.done + window.counters.failed <= 400


@pytest.mark.timeout(60)
async def test_the_budget_stops_the_window_and_queued_shards_never_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window, session, written, run = _run(
        monkeypatch, 400, lambda item: ok(), remaining_units=Decimal(99)
    )
    await _ended(run)
    run.result()
    assert window.stopped_by_budget and session.stopped
    # Stopped once over: the shards that were already in flight finish, nothing after.
    assert 100 <= window.counters.run < 400
    assert sorted(written) == sorted({i for i, _ in session.attempts})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("shards", [1, 64])
async def test_a_retry_that_raises_fails_the_window_even_as_the_last_shard(
    monkeypatch: pytest.MonkeyPatch, shards: int
) -> None:
    """The last shard's retry raises: it settles and fails the window in the same turn,
    so the window does not end as if every shard had (the shard had a task of its own
    before, and gathering them raised it)."""
    last = shards - 1

    def answer(item: ShardItem) -> Outcome:
        if item.shard_index != last:
            return ok()
        if item.attempt == 1:
            return ShardAttempt(ok=False, error="flaky", retryable=True)
        return RuntimeError("actor lost on the retry")

    monkeypatch.setattr(window_module, "RETRY_BACKOFF_S", 0.0)
    _, _, written, run = _run(monkeypatch, shards, answer, retries=2)
    await _ended(run)
    with pytest.raises(RuntimeError, match="actor lost on the retry"):
        run.result()
    assert last not in written and len(written) == shards - 1


@pytest.mark.timeout(60)
async def test_an_attempt_cancelled_by_its_lane_fails_the_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    window, session, written, run = _run(monkeypatch, 100, lambda item: ok())

    async def work() -> None:
        while True:
            await asyncio.sleep(0)
            for _ in range(min(len(session.queue), 16)):
                item, fut = session.queue.popleft()
                if fut.done():
                    continue
                session.attempts.append((item.shard_index, item.attempt))
                if item.shard_index == 30:
                    fut.cancel()
                else:
                    fut.set_result(ok())

    session._work = work  # type: ignore[method-assign]
    await _ended(run)
    with pytest.raises(RuntimeError, match="shard-000030: its Ray lane ended"):
        run.result()
    assert 30 not in written and window.failure is None
