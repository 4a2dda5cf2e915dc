"""Prompt templates: a deliberately tiny, safe syntax and its deterministic renderer.

The only construct is a variable reference, ``{{ name }}`` or ``{{ name.field.0 }}``.
There are no conditionals, loops, filters or expressions, so rendering cannot run code
(unlike Jinja, whose sandbox is best effort) and the same variables always give the same
bytes, which Temporal replay and digest-keyed caching rely on. Strings are inserted as
they are; every other value as JSON with sorted keys. A literal ``{{`` is written ``\\{{``.
Anything else between ``{{`` and ``}}`` is a syntax error, so a typo never reaches a model.

The recovery prompt sent after an invalid answer is rendered here too, with the reserved
variables ``rllm.prompt``, ``rllm.bad_output``, ``rllm.errors`` and ``rllm.output_schema``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from keel.rllm.schema import ValidationIssue

_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_REF = re.compile(rf"\{{\{{[ \t]*({_IDENT}(?:\.(?:{_IDENT}|[0-9]+))*)[ \t]*\}}\}}")

#: The namespace of the variables only a recovery template sees; no input may use it.
RESERVED_ROOT = "rllm"
RECOVERY_FIELDS = ("prompt", "bad_output", "errors", "output_schema")

DEFAULT_RECOVERY_TEMPLATE = """\
{{ rllm.prompt }}

Your previous answer could not be used. It was:
{{ rllm.bad_output }}

Problems found in it:
{{ rllm.errors }}

