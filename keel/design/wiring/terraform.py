"""Terraform read with python-hcl2: modules, their instances, and the strings in them."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from keel.design.wiring.model import (
    _META_ARGS,
    _STRING,
    _VAR_ONLY,
    _VAR_REF,
    Block,
    Instance,
    TfModule,
    Variable,
)


def _dirname(path: str) -> str:
    return posixpath.dirname(path) or "."


def _join(base: str, rel: str) -> str:
    joined = posixpath.normpath(posixpath.join(base, rel))
    return "." if joined in ("", ".") else joined


def _unwrap(value: Any) -> Any:
    """python-hcl2 wraps blocks in one-element lists."""
    while isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
        value = value[0]
    return value


def parse_terraform(files: Mapping[str, str]) -> dict[str, TfModule]:
    """Every directory's Terraform (a file that does not parse is left out: the ``hcl``
    validator reports it)."""
    import hcl2

    modules: dict[str, TfModule] = {}
    for path in sorted(p for p in files if p.endswith(".tf")):
        try:
            doc = hcl2.loads(files[path])
        except Exception:  # lark raises several classes; the hcl validator names them
            continue
        mod = modules.setdefault(_dirname(path), TfModule(_dirname(path)))
        for block in doc.get("variable", []):
            for name, body in block.items():
                body = _unwrap(body) or {}
                mod.variables[name] = Variable(name, path, "default" in body, body.get("default"))
        for block in doc.get("module", []):
            for name, body in block.items():
                mod.modules.append(Block("module", name, _unwrap(body) or {}, path))
        for block in doc.get("resource", []):
            for kind, named in block.items():
                for name, body in named.items():
                    mod.resources.append(Block(kind, name, _unwrap(body) or {}, path))
        for block in doc.get("locals", []):
            if isinstance(block, dict):
                mod.locals.update(block)
        for block in doc.get("data", []):
            for kind, named in block.items():
                for name, body in named.items():
                    mod.data.append(Block(kind, name, _unwrap(body) or {}, path))
    return modules


def _callee(mod: TfModule, block: Block) -> str | None:
    source = block.body.get("source")
    if not isinstance(source, str) or not source.startswith(("./", "../")):
        return None
    return _join(mod.dir, source)


def _resolve(value: Any, args: Mapping[str, Any]) -> Any:
    """``value`` with each ``${var.x}`` whose argument is a plain string or number put in."""
    if isinstance(value, str):
        whole = _VAR_ONLY.match(value)
        if whole and whole.group(1) in args and not isinstance(args[whole.group(1)], str | int):
            return args[whole.group(1)]

        def put(m: re.Match[str]) -> str:
            got = args.get(m.group(1))
            if isinstance(got, bool) or not isinstance(got, str | int | float):
                return m.group(0)
            return str(got) if "${" not in str(got) else m.group(0)

        return _VAR_REF.sub(put, value)
    return value


def roots(modules: Mapping[str, TfModule]) -> list[str]:
    """Directories no module block calls: where ``terraform`` is run."""
    called = {c for m in modules.values() for b in m.modules if (c := _callee(m, b))}
    return sorted(d for d in modules if d not in called)


def instances(modules: Mapping[str, TfModule]) -> list[Instance]:
    """Every root and every module instance under it (depth-first, at most 8 deep)."""
    out: list[Instance] = []

    def walk(inst: Instance, depth: int) -> None:
        out.append(inst)
        if depth >= 8:
            return
        for block in inst.module.modules:
            callee = _callee(inst.module, block)
            if callee is None or callee not in modules:
                continue
            args = {k: _resolve(v, inst.args) for k, v in block.body.items() if k not in _META_ARGS}
            walk(Instance(modules[callee], inst.root, args, block), depth + 1)

    for root in roots(modules):
        walk(Instance(modules[root], root, {}, None), 0)
    return out


def _strings(value: Any) -> Iterator[tuple[str, str]]:
    """Every (key, string value) pair in a parsed body, at any depth."""
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, str):
                yield str(k), v
            else:
                yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            if isinstance(v, str):
                yield "", v
            else:
                yield from _strings(v)


def _all_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return "\n".join(v for _, v in _strings(value))


def _balanced(text: str, start: int) -> str:
    """The bracketed text that opens at ``text[start]``, strings skipped over."""
    pairs = {"{": "}", "[": "]", "(": ")"}
    stack: list[str] = []
    i, quoted = start, False
    while i < len(text):
        ch = text[i]
        if quoted:
            if ch == "\\":
                i += 1
            elif ch == '"':
                quoted = False
        elif ch == '"':
            quoted = True
        elif ch in pairs:
            stack.append(pairs[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return text[start : i + 1]
        i += 1
    return text[start:]


def _json_values(text: str, keys: Iterable[str]) -> list[tuple[str, str]]:
    """``"key": "value"`` pairs inside an encoded (``jsonencode``) expression."""
    names = "|".join(re.escape(k) for k in keys)
    return [(m.group(1), m.group(2)) for m in re.finditer(rf'"({names})"\s*:\s*{_STRING}', text)]


def _json_objects(text: str, key: str) -> list[str]:
    """The bracketed value of each ``"key": {...}`` / ``"key": [...]`` in ``text``."""
    out = []
    for m in re.finditer(rf'"{re.escape(key)}"\s*:\s*([\[{{])', text):
        out.append(_balanced(text, m.start(1)))
    return out
