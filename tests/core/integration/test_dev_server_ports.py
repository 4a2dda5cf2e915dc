"""The Temporal dev server's side ports (HTTP API, metrics): picked where no outgoing
connection can take them, and a start that finds one taken anyway is tried again."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

import services.processes as processes
from services.processes import LOOPBACK, TemporalDevServer, ephemeral_range, pid_alive


def _flag(argv: list[str], name: str) -> int:
    return int(argv[argv.index(name) + 1])


def test_side_ports_are_below_the_kernels_range(tmp_path: Path) -> None:
    server = TemporalDevServer(db_file=tmp_path / "t.db", log_path=tmp_path / "t.log", port=1)
    argv = server.argv()
    low, _ = ephemeral_range()
    for flag in ("--http-port", "--metrics-port"):
        assert processes.LOWEST_PICKED <= _flag(argv, flag) < low, (flag, argv)


def test_a_start_that_finds_its_http_port_taken_starts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind((LOOPBACK, processes.free_port()))
    taken.listen()
    busy = taken.getsockname()[1]
    picks = iter([busy])
    real = processes.free_port
    monkeypatch.setattr(processes, "free_port", lambda: next(picks, None) or real())

    server = TemporalDevServer(
        db_file=tmp_path / "t.db", log_path=tmp_path / "t.log", port=real(), ui_port=None
    )
    try:
        server.start()
        assert server.process is not None and server.process.running()
        log = server.log_path.read_text(errors="replace")
        assert re.search(rf"127\.0\.0\.1:{busy}\b.*address already in use", log), log[-2000:]
    finally:
        taken.close()
        server.stop()
    assert server.process is not None and not pid_alive(server.process.pid)
