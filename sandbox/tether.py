"""Child processes that die with the process that started them, whenever it dies.

nsjail and the design validators' host tools run in a session of their own, so that a
timeout can SIGKILL their whole group at once. That also puts them outside the worker's
process group: a worker killed with its group (``kill -9 -PGID``, the way a supervisor
or a test stops it) or alone (the OOM killer) used to leave them running, unwatched, to
their own time limit or to the end of their work. :func:`tethered` wraps a command so
that the kernel signals it the moment the thread that started it is gone:

    setpriv --pdeathsig KILL -- /bin/sh -c GATE keel-tether <parent pid> <command...>

setpriv sets ``PR_SET_PDEATHSIG`` and execs the gate in place (same PID, same session);
the gate, a POSIX shell, execs the command in place if its parent is still the process
that started it, and exits otherwise. The death signal survives both execs.

The gate closes the start window. ``PR_SET_PDEATHSIG`` only fires for a parent that dies
*after* it is set: a parent killed between the fork and setpriv's ``prctl`` leaves a
child that is already an orphan (adopted by init or a subreaper) and is never signalled.
The shell reads its parent's PID (``$PPID``) after setpriv armed the signal, so either
the parent was alive then, and its death from then on kills the command, or it was not,
and the command never starts. Measured with ``tests/core/faults/
test_children_die_with_worker.py`` (200 SIGKILLs of the parent at random instants of
the start, seed 1752543194): without the gate 12 of 100 host tools and 5 of 100 jails
(nsjail and the jailed program) were left running; with it, none. The gate costs one
exec of ``/bin/sh``, about a millisecond.

nsjail is tethered with SIGTERM rather than SIGKILL (:data:`NSJAIL_DEATH_SIGNAL`): the
jailed program is nsjail's child, and it sets its own ``PR_SET_PDEATHSIG`` only late in
its set-up, after the mounts, once it has dropped privileges. An nsjail SIGKILLed before
then left the program running (1 of those 100 jails; 4 of 40 when nsjail alone was
SIGKILLed 0-60 ms into its start). On SIGTERM nsjail SIGKILLs and reaps its child before
it exits, wherever either was in the set-up (0 of 60 with the same offsets): its handler
only notes the signal, and its main loop acts on it once the child is started (the
program may have begun by then) or at its one-second timer at the latest. Before the
handlers are installed nsjail has no child, and SIGTERM simply ends it.

The parent is the starting *thread*: every caller here starts the child from the thread
that then waits for it (the event loop thread, or a thread inside ``asyncio.run``), so
the tether lasts exactly as long as someone waits for the child.

Without a setpriv that knows ``--pdeathsig`` (util-linux before 2.33) commands run
untethered, and :func:`tether_unavailable` says why.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Sequence

#: What the kernel sends nsjail when the thread that started it dies (see the module doc).
NSJAIL_DEATH_SIGNAL = "TERM"
#: Runs after setpriv armed the death signal: ``$1`` is the PID of the process that
#: started us; if our parent is no longer that process, it died before the signal was
#: armed, and the command must not start.
GATE = '[ "$PPID" = "$1" ] || exit 125; shift; exec "$@"'
_SHELL = "/bin/sh"


@functools.cache
def _setpriv() -> str | None:
    found = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin")
    if found is None:
        return None
    try:
        probe = subprocess.run(
            _wrap(found, "KILL", ["true"]), capture_output=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if probe.returncode == 0 else None


def _wrap(setpriv: str, death_signal: str, argv: Sequence[str]) -> list[str]:
    return [
        setpriv, "--pdeathsig", death_signal, "--",
        _SHELL, "-c", GATE, "keel-tether", str(os.getpid()), *argv,
    ]  # fmt: skip


def tether_unavailable() -> str | None:
    """Why commands cannot be tethered here, or None when they can."""
    if _setpriv() is None:
        return f"no setpriv with --pdeathsig on PATH (util-linux 2.33 or later), or no {_SHELL}"
    return None


def tethered(argv: Sequence[str], *, death_signal: str = "KILL") -> list[str]:
    """``argv`` run so that it gets ``death_signal`` (a name setpriv knows) when the
    thread that starts it dies, from the first instant on (see the module doc).

    Build it in the process that starts it: the gate checks the parent against this
    process's PID.
    """
    setpriv = _setpriv()
    if setpriv is None:
        return list(argv)
    return _wrap(setpriv, death_signal, argv)
