"""The one process supervisor of ``keel up`` and ``keel actors serve``.

:func:`supervise` watches child processes (:class:`services.processes.ManagedProcess`)
until a stop signal: a child that may be restarted (``keel up``'s worker, every vLLM actor)
is restarted with backoff when it exits (:class:`Restarts`); a child that must not die
(``keel up``'s Temporal server, model server and API) ends the supervision when it does.

Stop signals come in as :class:`services.processes.Interrupted`, raised by the
:class:`services.processes.StopSignals` guard the caller installed; every (re)start goes
through :meth:`ManagedProcess.start`, which spawns the child and records its PID with the
signals held (``deferred_signals``), so a signal never leaves a child nobody knows of.
:func:`stop_all` stops them by PID.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from services.processes import deferred_signals

# A crashed child is restarted after 1 s, then 2, 4, ... up to 30 s while it keeps
# crashing; a child that ran for a minute counts as healthy again.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
#: How often :func:`supervise` looks at its children.
POLL_S = 0.5


class Child(Protocol):
    """What :func:`supervise` needs of a child (``ManagedProcess`` has it)."""

    name: str
    log_path: Path

    def start(self) -> int: ...

    def running(self) -> bool: ...

    def stop(self, timeout_s: float = ...) -> None: ...

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...


@dataclass
class Restarts:
    """The backoff of one child's restarts."""

    count: int = 0
    streak: int = 0  # restarts since the child last ran for HEALTHY_AFTER_S
    due: float | None = None  # monotonic time of the pending restart
    last_start: float = field(default_factory=time.monotonic)

    def schedule(self, now: float) -> float:
        """Plan the restart of a child found dead at ``now``; returns the delay."""
        if now - self.last_start >= HEALTHY_AFTER_S:
            self.streak = 0
        delay = min(RESTART_MAX_S, RESTART_FIRST_S * 2**self.streak)
        self.streak += 1
        self.count += 1
        self.due = now + delay
        return delay

    def started(self, now: float) -> None:
        self.due = None
        self.last_start = now


def supervise(
    children: Mapping[str, Child],
    say: Callable[[str], None],
    *,
    restart: Iterable[str] | None = None,
    poll_s: float = POLL_S,
) -> str:
    """Watch ``children`` (by name) until a stop signal (raised as ``Interrupted`` by the
    caller's ``StopSignals``) or until one that may not be restarted exits.

    ``restart`` names the children restarted with backoff when they exit (None: all);
    ``say`` gets one line for each exit and each restart. Returns why it stopped (the
    names of the children that exited) when it does so without a signal.
    """
    restartable = set(children if restart is None else restart)
    now = time.monotonic()
    restarts = {name: Restarts(last_start=now) for name in restartable}
    while True:
        time.sleep(poll_s)
        dead = [n for n, c in children.items() if n not in restartable and not c.running()]
        if dead:
            return f"{', '.join(dead)} exited"
        now = time.monotonic()
        for name, r in restarts.items():
            child = children[name]
            if child.running():
                continue
            if r.due is None:
                delay = r.schedule(now)
                say(
                    f"{name} (pid {child.pid}) exited with code {child.returncode}; restarting "
                    f"it in {delay:.0f}s (restart {r.count}; log {child.log_path})"
                )
            elif now >= r.due:
                # A stop signal that comes right after the spawn waits for the report, so
                # every restart that happened is said (the stop then stops the new child).
                with deferred_signals():
                    child.start()  # its on_spawn records the new pid (keel up's up.json)
                    r.started(now)
                    say(f"{name} restarted (pid {child.pid})")


def stop_all(children: Iterable[Child]) -> None:
    """Stop each child by its PID, the last started first."""
    for child in reversed(list(children)):
        child.stop()
