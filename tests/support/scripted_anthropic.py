"""A scripted Anthropic-compatible HTTP server (Messages API) for codegen tests.

A real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, a
background thread), so the ``anthropic`` SDK runs its production path: httpx, sockets,
JSON parsing. ``POST /v1/messages`` answers with the queued texts in order (then the last
one again) in the Messages API shape; every request body and its headers are recorded,
so a test can count the calls.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

__all__ = ["ScriptedAnthropicServer"]


class ScriptedAnthropicServer:
    def __init__(self, texts: Iterable[str], *, stop_reason: str = "end_turn") -> None:
        self.texts = list(texts)
        self.stop_reason = stop_reason
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path.split("?")[0] != "/v1/messages":
                    self._send(
                        404,
                        {
                            "type": "error",
                            "error": {"type": "not_found_error", "message": self.path},
                        },
                    )
                    return
                with server._lock:
                    server.requests.append(body)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    n = len(server.requests)
                text = server.texts[min(n, len(server.texts)) - 1]
                self._send(
                    200,
                    {
                        "id": f"msg_scripted_{n}",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model", "scripted"),
                        "content": [{"type": "text", "text": text}],
                        "stop_reason": server.stop_reason,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 10, "output_tokens": len(text) // 4 + 1},
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
