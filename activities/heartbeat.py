"""Heartbeats around a long await in an async activity, for every family.

An activity that heartbeats has a heartbeat timeout in ``workflows.common.OPTIONS``; a
worker lost in the middle of it is then noticed after that timeout, not after the whole
start-to-close limit, and the step is retried elsewhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import activity

T = TypeVar("T")


async def heartbeating(
    work: Awaitable[T], *, every_s: float, details: Callable[[], Any] | None = None
) -> T:
    """``work``, heartbeating now and every ``every_s`` seconds until it ends; ``details``
    gives what each heartbeat carries (e.g. the step running). Outside an activity (a
    test, a CLI) it only awaits ``work``."""
    if not activity.in_activity():
        return await work

    async def beat() -> None:
        while True:
            activity.heartbeat(*(() if details is None else (details(),)))
            await asyncio.sleep(every_s)

    beater = asyncio.create_task(beat())
    try:
        return await work
    finally:
        beater.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beater
