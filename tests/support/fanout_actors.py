"""An actor class with no MRP types, for the family-neutral fan-out test (Ray imports it by
module path in its worker processes)."""

from __future__ import annotations

import os
import time


class Echo:
    """Answers with its input and its PID; ``nap`` sleeps first."""

    def ready(self) -> int:
        return os.getpid()

    def echo(self, value: int, nap_s: float = 0.0) -> tuple[int, int]:
        time.sleep(nap_s)
        return value, os.getpid()
