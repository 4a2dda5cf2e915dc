"""``free_port``: ports picked for servers that bind them later."""

from __future__ import annotations

import socket

from services.processes import LOOPBACK, LOWEST_PICKED, ephemeral_range, free_port


def test_free_ports_are_outside_the_kernels_range_and_never_repeat() -> None:
    low, high = ephemeral_range()
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(LOWEST_PICKED <= p < low for p in ports), (low, high, sorted(ports)[-5:])


def test_a_free_port_binds() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, port))
        s.listen()
