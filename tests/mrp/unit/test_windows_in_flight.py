"""Windows in flight scale with the backend's CPUs (patch ``mrp-windows-per-cpu``)."""

from __future__ import annotations

import pytest

from activities.mrp.backends import backend_cpus
from workflows.mrp import MAX_WINDOWS_IN_FLIGHT, windows_in_flight


def old_in_flight(max_workers: int, size: int, windows: int) -> int:
    """What runs before the patch keep in flight."""
    return max(1, min(MAX_WINDOWS_IN_FLIGHT, -(-max_workers // size), windows))


@pytest.mark.parametrize(
    ("max_workers", "size", "windows", "cpus", "expected"),
    [
        # A small machine: the old count.
        (16, 4, 100, 2, 4),
        (2, 100, 10, 2, 1),
        # A 64-CPU cluster with max_workers 32 and windows of 4: 8 windows, 4 shards each.
        (32, 4, 100, 64, 8),
        # 1,000 CPUs, 1,000 workers, windows of 100: 10 windows + 1 to overlap the tail.
        (1000, 100, 1000, 1000, 10),
        (2000, 100, 1000, 1000, 11),
        # Never more windows than there are.
        (1000, 100, 3, 1000, 3),
    ],
)
def test_windows_in_flight_follow_the_cpus(
    max_workers: int, size: int, windows: int, cpus: int, expected: int
) -> None:
    got = windows_in_flight(max_workers, size, windows, cpus)
    assert got == expected
    # Never fewer than before the patch: a run on more CPUs only gains windows.
    assert got >= old_in_flight(max_workers, size, windows)


def test_more_cpus_never_fewer_windows() -> None:
    counts = [windows_in_flight(4096, 10, 10_000, cpus) for cpus in (1, 8, 64, 512, 4096)]
    assert counts == sorted(counts) and counts[0] == MAX_WINDOWS_IN_FLIGHT
    assert counts[-1] == -(-4096 // 10)  # as many as max_workers can use


def test_threads_backend_counts_this_machines_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("KEEL_RAY_ADDRESS", raising=False)
    assert backend_cpus("threads", 16) == len(os.sched_getaffinity(0))
    assert backend_cpus("ray", 16) == len(os.sched_getaffinity(0))
