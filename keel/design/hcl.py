"""Terraform read as HCL (python-hcl2), for the design diff: any layout Terraform accepts
reads the same (``terraform fmt``'s, one-line blocks, odd spacing, comments anywhere).

Pure: it reads text it is given. An expression is python-hcl2's ``${...}`` string.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_VAR = re.compile(r"\bvar\.([A-Za-z_][\w-]*)")
_WHOLE = re.compile(r"^\$\{(.*)\}$", re.S)
_PROVIDER = re.compile(r"^\$?\{?aws\.([\w-]+)\}?$")


def parse_tf(text: str) -> dict[str, Any]:
    """A ``.tf`` file as python-hcl2 reads it (any layout Terraform accepts: one-line
    blocks, odd spacing, comments anywhere); an expression is its ``${...}`` string.

    Raises:
        ValueError: the text is not HCL.
    """
    # Here, not at the top: the design workflow imports keel.design.diff for the Change
    # Summary and never reads Terraform, so its worker need not load the HCL grammar.
    import hcl2
    from lark.exceptions import LarkError

    try:
        parsed: dict[str, Any] = hcl2.loads(text)
    except (LarkError, ValueError, TypeError) as exc:
        raise ValueError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    return parsed


def blocks(parsed: Mapping[str, Any], kind: str) -> list[tuple[str, str, dict[str, Any]]]:
    """The file's top-level blocks of ``kind`` as (first label, second label, body)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for block in parsed.get(kind, []):
        for first, inner in block.items():
            if kind == "resource":
                out += [(first, second, body) for second, body in inner.items()]
            else:
                out.append((first, "", inner))
    return out


def parent_dir(path: str) -> str:
    """The directory of a tree's path (``""`` at the top)."""
    return path.rsplit("/", 1)[0] if "/" in path else ""


def join_path(base: str, rel: str) -> str:
    """``rel`` (a module's ``source``) resolved against directory ``base``."""
    parts = [p for p in base.split("/") if p]
    for seg in rel.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
        else:
            parts.append(seg)
    return "/".join(parts)


def expression(value: Any) -> str:
    """An argument as it reads in an expression: ``${x}`` unwrapped, other data as JSON."""
    if isinstance(value, str):
        whole = _WHOLE.match(value)
        return whole.group(1) if whole else json.dumps(value)
    return json.dumps(value, sort_keys=True)


def substitute(value: Any, args: Mapping[str, Any]) -> Any:
    """``value`` with each ``var.x`` the instance passes replaced by its argument: a value
    that is only ``${var.x}`` becomes the argument itself, and ``var.x`` inside a longer
    expression becomes ``(<the argument>)``."""
    if isinstance(value, Mapping):
        return {k: substitute(v, args) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, args) for v in value]
    if not isinstance(value, str):
        return value
    whole = _WHOLE.match(value)
    if whole is not None:
        var = _VAR.fullmatch(whole.group(1).strip())
        if var is not None and var.group(1) in args:
            return args[var.group(1)]
    return _VAR.sub(
        lambda m: f"({expression(args[m.group(1)])})" if m.group(1) in args else m.group(0),
        value,
    )


def canonical_body(value: Any) -> str:
    """A resource's body as compared: its parsed arguments and blocks, canonical JSON."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def aws_alias(providers: Any) -> str | None:
    """The ``aws`` provider alias a module instance passes (``providers = { aws = aws.x }``)."""
    aws = providers.get("aws") if isinstance(providers, Mapping) else None
    found = _PROVIDER.match(aws.strip()) if isinstance(aws, str) else None
    return found.group(1) if found else None