Answer again with only one JSON object, and nothing else, matching this JSON Schema:
{{ rllm.output_schema }}
"""


class TemplateSyntaxError(ValueError):
    """A ``{{`` that does not open a valid variable reference."""

    def __init__(self, message: str, line: int, column: int) -> None:
        super().__init__(message)
        self.message = message
        self.line = line
        self.column = column


class TemplateRef(BaseModel):
    """One ``{{ ... }}`` reference: its dotted parts and where it starts (1-based)."""

    model_config = ConfigDict(frozen=True)

    parts: tuple[str, ...]
    line: int
    column: int

    @property
    def name(self) -> str:
        """The reference as written, without braces: ``summary.text``."""
        return ".".join(self.parts)


Segment = str | TemplateRef


def _position(text: str, index: int, first_line: int) -> tuple[int, int]:
    line = first_line + text.count("\n", 0, index)
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, column


class _Positions:
    """Line and column of increasing indexes, counting each newline once.

    Counting from the start for every reference made a prompt of many references
    quadratic (150,000 references took minutes to load).
    """

    def __init__(self, text: str, first_line: int) -> None:
        self.text = text
        self.index = 0
        self.line = first_line
        self.line_start = 0

    def at(self, index: int) -> tuple[int, int]:
        newlines = self.text.count("\n", self.index, index)
        if newlines:
            self.line += newlines
            self.line_start = self.text.rfind("\n", self.index, index) + 1
        self.index = index
        return self.line, index - self.line_start + 1


def parse_template(text: str, *, first_line: int = 1) -> list[Segment]:
    """Split a template into literal strings and references.

    ``first_line`` is the file line the template starts on, so positions in errors and
    references point into the ``.rllm`` file rather than into the template.

    Raises:
        TemplateSyntaxError: a ``{{`` that is not a valid reference (with line and column).
    """
    segments: list[Segment] = []
    buf: list[str] = []
    positions = _Positions(text, first_line)
    i, n = 0, len(text)
    while i < n:
        nxt = text.find("{{", i)
        if nxt < 0:
            buf.append(text[i:])
            break
        if nxt > i and text[nxt - 1] == "\\":
            buf.append(text[i : nxt - 1])
            buf.append("{{")
            i = nxt + 2
            continue
        # In a run like '{{{ x }}' the reference opens at the last two braces, so a JSON
        # example such as '{"a": {{{ x }}}' needs no escaping.
        start = nxt
        while start + 2 < n and text[start + 2] == "{":
            start += 1
        buf.append(text[i:start])
        m = _REF.match(text, start)
        if m is None:
            line, col = _position(text, start, first_line)
            close = text.find("}}", start + 2)
            if close < 0 or "\n" in text[start:close]:
                msg = "'{{' is never closed by '}}' on the same line"
            else:
                inner = text[start + 2 : close].strip()
                msg = (
                    f"'{{{{ {inner} }}}}' is not a variable reference; write {{{{ name }}}} "
                    "or {{ name.field }}, or \\{{ for literal braces"
                )
            raise TemplateSyntaxError(msg, line, col)
        if buf:
            segments.append("".join(buf))
            buf = []
        line, col = positions.at(start)
        segments.append(TemplateRef(parts=tuple(m.group(1).split(".")), line=line, column=col))
        i = m.end()
    if buf and "".join(buf):
        segments.append("".join(buf))
    return segments


def template_refs(text: str, *, first_line: int = 1) -> list[TemplateRef]:
    """The references of a template, in order of appearance."""
    return [s for s in parse_template(text, first_line=first_line) if isinstance(s, TemplateRef)]


def static_text(text: str) -> str:
    """The template with every reference removed: the part of the prompt known at load."""
    return "".join(s for s in parse_template(text) if isinstance(s, str))


#: What :func:`lookup` returns for a path that leads nowhere.
MISSING: Any = object()


def lookup(variables: Mapping[str, Any], parts: Sequence[str]) -> Any:
    """Follow a dotted path through mappings and lists; ``None``-safe, never raises.

    Returns :data:`MISSING` when the path leads nowhere; :func:`render` prints that as
    an empty string (an optional input that was not given).
    """
    value: Any = variables.get(parts[0], MISSING)
    for p in parts[1:]:
        if isinstance(value, Mapping):
            value = value.get(p, MISSING)
        elif isinstance(value, list) and p.isdigit() and int(p) < len(value):
            value = value[int(p)]
        else:
            return MISSING
    return value


def format_value(value: Any) -> str:
    """How a value appears in a prompt: strings verbatim, anything else as sorted JSON."""
    if value is MISSING:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def render(template: str, variables: Mapping[str, Any]) -> str:
    """Render ``template`` with ``variables``.

    Raises:
        TemplateSyntaxError: the template is malformed (the parser reports this at load).
    """
    out: list[str] = []
    for seg in parse_template(template):
        out.append(seg if isinstance(seg, str) else format_value(lookup(variables, seg.parts)))
    return "".join(out)


def format_issues(issues: Sequence[ValidationIssue]) -> str:
    """Issues as a bullet list, one ``- path: message`` per line, in the given order."""
    return "\n".join(f"- {i.line()}" for i in issues)


def render_recovery(
    recovery_template: str | None,
    errors: Sequence[ValidationIssue],
    bad_output: str,
    schema: Mapping[str, Any],
    *,
    prompt: str = "",
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render the prompt for a retry after an invalid answer.

    ``recovery_template`` is the app's ``=== recovery ===`` section, or ``None`` for
    :data:`DEFAULT_RECOVERY_TEMPLATE`. ``errors`` are quoted exactly as validation gave
    them, ``bad_output`` verbatim (the model must see what it actually wrote), ``schema``
    as indented JSON. ``prompt`` is the original rendered prompt and ``variables`` the
    app's own variables, which a custom recovery template may use as well.
    """
    scope: dict[str, Any] = dict(variables or {})
    scope[RESERVED_ROOT] = {
        "prompt": prompt,
        "bad_output": bad_output,
        "errors": format_issues(errors),
        "output_schema": json.dumps(schema, ensure_ascii=False, sort_keys=True, indent=2),
    }
    return render(
        DEFAULT_RECOVERY_TEMPLATE if recovery_template is None else recovery_template, scope
    )
