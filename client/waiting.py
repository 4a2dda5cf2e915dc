"""Waiting for a run that a command started with services on demand
(``services.local.LocalServices``: the embedded Temporal server, a worker): the result,
with a watch beside it that fails when a service the command started dies.

``client`` sits below ``services`` (docs/architecture.md), so the use cases take the
services as a :class:`LocalServicesLike` argument rather than importing them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from temporalio.client import Client

T = TypeVar("T")


class Watched(Protocol):
    """What :func:`watch_services` reads: which service this command started died."""

    def dead(self) -> str | None: ...


class LocalServicesLike(Watched, Protocol):
    """What a use case needs of ``services.local.LocalServices``."""

    async def connect(self, *, start: bool = True) -> Client: ...

    async def ensure_worker(self, workflow_id: str, log_name: str) -> None: ...

    def stop(self, stay: bool = False) -> None: ...


async def watch_services(
    services: Watched,
    on_dead: Callable[[str], BaseException],
    tick: Callable[[], Awaitable[None]] | None = None,
    interval_s: float = 0.5,
) -> None:
    """Every ``interval_s``: raise ``on_dead(why)`` when a service this command started
    died, else run ``tick`` (progress), whose own errors never end the watch."""
    while True:
        await asyncio.sleep(interval_s)
        dead = services.dead()
        if dead:
            raise on_dead(dead)
        if tick is not None:
            with contextlib.suppress(Exception):
                await tick()


async def wait_watching(result: Awaitable[T], watch: Awaitable[None]) -> T:
    """``result`` (a run's ``handle.result()``), with ``watch`` running beside it.

    The watcher's failure wins when it ends first (a worker this command started died);
    otherwise the result is returned, or its error (``WorkflowFailureError``) raised.
    """
    result_task = asyncio.ensure_future(result)
    watch_task = asyncio.ensure_future(watch)
    try:
        await asyncio.wait({result_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watch_task
    if not result_task.done():
        result_task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await result_task
        watch_task.result()  # raises the watcher's failure
    return result_task.result()
