"""Entry point of an operator host process (``python -m activities.mrp.host_main``).

Imports as little as it can before :func:`activities.mrp.host.main`: ``jsonschema`` (which
operator schemas need) would import ``rfc3987_syntax``, which builds an Earley parser at
import (seconds on a loaded machine) for the ``iri`` formats few schemas use, so a
stand-in takes its name and imports the real module at its first check, as
``cli.lazy_iri`` does for the CLI. Formats are checked exactly as in the worker.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

_NAME = "rfc3987_syntax"


def _defer_iri_grammar() -> None:
    if _NAME in sys.modules or "jsonschema" in sys.modules:
        return
    if importlib.util.find_spec(_NAME) is None:
        return
    stand_in = types.ModuleType(_NAME, "rfc3987_syntax, imported at the first check")

    def is_valid_syntax(term: str, value: str) -> bool:
        module = sys.modules.get(_NAME)
        if module is stand_in:
            del sys.modules[_NAME]
        return bool(importlib.import_module(_NAME).is_valid_syntax(term, value))

    stand_in.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    sys.modules[_NAME] = stand_in


if __name__ == "__main__":
    _defer_iri_grammar()
    from activities.mrp.host import main

    main(sys.argv[1:])
