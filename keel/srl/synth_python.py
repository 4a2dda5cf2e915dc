"""The Python templates of :mod:`keel.srl.synth`: each picks a target with ``ast`` and
``tokenize``, writes the ast-grep action and the expected post-text, and refuses a file
it cannot be sure of."""

from __future__ import annotations

import ast
import functools
import io
import itertools
import keyword
import re
import tokenize
from collections.abc import Sequence

from keel.srl.errors import TemplateNotApplicable
from keel.srl.synth_task import SourceFile, SynthTask, _apply, _pick, _task


@functools.lru_cache(maxsize=4)
def _parsed(text: str) -> _Py:
    # Every template parses the same file again; parsing is pure, so cache the last few.
    return _Py(text)


class _Py:
    """A parsed Python file with character offsets for AST positions (never mutated)."""

    def __init__(self, text: str) -> None:
        try:
            self.tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            raise TemplateNotApplicable("does not parse as Python") from None
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, lineno: int, col_bytes: int) -> int:
        # ast columns count UTF-8 bytes, string slicing counts characters.
        line = self.lines[lineno - 1]
        return self.starts[lineno - 1] + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))

    def span(self, node: ast.AST) -> tuple[int, int]:
        end_lineno = getattr(node, "end_lineno", None)
        end_col = getattr(node, "end_col_offset", None)
        if end_lineno is None or end_col is None:
            raise TemplateNotApplicable("node without an end position")
        return (
            self.offset(node.lineno, node.col_offset),  # type: ignore[attr-defined]
            self.offset(end_lineno, end_col),
        )

    def src(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.text[start:end]

    def single_line(self, node: ast.AST) -> bool:
        return getattr(node, "lineno", 0) == getattr(node, "end_lineno", -1)

    def calls(self) -> list[ast.Call]:
        return list(self._calls)

    @functools.cached_property
    def _calls(self) -> tuple[ast.Call, ...]:
        # Four templates ask for the same file's calls: walked once.
        return tuple(n for n in ast.walk(self.tree) if isinstance(n, ast.Call))


def _call_is_plain(py: _Py, call: ast.Call) -> bool:
    """A call ast-grep's ``f($$$ARGS)`` reproduces exactly: one line, no trailing comma,
    no bare generator argument (tree-sitter gives that no argument list)."""
    if not py.single_line(call):
        return False
    if any(isinstance(a, ast.GeneratorExp) for a in call.args) and len(call.args) == 1:
        return False
    args = [*call.args, *call.keywords]
    if args:
        _, last_end = py.span(args[-1])
        _, call_end = py.span(call)
        if "," in py.text[last_end:call_end]:
            return False
    return True


def _args_text(py: _Py, call: ast.Call) -> str:
    args = [*call.args, *call.keywords]
    if not args:
        return ""
    starts = [py.span(a)[0] for a in args]
    ends = [py.span(a)[1] for a in args]
    return py.text[min(starts) : max(ends)]


def _nested(py: _Py, nodes: Sequence[ast.expr]) -> bool:
    spans = sorted(py.span(n) for n in nodes)
    return any(b[0] < a[1] for a, b in itertools.pairwise(spans))


def _py_tokens(text: str) -> list[tokenize.TokenInfo]:
    try:
        return list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        raise TemplateNotApplicable("does not tokenize as Python") from None


_FSTRING_PREFIX = re.compile(r"^[rRbBuU]*[fF]")


# ---- Python templates ----------------------------------------------------------------


def py_rename(source: SourceFile, seed: int) -> SynthTask:
    """Rename a function defined in the file everywhere it is used.

    ast-grep's pattern ``old`` matches every ``identifier`` node, which in Python is every
    NAME token (definitions, calls, attributes, keyword arguments, imports), and no text
    inside strings or comments: the reference renames exactly the NAME tokens.
    """
    py = _parsed(source.text)
    tokens = _py_tokens(source.text)
    names = {t.string for t in tokens if t.type == tokenize.NAME}
    defs = {
        n.name
        for n in ast.walk(py.tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and not n.name.startswith("__")
        and len(n.name) >= 3
    }
    fstrings = [
        t.string for t in tokens if t.type == tokenize.STRING and _FSTRING_PREFIX.match(t.string)
    ]
    candidates = [
        d
        for d in defs
        if f"{d}_renamed" not in names and not any(re.search(rf"\b{d}\b", s) for s in fstrings)
    ]
    old = _pick(candidates, seed)
    new = f"{old}_renamed"
    # tokenize columns count characters (it reads str), unlike ast's byte columns.
    starts = [
        py.starts[t.start[0] - 1] + t.start[1]
        for t in tokens
        if t.type == tokenize.NAME and t.string == old
    ]
    edits = [(start, start + len(old), new) for start in starts]
    post = _apply(source.text, edits)
    return _task(
        source,
        "rename",
        seed,
        f"Rename the function `{old}` to `{new}`, its definition and every call; "
        "the old name is being retired.",
        old,
        new,
        post,
        [("names", {"old": old, "new": new}), ("calls", {"names": [old, new]})],
    )


def py_wrap_call(source: SourceFile, seed: int) -> SynthTask:
    """Wrap every call of a plain function ``f(...)`` in ``traced(f(...))``."""
    py = _parsed(source.text)
    by_name: dict[str, list[ast.Call]] = {}
    for call in py.calls():
        if isinstance(call.func, ast.Name) and not keyword.iskeyword(call.func.id):
            by_name.setdefault(call.func.id, []).append(call)
    candidates = [
        name
        for name, calls in by_name.items()
        if name != "traced" and all(_call_is_plain(py, c) for c in calls) and not _nested(py, calls)
    ]
    name = _pick(candidates, seed)
    edits = []
    for call in by_name[name]:
        start, end = py.span(call)
        edits.append((start, end, f"traced({name}({_args_text(py, call)}))"))
    return _task(
        source,
        "wrap_call",
        seed,
        f"Wrap every call of `{name}` in `traced(...)`, so that each call shows up in the traces.",
        f"{name}($$$ARGS)",
        f"traced({name}($$$ARGS))",
        _apply(source.text, edits),
        [("calls", {"names": [name]})],
    )


def py_add_guard(source: SourceFile, seed: int) -> SynthTask:
    """Guard a method-call statement ``obj.m(...)`` with ``if obj is not None:``.

    Only a call whose exact text appears nowhere but as whole one-line statements, since
    the pattern is that text and ast-grep would rewrite it wherever it appears.
    """
    py = _parsed(source.text)
    statements: dict[str, list[ast.Expr]] = {}
    for node in ast.walk(py.tree):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and isinstance(node.value.func.value, ast.Name)
            and node.value.func.value.id not in ("self", "cls")
            and _call_is_plain(py, node.value)
        ):
            start, end = py.span(node)
            line = py.lines[node.lineno - 1]
            if line.strip() == py.text[start:end]:
                statements.setdefault(py.text[start:end], []).append(node)
    all_calls: dict[str, int] = {}
    for call in py.calls():
        if py.single_line(call):
            text = py.src(call)
            all_calls[text] = all_calls.get(text, 0) + 1
    candidates = [text for text, nodes in statements.items() if all_calls.get(text) == len(nodes)]
    text = _pick(candidates, seed)
    receiver = statements[text][0].value.func.value.id  # type: ignore[attr-defined]
    method = statements[text][0].value.func.attr  # type: ignore[attr-defined]
    rewrite = f"if {receiver} is not None:\n    {text}"
    edits = []
    for node in statements[text]:
        start, end = py.span(node)
        line = py.lines[node.lineno - 1]
        indent = line[: len(line) - len(line.lstrip())]
        edits.append((start, end, rewrite.replace("\n", "\n" + indent)))
    return _task(
        source,
        "add_guard",
        seed,
        f"Only run `{text}` when `{receiver}` is not None, so that a missing `{receiver}` "
        "does not raise.",
        text,
        rewrite,
        _apply(source.text, edits),
        [("calls", {"names": [f"{receiver}.{method}"]})],
    )


# Old API -> new API; the new one takes the same positional arguments.
PY_API_REPLACEMENTS: dict[str, str] = {
    "time.time": "time.monotonic",
    "os.path.join": "posixpath.join",
    "copy.copy": "copy.deepcopy",
    "os.system": "subprocess.call",
    "os.getcwd": "os.getcwdb",
    "logging.warn": "logging.warning",
    "os.popen": "subprocess.getoutput",
}


def py_replace_api(source: SourceFile, seed: int) -> SynthTask:
    """Replace calls of an old module-level API with its replacement (:data:`PY_API_REPLACEMENTS`)."""
    py = _parsed(source.text)
    found: dict[str, list[ast.Call]] = {}
    for call in py.calls():
        if isinstance(call.func, ast.Attribute):
            dotted = ast.unparse(call.func)
            if dotted in PY_API_REPLACEMENTS and py.src(call.func) == dotted:
                found.setdefault(dotted, []).append(call)
    candidates = [
        old
        for old, calls in found.items()
        if all(_call_is_plain(py, c) for c in calls) and not _nested(py, calls)
    ]
    old = _pick(candidates, seed)
    new = PY_API_REPLACEMENTS[old]
    edits = []
    for call in found[old]:
        start, end = py.span(call)
        edits.append((start, end, f"{new}({_args_text(py, call)})"))
    return _task(
        source,
        "replace_api",
        seed,
        f"Replace every call of `{old}` with `{new}`; the code is moving over to `{new}`.",
        f"{old}($$$ARGS)",
        f"{new}($$$ARGS)",
        _apply(source.text, edits),
        [("calls", {"names": [old, new]})],
    )


def py_swap_arguments(source: SourceFile, seed: int) -> SynthTask:
    """Swap the arguments of every two-argument call of a plain function ``f(a, b)``."""
    py = _parsed(source.text)
    by_name: dict[str, list[ast.Call]] = {}
    for call in py.calls():
        if isinstance(call.func, ast.Name) and len(call.args) + len(call.keywords) == 2:
            by_name.setdefault(call.func.id, []).append(call)
    candidates = [
        name
        for name, calls in by_name.items()
        if all(
            len(c.args) == 2
            and not any(isinstance(a, ast.Starred | ast.GeneratorExp) for a in c.args)
            and _call_is_plain(py, c)
            for c in calls
        )
        and not _nested(py, calls)
    ]
    name = _pick(candidates, seed)
    edits = []
    for call in by_name[name]:
        start, end = py.span(call)
        a, b = (py.src(arg) for arg in call.args)
        edits.append((start, end, f"{name}({b}, {a})"))
    return _task(
        source,
        "swap_arguments",
        seed,
        f"Swap the two arguments of every two-argument call of `{name}`: its parameters "
        "now come the other way round.",
        f"{name}($A, $B)",
        f"{name}($B, $A)",
        _apply(source.text, edits),
        [("calls", {"names": [name]})],
    )


def py_none_comparison(source: SourceFile, seed: int) -> SynthTask:
    """``x == None`` becomes ``x is None`` (or ``!=`` becomes ``is not``), the PEP 8 form."""
    py = _parsed(source.text)
    found: dict[str, list[ast.Compare]] = {"==": [], "!=": []}
    for node in ast.walk(py.tree):
        if (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.Eq | ast.NotEq)
            and isinstance(node.comparators[0], ast.Constant)
            and node.comparators[0].value is None
            and py.single_line(node)
        ):
            op = "==" if isinstance(node.ops[0], ast.Eq) else "!="
            if py.src(node) == f"{py.src(node.left)} {op} None":
                found[op].append(node)
            else:
                # Odd spacing: ast-grep would still match it, the reference would not.
                raise TemplateNotApplicable("a None comparison with unusual spacing")
    op = _pick([o for o, nodes in found.items() if nodes and not _nested(py, nodes)], seed)
    new = "is" if op == "==" else "is not"
    edits = []
    for node in found[op]:
        start, end = py.span(node)
        edits.append((start, end, f"{py.src(node.left)} {new} None"))
    return _task(
        source,
        "none_comparison",
        seed,
        f"Compare with None using `{new}` instead of `{op}`: None is a singleton, so compare "
        "it by identity (PEP 8).",
        f"$X {op} None",
        f"$X {new} None",
        _apply(source.text, edits),
        [("none_comparisons", {})],
    )


