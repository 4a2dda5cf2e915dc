"""``python -m activities.design.seed_warmup``: build the design validators' mypy seed
now if this machine lacks it (``scripts/bootstrap.sh``, at setup; see
:func:`activities.design.validators.jailed.warm_mypy_seed`). Reads the sandbox config as
a worker does (``KEEL_SANDBOX_CONFIG``, ``KEEL_NSJAIL_PATH``); says in one line what it
did, and leaves with 0 either way: without a seed the validators build it at their first
mypy run, as before."""

from __future__ import annotations

import logging
import os
import sys

from activities.design.validators.jailed import warm_mypy_seed
from sandbox.models import config_for


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="keel: %(message)s")
    config = config_for(os.environ.get("KEEL_SANDBOX_CONFIG"), os.environ.get("KEEL_NSJAIL_PATH"))

    def say(line: str) -> None:
        sys.stderr.write(f"keel: the design validators' mypy cache: {line}\n")

    say(warm_mypy_seed(config, say))


if __name__ == "__main__":
    main()
