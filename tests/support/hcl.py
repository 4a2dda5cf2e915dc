"""python-hcl2 parses each distinct Terraform text once while a test module runs.

The design tests check Keel's readers of the generated Terraform (the wiring check, the
``hcl`` validator, the diff) on many trees that share most of their files, and on
copies of one tree broken at one joint: python-hcl2 (lark) re-parsing the same texts took
most of their time. The parse is a pure function of the text, so a module that opts in
(``with parse_once(): ...``, in a module-scoped fixture) gets each text's document from
the first parse, as a deep copy (a reader may change what it is given); a text that does
not parse raises each time, as before.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import hcl2


@contextmanager
def parse_once() -> Iterator[None]:
    """``hcl2.loads`` memoized by its arguments until the block ends."""
    real = hcl2.loads

    @functools.cache
    def parsed(text: str, with_meta: bool) -> dict[str, Any]:
        doc: dict[str, Any] = real(text, with_meta=with_meta)
        return doc

    def loads(text: str, with_meta: bool = False) -> dict[str, Any]:
        return copy.deepcopy(parsed(text, with_meta))

    hcl2.loads = loads
    try:
        yield
    finally:
        hcl2.loads = real
