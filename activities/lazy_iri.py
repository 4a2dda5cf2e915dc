"""The IRI grammar loaded at its first use, not at every process start.

``jsonschema`` imports ``rfc3987_syntax`` when it is imported (for the ``iri`` and
``iri-reference`` formats; it is installed here with ``jsonschema[format-nongpl]``), and
that module builds an Earley parser from its grammar at import: 1.3-2.5 s of every
``runllm run`` on this kind of machine (``python -X importtime``), for a format few
schemas use. Before anything imports ``jsonschema``, :func:`defer` puts a module of that
name in its place whose ``is_valid_syntax`` imports the real one at its first call; the
formats are checked exactly as before. A long-running process (``keel worker``) calls
:func:`load_now` at start: its first check may come inside a workflow task, which must
not spend seconds importing.

Deferred in: the CLIs (``cli/__init__.py``), an operator host process
(``activities/mrp/host_main.py``) and every process of the local Ray cluster Keel starts
(``activities/ray_site/sitecustomize.py``: ``import ray`` itself imports ``jsonschema``).
Only the standard library is imported here, so any of them may import it first.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

NAME = "rfc3987_syntax"


def defer() -> None:
    """Defer the grammar, unless ``jsonschema`` (or the grammar) is imported already."""
    if NAME in sys.modules or "jsonschema" in sys.modules:
        return
    if importlib.util.find_spec(NAME) is None:
        return  # jsonschema then checks no iri format, as it would without it anyway
    stand_in = types.ModuleType(NAME, "rfc3987_syntax, imported at the first check")

    def is_valid_syntax(term: str, value: str) -> bool:
        return bool(load_now().is_valid_syntax(term, value))

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    stand_in.deferred = True  # type: ignore[attr-defined]
    sys.modules[NAME] = stand_in


def load_now() -> types.ModuleType:
    """The real module, imported now if :func:`defer` put a stand-in in its place."""
    module = sys.modules.get(NAME)
    if module is not None and getattr(module, "deferred", False):
        del sys.modules[NAME]
    return importlib.import_module(NAME)
