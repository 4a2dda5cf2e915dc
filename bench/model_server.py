"""The scripted model server (``tests/support/scripted_openai``) in a process of its own.

In the bench's process it shares one interpreter lock with whatever it serves: the
floor's client, or Keel's worker, whose own work then slows the server's answers (and the
server slows it). A model server is never in its client's process; in its own, both parts
of a bench ask the same server, on loopback, as a client would.

    with model_server(content, delay_s) as srv:
        srv.base_url, srv.requests()

The process is started with ``spawn`` and stopped by a message, then by its PID
(``Process.kill``) if it has not ended within 10 s. Its listen backlog is 128 (the
stdlib's 5 drops connections when more than a few calls start at once).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection

_START_TIMEOUT_S = 60.0


@dataclass
class RemoteModelServer:
    base_url: str
    _conn: Connection

    def requests(self) -> int:
        """How many requests the server has received so far."""
        self._conn.send("count")
        count: int = self._conn.recv()
        return count


@contextlib.contextmanager
def model_server(content: str, delay_s: float) -> Iterator[RemoteModelServer]:
    """A scripted server answering every chat completion with ``content`` after
    ``delay_s`` seconds, in a child process, while the block runs."""
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    proc = ctx.Process(target=_serve, args=(theirs, content, delay_s), daemon=True)
    proc.start()
    try:
        if not ours.poll(_START_TIMEOUT_S):
            raise RuntimeError(f"the model server (pid {proc.pid}) did not start")
        yield RemoteModelServer(ours.recv(), ours)
    finally:
        with contextlib.suppress(OSError):
            ours.send("stop")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join(5)


def _serve(conn: Connection, content: str, delay_s: float) -> None:
    from http.server import ThreadingHTTPServer

    from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply

    ThreadingHTTPServer.request_queue_size = 128  # this process serves nothing else
    with ScriptedOpenAIServer(default=ScriptedReply(content=content, delay_s=delay_s)) as srv:
        conn.send(srv.base_url)
        while conn.recv() == "count":
            conn.send(len(srv.requests))
