"""Run by Python at the start of every process of the local Ray cluster Keel starts.

:func:`activities.fanout.ray_init` puts this folder first on the ``PYTHONPATH`` of that
cluster's processes (its agents and workers; nothing else). ``import ray`` imports
``jsonschema``, which builds the IRI grammar at import: 1.5 s of CPU in every Ray worker
and agent, for the ``iri`` formats few schemas use. Here :mod:`activities.lazy_iri` puts
a stand-in in its place that builds it at the first ``iri`` check, so formats are checked
as before. A ``sitecustomize`` further along the path (the interpreter's own, if it has
one) is run after this one.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

from activities.lazy_iri import defer

defer()

_HERE = os.path.dirname(os.path.realpath(__file__))
_others = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", _others)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