def py_dict_get_default(source: SourceFile, seed: int) -> SynthTask:
    """``d.get(k, None)`` becomes ``d.get(k)``: ``None`` is already the default."""
    py = _parsed(source.text)
    calls = [
        c
        for c in py.calls()
        if isinstance(c.func, ast.Attribute)
        and c.func.attr == "get"
        and len(c.args) == 2
        and not c.keywords
        and isinstance(c.args[1], ast.Constant)
        and c.args[1].value is None
        and not isinstance(c.args[0], ast.Starred)
    ]
    if not calls or not all(_call_is_plain(py, c) for c in calls) or _nested(py, calls):
        raise TemplateNotApplicable("no plain d.get(k, None) call")
    edits = []
    for call in calls:
        start, end = py.span(call)
        func = call.func
        assert isinstance(func, ast.Attribute)
        if py.src(call) != f"{py.src(func.value)}.get({py.src(call.args[0])}, None)":
            raise TemplateNotApplicable("a d.get(k, None) call with unusual spacing")
        edits.append((start, end, f"{py.src(func.value)}.get({py.src(call.args[0])})"))
    return _task(
        source,
        "dict_get_default",
        seed,
        "Drop the redundant `None` default from `.get(key, None)` calls: `None` is already "
        "what `.get` returns for a missing key.",
        "$D.get($K, None)",
        "$D.get($K)",
        _apply(source.text, edits),
        [("calls", {"names": ["get"], "none_default": True})],
    )
