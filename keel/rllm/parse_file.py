"""Parsing a ``.rllm`` file: the limits on its frontmatter, and where each error points
(:class:`_File`: the file name and the composed YAML tree for line lookups)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

import yaml

from keel.problems import located
from keel.rllm.errors import (
    REDACTED,
    MetadataValidationError,
    ParseError,
    redact_secrets,
)
from keel.rllm.model import (
    IDENT_PATTERN,
)

_SECTION = re.compile(r"^===[ \t]*([A-Za-z].*?)[ \t]*===[ \t]*$")
_IDENT = re.compile(IDENT_PATTERN)
_BLOCK_KEYS = ("name", "stage", "inputs", "outputs")
_FRONTMATTER_FIRST_LINE = 2
_MISSING = object()

# Limits on the frontmatter, far above what an app needs, so that parsing one file (in the
# API, the CLI or a worker) stays a matter of milliseconds: without them 50,000 nested
# brackets are a RecursionError and nine levels of YAML anchors expand to 9**9 nodes.
MAX_FRONTMATTER_BYTES = 256 * 1024
MAX_FRONTMATTER_DEPTH = 64
MAX_FRONTMATTER_NODES = 10_000
MAX_USES = 100
# Each reference is checked and located; more than this many '{{' is no real template.
MAX_TEMPLATE_REFS = 10_000

PathParts = Sequence[str | int]


def _key(parts: PathParts) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _json_path_parts(path: str) -> list[str | int]:
    """``$.uses[0].alias`` -> ``['uses', 0, 'alias']``."""
    parts: list[str | int] = []
    # '*', not '+': an empty key is a key too ('$.' is the path of key '').
    for m in re.finditer(r"\.([^.\[\]]*)|\[(\d+)\]", path.removeprefix("$")):
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
    return parts


def _suggest(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _File:
    """Where errors point: the file name and the composed YAML tree for line lookups."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.name = path or "<text>"
        self.root: yaml.Node | None = None

    def locate(self, parts: PathParts) -> tuple[int, int]:
        """File line and column of a frontmatter key (the deepest part that exists)."""
        node = self.root
        if node is None:
            return _FRONTMATTER_FIRST_LINE, 1
        pos = node.start_mark
        for part in parts:
            nxt = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if k.value == str(part):
                        pos, nxt = k.start_mark, v
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                pos = nxt.start_mark
            if nxt is None:
                break
            node = nxt
        return pos.line + _FRONTMATTER_FIRST_LINE, pos.column + 1

    def parse_error(
        self, message: str, line: int, column: int = 1, *, hint: str | None = None, **extra: Any
    ) -> ParseError:
        return ParseError(
            located(message, self.name, line, column),
            details={"file": self.path, "line": line, "column": column, **extra},
            recovery_hint=hint,
        )

    def meta_error(
        self,
        parts: PathParts,
        message: str,
        *,
        expected_schema: dict[str, Any] | None = None,
        received: Any = _MISSING,
        data: Any = None,
        hint: str | None = None,
        **extra: Any,
    ) -> MetadataValidationError:
        line, column = self.locate(parts)
        key = _key(parts) or "(frontmatter)"
        if received is _MISSING:
            received = _value_at(data, parts)
        return MetadataValidationError(
            located(f"{key}: {message}", self.name, line, column),
            details={"file": self.path, "line": line, "column": column, "key": key, **extra},
            expected_schema=expected_schema,
            received_payload=None if received is _MISSING else _redact_at(parts, received),
            recovery_hint=hint,
        )


def _redact_at(parts: PathParts, value: Any) -> Any:
    # The value of a key named like a secret is hidden even when it is the key at fault.
    last = parts[-1] if parts else ""
    if isinstance(last, str) and redact_secrets({last: None}) != {last: None}:
        return REDACTED
    return redact_secrets(value)


def _value_at(data: Any, parts: PathParts) -> Any:
    for p in parts:
        found = (isinstance(data, dict) and p in data) or (
            isinstance(data, list) and isinstance(p, int) and 0 <= p < len(data)
        )
        if not found:
            return _MISSING
        data = data[p]
    return data


def _schema_at(schema: dict[str, Any], parts: PathParts) -> dict[str, Any]:
    """The part of the frontmatter schema that describes the key at ``parts``."""
    for p in parts:
        if isinstance(p, int):
            nxt = schema.get("items")
        else:
            nxt = schema.get("properties", {}).get(p, schema.get("additionalProperties"))
        if not isinstance(nxt, dict):
            return schema
        schema = nxt
    return schema
