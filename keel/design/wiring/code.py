"""Python code and Dockerfiles: environment reads, imports, metrics, images and entry points."""

from __future__ import annotations

import ast
import functools
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from keel.design.wiring.commands import logical_lines
from keel.design.wiring.terraform import _join


@dataclass(frozen=True)
class EnvRead:
    """An environment variable the code reads."""

    name: str
    file: str
    line: int
    default: str  # "none", or a description of the default
    accepted: bool  # the default works deployed


def default_works_deployed(node: ast.expr | None) -> tuple[str, bool]:
    """Whether an environment variable's default works where the code is deployed.

    Accepted: ``None`` (the code handles the variable's absence), a number or a bool, and
    a named constant of the code (``MIN_AUC``: the plan's value, the same wherever it
    runs). Not accepted: no default, and a string literal (a path such as ``"data"``, a
    host or a URL works on a developer's machine, not in a task, function or job), or any
    other expression (``REGIONS[0]`` is right in one region of several).
    """
    if node is None:
        return "none", False
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, bool | int | float):
            return repr(node.value), True
        return repr(node.value), False
    if isinstance(node, ast.Name | ast.Attribute):
        return ast.unparse(node), True
    return ast.unparse(node), False


def _is_environ(node: ast.AST, aliases: set[str]) -> bool:
    if isinstance(node, ast.Attribute) and node.attr == "environ":
        return isinstance(node.value, ast.Name) and node.value.id == "os"
    return isinstance(node, ast.Name) and (node.id in aliases or node.id == "environ")


@functools.lru_cache(maxsize=128)
def _parsed(text: str) -> ast.Module | None:
    """``text`` parsed, or None when it is not Python. Cached: the checks read one file
    once per runtime, image and entry point that imports it (the trees are only read).
    128: about one generated repository's Python files; a tree is far larger than its
    text, and a long-lived worker keeps this cache."""
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def env_reads(path: str, text: str) -> list[EnvRead]:
    """The environment variables ``text`` (a Python file) reads, with their defaults."""
    return list(_env_reads(path, text))


@functools.lru_cache(maxsize=1024)
def _env_reads(path: str, text: str) -> tuple[EnvRead, ...]:
    tree = _parsed(text)
    if tree is None:
        return ()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            _is_environ(n, set()) for n in ast.walk(node.value)
        ):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    reads: list[EnvRead] = []

    def add(key: ast.expr, default: ast.expr | None, line: int) -> None:
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            text_, ok = default_works_deployed(default)
            reads.append(EnvRead(key.value, path, line, text_, ok))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            default = node.args[1] if len(node.args) > 1 else None
            if default is None:
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(func, ast.Attribute) and (
                func.attr == "getenv" or (func.attr == "get" and _is_environ(func.value, aliases))
            ):
                add(node.args[0], default, node.lineno)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and _is_environ(node.value, aliases)
        ):
            add(node.slice, None, node.lineno)
        elif isinstance(node, ast.ClassDef) and any(
            (isinstance(b, ast.Name) and b.id == "BaseSettings")
            or (isinstance(b, ast.Attribute) and b.attr == "BaseSettings")
            for b in node.bases
        ):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if stmt.target.id == "model_config":
                        continue
                    text_, ok = default_works_deployed(stmt.value)
                    reads.append(EnvRead(stmt.target.id.upper(), path, stmt.lineno, text_, ok))
    return tuple(reads)


def demanded(path: str, text: str) -> dict[str, int]:
    """The environment variable names the code demands: each name (``UPPER_CASE``, as a
    whole word) in the message of a ``raise`` statement of ``text``, with its line. A
    variable read with the default ``None`` is accepted (the code handles its absence)
    unless the code raises naming it: ``raise RuntimeError("set MLFLOW_TRACKING_URI: the
    store is not local")`` says its absence fails where it is deployed."""
    return dict(_demanded(path, text))


@functools.lru_cache(maxsize=1024)
def _demanded(path: str, text: str) -> tuple[tuple[str, int], ...]:
    tree = _parsed(text)
    if tree is None:
        return ()
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Raise) or node.exc is None:
            continue
        for sub in ast.walk(node.exc):
            if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                for name in re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", sub.value):
                    found.setdefault(name, node.lineno)
    return tuple(sorted(found.items()))


def module_file(files: Mapping[str, str], module: str, base: str = ".") -> str | None:
    """The repository file of a dotted module name under ``base`` (None: none)."""
    rel = module.replace(".", "/")
    for cand in (f"{rel}.py", f"{rel}/__init__.py"):
        path = _join(base, cand)
        if path in files:
            return path
    return None


def import_closure(files: Mapping[str, str], start: Iterable[str]) -> list[str]:
    """The repository's Python files ``start`` (files) imports, transitively, with the
    packages' ``__init__`` files (an import string such as ``"pkg.app:app"`` counts)."""
    seen: set[str] = set()
    pending = list(start)
    while pending:
        path = pending.pop()
        if path in seen or path not in files:
            continue
        seen.add(path)
        parts = path.split("/")
        for i in range(1, len(parts)):
            init = "/".join(parts[:i]) + "/__init__.py"
            if init in files:
                pending.append(init)
        for name in _imported_names(path, files[path]):
            found = module_file(files, name)
            if found is not None:
                pending.append(found)
    return sorted(seen)


