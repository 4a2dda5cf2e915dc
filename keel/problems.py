"""Problems as the lines Keel shows people: ``where: what``.

One rule for every config file, model reply, task line and setting: the location is the
dotted path of the field (``root`` when the error is about the whole value), and the
value that failed is left out unless asked for (a value in the wrong place may be a
secret).

One rule, too, for a place in a file (:func:`location`, :func:`located`: ``job.yaml:26``,
``app.rllm:6:1``, ``line 26`` when the file has no name) and for a key path in a document
after a rule's name (:func:`at_path`: `` at policy.max_workers (line 30)``): the MRP job
checks, the ``.rllm`` parser and the SRL data files all write places this way.
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


def location(source: str = "", line: int | None = None, column: int | None = None) -> str:
    """``source:line:column`` with the unknown parts left out: ``job.yaml:26``,
    ``app.rllm:6:1``, ``line 26`` without a source, ``job.yaml`` without a line, and
    ``""`` when nothing is known."""
    if line is None:
        return source
    where = f"{source}:{line}" if source else f"line {line}"
    return where if column is None else f"{where}:{column}"


def located(
    message: str, source: str = "", line: int | None = None, column: int | None = None
) -> str:
    """``message`` after its :func:`location` and ``": "``, or alone when none is known."""
    where = location(source, line, column)
    return f"{where}: {message}" if where else message


def at_path(path: str, line: int | None = None) -> str:
    """`` at policy.max_workers (line 30)``: where a finding is in a document, for a
    message that names its rule first (``MRP-P001 max_workers over cap at ...``)."""
    where = f" at {path}" if path else ""
    return where if line is None else f"{where} (line {line})"
