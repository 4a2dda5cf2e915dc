"""The egress guard: while operator code runs, it has no network but its LLM client.

:func:`egress_guard` marks the current context (a ``contextvars.ContextVar``) as running
operator ``name@version``. A process-wide audit hook (``sys.addaudithook``, installed once)
refuses, in a guarded context, every socket connect, datagram send and name lookup, every
``urllib`` request and every new process (``subprocess``, ``os.system``, ``exec``,
``spawn``, ``fork``), raising :class:`EgressDenied`. The LLM client lifts the guard for its
own call with :func:`llm_egress`, and only for operators whose ``operator.yaml`` lists
``llm`` egress.

Threads started from guarded code inherit the guard (``threading.Thread`` is patched to
carry it over), so a thread or a thread pool is no way out. The guard sees what goes
through CPython's audited calls: code that opens sockets from C without them (a C extension
with its own networking, ``ctypes``) is not covered. It is a policy check, not a sandbox:
untrusted code belongs in nsjail (``sandbox/``) as well.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["EgressDenied", "egress_guard", "guarded_operator", "llm_egress"]

# Audit events that reach the network or start a process.
_NETWORK_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "urllib.Request",
    }
)
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.forkpty",
        "pty.spawn",
    }
)
_EVENTS = _NETWORK_EVENTS | _PROCESS_EVENTS


class EgressDenied(PermissionError):
    """Operator code tried to reach the network (or start a process) on its own."""

    def __init__(self, operator: str, event: str, target: str) -> None:
        self.operator = operator
        self.event = event
        self.target = target
        super().__init__(
            f"egress refused: operator {operator} tried {event}({target}); "
            "operators reach the network only through ctx.llm"
        )


@dataclass(frozen=True)
class _Guard:
    operator: str
    allowed: frozenset[str]
    lifted: bool = False


_state: contextvars.ContextVar[_Guard | None] = contextvars.ContextVar(
    "keel_mrp_egress", default=None
)
_install_lock = threading.Lock()
_installed = False


def _target(event: str, args: tuple[Any, ...]) -> str:
    try:
        if event in ("socket.connect", "socket.sendto", "socket.sendmsg") and len(args) >= 2:
            return repr(args[1])
        if args:
            return repr(args[0])[:200]
    except Exception:
        pass
    return ""


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event not in _EVENTS:
        return
    guard = _state.get()
    if guard is None or (guard.lifted and event in _NETWORK_EVENTS):
        return
    raise EgressDenied(guard.operator, event, _target(event, args))


def _install() -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        sys.addaudithook(_hook)
        start = threading.Thread.start
        inner = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

        def _start(self: threading.Thread) -> None:
            # Threads started by operator code stay guarded. Threads started during the
            # LLM client's own call belong to the client's libraries (connection pools,
            # logging workers) and may outlive the call: they carry no guard.
            guard = _state.get()
            self._keel_egress = None if guard is None or guard.lifted else guard  # type: ignore[attr-defined]
            start(self)

        def _bootstrap_inner(self: threading.Thread) -> None:
            guard = getattr(self, "_keel_egress", None)
            if guard is not None:
                _state.set(guard)
            inner(self)

        threading.Thread.start = _start  # type: ignore[method-assign]
        threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]
        _installed = True


@contextlib.contextmanager
def egress_guard(operator: str, allowed: Iterable[str] = ()) -> Iterator[None]:
    """Run the body as operator code: no network, no processes, except through
    :func:`llm_egress` when ``"llm"`` is in ``allowed``."""
    _install()
    token = _state.set(_Guard(operator=operator, allowed=frozenset(allowed)))
    try:
        yield
    finally:
        _state.reset(token)


@contextlib.contextmanager
def llm_egress() -> Iterator[None]:
    """Lift the guard for the LLM client's own call.

    Outside operator code this does nothing. Inside, it refuses operators that did not
    declare ``llm`` egress, and lifts only network checks (no processes).
    """
    guard = _state.get()
    if guard is None:
        yield
        return
    if "llm" not in guard.allowed:
        raise EgressDenied(guard.operator, "llm", "its operator.yaml lists no 'llm' egress")
    token = _state.set(replace(guard, lifted=True))
    try:
        yield
    finally:
        _state.reset(token)


def guarded_operator() -> str | None:
    """The operator whose code runs in this context (None outside operator code)."""
    guard = _state.get()
    return None if guard is None else guard.operator
