"""Entry point of an operator host process (``python -m activities.mrp.host_main``).

Imports as little as it can before :func:`activities.mrp.host.main`: ``jsonschema`` (which
operator schemas need) would import ``rfc3987_syntax``, which builds an Earley parser at
import (seconds on a loaded machine) for the ``iri`` formats few schemas use, so
:mod:`activities.lazy_iri` puts a stand-in in its place that imports the real module at
its first check. Formats are checked exactly as in the worker.
"""

from __future__ import annotations

import sys

from activities.lazy_iri import defer

if __name__ == "__main__":
    defer()
    from activities.mrp.host import main

    main(sys.argv[1:])