@functools.lru_cache(maxsize=1024)
def _imported_names(path: str, text: str) -> tuple[str, ...]:
    """The dotted names a file at ``path`` imports (relative imports resolved; an import
    string such as ``uvicorn.run("pkg.app:app")`` counts), in the order found."""
    tree = _parsed(text)
    if tree is None:
        return ()
    package = ".".join(path.split("/")[:-1])
    out: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            out.extend([base, *(f"{base}.{a.name}" for a in node.names)])
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", node.value)
        ):
            # An import string (``uvicorn.run("pkg.app:app")``) starts that module.
            out.append(node.value.split(":", 1)[0])
    return tuple(out)


def defines(text: str, name: str) -> bool:
    """Whether a Python file defines ``name`` at its top level."""
    tree = _parsed(text)
    if tree is None:
        return False
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign):
            if any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
                return True
        elif isinstance(node, ast.ImportFrom | ast.Import) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return True
    return False


@dataclass(frozen=True)
class Metric:
    """A custom metric the code puts."""

    namespace: str  # a regular expression (f-string parts are wildcards)
    name: str
    dimensions: frozenset[str]
    file: str


def _pattern(node: ast.expr) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.escape(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+" for v in node.values
        )
    return None


def code_metrics(path: str, text: str) -> list[Metric]:
    """Metrics a file puts with ``put_metric_data`` (namespace, each datum's name and
    dimension names, from the literals in the file)."""
    tree = _parsed(text)
    if tree is None:
        return []
    namespaces = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "put_metric_data"
        ):
            for kw in node.keywords:
                if kw.arg == "Namespace" and (p := _pattern(kw.value)) is not None:
                    namespaces.append(p)
    if not namespaces:
        return []
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        items = {
            k.value: v
            for k, v in zip(node.keys, node.values, strict=True)
            if isinstance(k, ast.Constant) and isinstance(k.value, str)
        }
        name = items.get("MetricName")
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        dims: set[str] = set()
        for sub in ast.walk(items["Dimensions"]) if "Dimensions" in items else ():
            if isinstance(sub, ast.Dict):
                for k, v in zip(sub.keys, sub.values, strict=True):
                    if isinstance(k, ast.Constant) and k.value == "Name":
                        dims.add(str(v.value) if isinstance(v, ast.Constant) else "?")
        for ns in namespaces:
            out.append(Metric(ns, name.value, frozenset(map(str, dims)), path))
    return out


@dataclass(frozen=True)
class Image:
    """What a Dockerfile runs: its argv (ENTRYPOINT then CMD) and the variables it sets."""

    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: frozenset[str]
    lambda_base: bool


def _instruction_args(rest: str) -> tuple[str, ...]:
    """A Dockerfile instruction's arguments: its JSON (exec) form, else the shell form."""
    rest = rest.strip()
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except ValueError:
            return ()
        return tuple(str(v) for v in value) if isinstance(value, list) else ()
    return ("sh", "-c", rest) if rest else ()


def parse_dockerfile(text: str) -> Image:
    entry: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: set[str] = set()
    lambda_base = False
    for line in logical_lines(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        word, _, rest = stripped.partition(" ")
        word = word.upper()
        if word == "FROM":
            lambda_base = "lambda/python" in rest or "lambda/provided" in rest
        elif word == "ENTRYPOINT":
            entry = _instruction_args(rest)
        elif word == "CMD":
            cmd = _instruction_args(rest)
        elif word == "ENV":
            for m in re.finditer(r"(?:^|\s)([A-Za-z_]\w*)(?:=|\s)", rest):
                env.add(m.group(1))
                if "=" not in rest:
                    break
    return Image(entry, cmd, frozenset(env), lambda_base)


def entry_modules(
    files: Mapping[str, str], argv: tuple[str, ...], lambda_base: bool = False
) -> list[str]:
    """The repository files an argv starts (``python -m pkg``, ``python file.py``,
    ``uvicorn pkg.mod:app``, a Lambda base image's ``pkg.mod.handler``)."""
    out: list[str] = []
    for i, tok in enumerate(argv):
        if tok == "-m" and i + 1 < len(argv):
            found = module_file(files, argv[i + 1])
            main = module_file(files, argv[i + 1] + ".__main__")
            out += [p for p in (found, main) if p]
        elif tok.endswith(".py") and tok in files:
            out.append(tok)
        elif ":" in tok and not tok.startswith("-"):
            found = module_file(files, tok.split(":", 1)[0])
            if found:
                out.append(found)
    if lambda_base and len(argv) == 1 and "." in argv[0]:
        found = module_file(files, argv[0].rsplit(".", 1)[0])
        if found:
            out.append(found)
    return out
