"""Helpers the store tests of every family share (the database fixtures are in
tests/conftest.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_together(n: int, fn: Callable[[], Any]) -> list[Any]:
    """Run ``fn`` in ``n`` threads released at the same instant; return their results."""
    barrier = threading.Barrier(n)

    def go() -> Any:
        barrier.wait()
        return fn()

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(go) for _ in range(n)]
        return [f.result() for f in futures]
