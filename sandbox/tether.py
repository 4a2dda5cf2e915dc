"""Child processes that die with the process that started them.

nsjail and the design validators' host tools run in a session of their own, so that a
timeout can SIGKILL their whole group at once. That also puts them outside the worker's
process group: a worker killed with its group (``kill -9 -PGID``, the way a supervisor
or a test stops it) or alone (the OOM killer) used to leave them running, unwatched, to
their own time limit or to the end of their work. :func:`tethered` prefixes a command
with ``setpriv --pdeathsig KILL --``: setpriv sets ``PR_SET_PDEATHSIG`` and then execs
the command in place (same PID, same session), so the kernel SIGKILLs it the moment the
thread that started it is gone. The jail's own pid 1 already dies with nsjail.

The parent is the starting *thread*: every caller here starts the child from the thread
that then waits for it (the event loop thread, or a thread inside ``asyncio.run``), so
the tether lasts exactly as long as someone waits for the child.

Without a setpriv that knows ``--pdeathsig`` (util-linux before 2.33) commands run
untethered, and :func:`tether_unavailable` says why.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Sequence


@functools.cache
def _setpriv() -> str | None:
    found = shutil.which("setpriv") or shutil.which("setpriv", path="/usr/bin:/bin")
    if found is None:
        return None
    try:
        probe = subprocess.run(
            [found, "--pdeathsig", "KILL", "--", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found if probe.returncode == 0 else None


def tether_unavailable() -> str | None:
    """Why commands cannot be tethered here, or None when they can."""
    if _setpriv() is None:
        return "no setpriv with --pdeathsig on PATH (util-linux 2.33 or later)"
    return None


def tethered(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it is SIGKILLed when its parent dies (see the module doc)."""
    setpriv = _setpriv()
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]
