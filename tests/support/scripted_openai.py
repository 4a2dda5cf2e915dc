"""A scripted OpenAI-compatible HTTP server for tests that need exact LLM outputs.

It is a real HTTP server (stdlib ``ThreadingHTTPServer`` on 127.0.0.1, a free port, a
background thread), so the code under test runs its production path: LiteLLM, the OpenAI
client, httpx, sockets. Nothing is mocked.

Usage::

    with ScriptedOpenAIServer([ScriptedReply(content='{"a": 1}'),
                               ScriptedReply(status=429, headers={"Retry-After": "3"})]) as srv:
        # point a ModelSpec at it: litellm_model="openai/scripted", api_base=srv.base_url
        ...
        assert srv.requests[0].json["temperature"] == 0

Endpoints: ``POST /v1/chat/completions`` (also ``/chat/completions``) serves the queued
replies in order, then ``default``; ``GET /v1/models`` lists ``model_ids``. Every request
is recorded in :attr:`ScriptedOpenAIServer.requests`. Non-streaming only.

A reply with ``hold`` (a ``threading.Event``) is not sent until that event is set: a test
holds requests in flight, on whichever worker sent them, for as long as it needs (a kill
lands inside the activity that waits), and :attr:`ScriptedOpenAIServer.holding` says how
many wait now.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

__all__ = ["RecordedRequest", "ScriptedOpenAIServer", "ScriptedReply", "echo_last_user"]


@dataclass
class ScriptedReply:
    """One scripted answer to a chat completion request.

    ``status`` >= 400 sends an OpenAI-style error body whose message is ``content``.
    ``delay_s`` waits before answering (to provoke client timeouts). ``hold`` waits, before
    that, until the event is set (or the server stops). ``body`` (dict, str or bytes)
    replaces the generated body entirely, for malformed or unusual replies.
    """

    status: int = 200
    content: str = "ok"
    headers: dict[str, str] = field(default_factory=dict)
    prompt_tokens: int = 5
    completion_tokens: int = 3
    delay_s: float = 0.0
    body: dict[str, Any] | str | bytes | None = None
    finish_reason: str = "stop"
    hold: threading.Event | None = None


@dataclass
class RecordedRequest:
    """A request the server received. ``headers`` keys are lower-case; ``json`` is the
    parsed body (None when empty or not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any


DefaultReply = ScriptedReply | Callable[[RecordedRequest], ScriptedReply]


def echo_last_user(req: RecordedRequest) -> ScriptedReply:
    """A ``default`` that answers with the content of the last user message."""
    messages = (req.json or {}).get("messages") or []
    users = [m.get("content", "") for m in messages if m.get("role") == "user"]
    return ScriptedReply(content=str(users[-1]) if users else "")


class ScriptedOpenAIServer:
    """OpenAI chat completions API on loopback, answering from a script.

    Args:
        replies: served in order, one per chat completion request.
        default: served when the queue is empty; a reply or a function of the request.
        model_ids: what ``GET /v1/models`` lists.
    """

    def __init__(
        self,
        replies: Iterable[ScriptedReply] = (),
        *,
        default: DefaultReply | None = None,
        model_ids: Iterable[str] = ("scripted",),
    ) -> None:
        self._queue: deque[ScriptedReply] = deque(replies)
        self.default: DefaultReply = default if default is not None else ScriptedReply()
        self.model_ids = list(model_ids)
        self._requests: list[RecordedRequest] = []
        self._holding = 0
        self._lock = threading.Lock()
        # Set on stop() so that handlers sleeping in delay_s wake up at once.
        self._stopping = threading.Event()
        self._ids = itertools.count(1)
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> Self:
        """Bind 127.0.0.1 on a free port and serve in a background thread."""
        if self._httpd is not None:
            return self
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
        # Joined in server_close(): stop() leaves no handler thread behind.
        self._httpd.block_on_close = True
        self._httpd.daemon_threads = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-openai:{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, wake delayed handlers, and join every thread. Idempotent."""
        httpd, thread = self._httpd, self._thread
        if httpd is None:
            return
        self._stopping.set()
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

    # -- script and records ---------------------------------------------------------
    def enqueue(self, *replies: ScriptedReply) -> None:
        """Append replies to the queue."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def requests(self) -> list[RecordedRequest]:
        """A copy of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        """The chat completion requests among :attr:`requests`."""
        return [r for r in self.requests if r.path.rstrip("/").endswith("/chat/completions")]

    @property
    def holding(self) -> int:
        """How many requests wait now for their reply's ``hold`` event."""
        with self._lock:
            return self._holding

    def _wait_hold(self, hold: threading.Event) -> bool:
        """Wait until ``hold`` is set; False when the server stops first."""
        with self._lock:
            self._holding += 1
        try:
            while not hold.wait(0.05):
                if self._stopping.is_set():
                    return False
            return True
        finally:
            with self._lock:
                self._holding -= 1

    @property
    def port(self) -> int:
        """The bound port (the server must be started)."""
        if self._httpd is None:
            raise RuntimeError("ScriptedOpenAIServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``: what an OpenAI client takes as base URL."""
        return f"http://127.0.0.1:{self.port}/v1"

    # -- internals ------------------------------------------------------------------
    def _record(self, req: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(req)

    def _next_reply(self, req: RecordedRequest) -> ScriptedReply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return self.default(req) if callable(self.default) else self.default

    def _completion_body(self, reply: ScriptedReply, req: RecordedRequest) -> dict[str, Any]:
        model = (req.json or {}).get("model") or (self.model_ids[0] if self.model_ids else "")
        return {
            "id": f"chatcmpl-scripted-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply.content},
                    "finish_reason": reply.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }


def _error_body(status: int, message: str) -> dict[str, Any]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": str(status)}}


def _make_handler(server: ScriptedOpenAIServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, so stop() never waits on an idle keep-alive.
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:
            return  # the default writes every request to stderr

        def _read(self) -> RecordedRequest:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            rec = RecordedRequest(
                method=self.command,
                path=self.path,
                headers={k.lower(): v for k, v in self.headers.items()},
                json=parsed,
            )
            server._record(rec)
            return rec

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            if isinstance(body, bytes):
                data = body
            elif isinstance(body, str):
                data = body.encode()
            else:
                data = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (e.g. its timeout fired during delay_s)

        def do_GET(self) -> None:
            rec = self._read()
            if rec.path.rstrip("/") in ("/v1/models", "/models"):
                data = [
                    {"id": m, "object": "model", "owned_by": "keel-tests"} for m in server.model_ids
                ]
                self._send(200, {"object": "list", "data": data})
            else:
                self._send(404, _error_body(404, f"no route {rec.path}"))

        def do_POST(self) -> None:
            rec = self._read()
            if rec.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                self._send(404, _error_body(404, f"no route {rec.path}"))
                return
            reply = server._next_reply(rec)
            if reply.hold is not None and not server._wait_hold(reply.hold):
                return  # stopping: drop the connection without an answer
            if reply.delay_s > 0 and server._stopping.wait(reply.delay_s):
                return  # stopping: drop the connection without an answer
            if reply.body is not None:
                body: Any = reply.body
            elif reply.status >= 400:
                body = _error_body(reply.status, reply.content)
            else:
                body = server._completion_body(reply, rec)
            self._send(reply.status, body, reply.headers)

    return Handler


def models_yaml(base_url: str, structured_output: str = "json_object_schema") -> str:
    """A models config whose default model ``local`` is the scripted server at ``base_url``
    (free, so cost checks see 0). It stands in for the embedded llama.cpp server, so by
    default it takes a schema in llama.cpp's form (``structured_output``)."""
    return (
        "default: local\n"
        "models:\n"
        "  local:\n"
        "    litellm_model: openai/scripted\n"
        f"    api_base: {base_url}\n"
        "    input_cost_per_token: 0.0\n"
        "    output_cost_per_token: 0.0\n"
        f"    structured_output: {structured_output}\n"
    )


def write_models_config(
    path: Path, base_url: str, structured_output: str = "json_object_schema"
) -> Path:
    """Write :func:`models_yaml` to ``path`` (for ``KEEL_MODELS_CONFIG``); returns ``path``."""
    path.write_text(models_yaml(base_url, structured_output))
    return path
