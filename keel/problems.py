"""Pydantic's validation errors as the lines Keel shows people: ``where: what``.

One rule for every config file, model reply, task line and setting: the location is the
dotted path of the field (``root`` when the error is about the whole value), and the
value that failed is left out unless asked for (a value in the wrong place may be a
secret).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


def where(loc: tuple[Any, ...] | list[Any], root: str = "") -> str:
    """The dotted location of a field (``root`` for the value itself)."""
    return ".".join(str(part) for part in loc) or root


def problem_lines(err: ValidationError, root: str = "(top level)") -> list[str]:
    """One ``where: what`` line per error, inputs left out."""
    lines = []
    for e in err.errors(include_input=False, include_url=False):
        place = where(e["loc"], root)
        lines.append(f"{place}: {e['msg']}" if place else e["msg"])
    return lines


def problems(err: ValidationError, root: str = "(top level)") -> str:
    """:func:`problem_lines` joined with ``; `` for a one-line message."""
    return "; ".join(problem_lines(err, root))
