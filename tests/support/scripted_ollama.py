"""A scripted Ollama HTTP server for tests of the Ollama assist (``activities/ollama.py``).

A real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, a
background thread) that speaks the two endpoints Keel uses, in Ollama's wire format:

* ``GET /api/tags`` -> ``{"models": [{"name", "model", "size", "digest", ...}]}``;
* ``POST /api/pull`` with ``{"model": "...", "stream": true}`` (``"name"`` also taken)
  -> streamed JSON lines, one object per line, over a chunked response:
  ``{"status": "pulling manifest"}``, ``{"status": "pulling <digest>", "digest",
  "total", "completed"}`` a few times, ``{"status": "verifying sha256 digest"}``,
  ``{"status": "writing manifest"}``, ``{"status": "success"}``; the model then appears
  in ``/api/tags``. A model in ``unknown`` streams ``{"error": "pull model manifest: file
  does not exist"}`` after the manifest line, as Ollama does. ``stream: false`` answers
  one JSON object at the end.

Usage::

    with ScriptedOllamaServer(installed=["llama3.2:latest"], available=["smollm2:135m"]) as srv:
        ... srv.base_url ...
        assert srv.pulls == ["smollm2:135m"]
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["ScriptedOllamaServer"]

NOT_FOUND = "pull model manifest: file does not exist"


def _full(name: str) -> str:
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


class ScriptedOllamaServer:
    """Ollama's ``/api/tags`` and ``/api/pull`` on loopback.

    Args:
        installed: models listed by ``/api/tags`` from the start.
        available: models ``/api/pull`` can fetch; any other name fails like an unknown
            model. ``None`` means every name can be pulled.
        chunks: progress lines per pulled layer (``completed`` grows to ``total``).
        chunk_delay_s: pause between progress lines (a slow download).
    """

    def __init__(
        self,
        installed: Iterable[str] = (),
        *,
        available: Iterable[str] | None = None,
        chunks: int = 4,
        chunk_delay_s: float = 0.0,
    ) -> None:
        self.installed: list[str] = [_full(m) for m in installed]
        self.available = None if available is None else {_full(m) for m in available}
        self.chunks = chunks
        self.chunk_delay_s = chunk_delay_s
        self.pulls: list[str] = []
        self.requests: list[tuple[str, str, Any]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._httpd.block_on_close = True
        self._httpd.daemon_threads = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-ollama:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        httpd.shutdown()
        httpd.server_close()
        if thread is not None:
            thread.join(timeout=10)
        self._httpd = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptedOllamaServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT``: Ollama's base URL (no ``/v1``)."""
        return f"http://127.0.0.1:{self.port}"

    def _pull_lines(self, model: str) -> Iterable[dict[str, Any]]:
        yield {"status": "pulling manifest"}
        if self.available is not None and model not in self.available:
            yield {"error": NOT_FOUND}
            return
        for layer, total in (("sha256:4a5b", 4000), ("sha256:9c1d", 1000)):
            for i in range(1, self.chunks + 1):
                if self.chunk_delay_s:
                    time.sleep(self.chunk_delay_s)
                yield {
                    "status": f"pulling {layer[7:]}",
                    "digest": layer,
                    "total": total,
                    "completed": total * i // self.chunks,
                }
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        with self._lock:
            if model not in self.installed:
                self.installed.append(model)
            self.pulls.append(model)
        yield {"status": "success"}


def _make_handler(server: ScriptedOllamaServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                return json.loads(raw) if raw else None
            except ValueError:
                return None

        def _send_json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)
            self.close_connection = True

        def do_GET(self) -> None:
            server.requests.append(("GET", self.path, None))
            if self.path.rstrip("/") != "/api/tags":
                self._send_json(404, {"error": f"no route {self.path}"})
                return
            with server._lock:
                names = list(server.installed)
            models = [
                {
                    "name": n,
                    "model": n,
                    "modified_at": "2025-01-01T00:00:00Z",
                    "size": 1000 + i,
                    "digest": f"{i:064x}",
                    "details": {"format": "gguf", "family": n.split(":")[0]},
                }
                for i, n in enumerate(names)
            ]
            self._send_json(200, {"models": models})

        def do_POST(self) -> None:
            body = self._body()
            server.requests.append(("POST", self.path, body))
            if self.path.rstrip("/") != "/api/pull":
                self._send_json(404, {"error": f"no route {self.path}"})
                return
            if not isinstance(body, dict) or not (body.get("model") or body.get("name")):
                self._send_json(400, {"error": "model is required"})
                return
            model = _full(str(body.get("model") or body.get("name")))
            lines = list(server._pull_lines(model)) if body.get("stream") is False else None
            if lines is not None:
                self._send_json(200, lines[-1])
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/x-ndjson")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                for line in server._pull_lines(model):
                    data = json.dumps(line).encode() + b"\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

    return Handler
