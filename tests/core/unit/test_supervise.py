"""The supervisor's restarts, on a child that stands in for a process only in how it is
started (no process is spawned): the signal handling is the real one."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from services.processes import Interrupted, StopSignals
from services.supervise import supervise


class _DiesOnce:
    """Reports itself dead until started; its start sends this process a SIGTERM, as a
    ``keel down`` that lands right after a restart's spawn would."""

    name = "g0"
    log_path = Path("/dev/null")

    def __init__(self) -> None:
        self.started = 0

    def start(self) -> int:
        self.started += 1
        os.kill(os.getpid(), signal.SIGTERM)
        return self.pid

    def running(self) -> bool:
        return self.started > 0

    def stop(self, timeout_s: float = 10.0) -> None:
        pass

    @property
    def pid(self) -> int:
        return 4242 + self.started

    @property
    def returncode(self) -> int | None:
        return None if self.started else -9


def test_a_stop_signal_right_after_a_restart_still_lets_it_be_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("services.supervise.RESTART_FIRST_S", 0.0)
    child = _DiesOnce()
    said: list[str] = []
    guard = StopSignals().install()
    try:
        with pytest.raises(Interrupted):
            supervise({"g0": child}, said.append, poll_s=0.01)
    finally:
        guard.uninstall()
    assert child.started == 1
    assert said[0].startswith("g0 (pid 4242) exited with code -9; restarting it in 0s")
    assert said[1:] == ["g0 restarted (pid 4243)"]
