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


def iri_checks() -> tuple[bool, list[bool]]:
    """In a Ray worker: whether the IRI grammar is still the deferred stand-in (before any
    check), then jsonschema's ``iri`` format on a valid and an invalid IRI."""
    import sys

    import jsonschema

    deferred = bool(getattr(sys.modules.get("rfc3987_syntax"), "deferred", False))
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return deferred, [
        checker.conforms("http://example.com/ä", "iri"),
        checker.conforms("http://exa mple.com/ä", "iri"),
    ]
