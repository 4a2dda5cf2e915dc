"""A task's tests: Python checks the jail runs on the file after each action.

A test (:class:`TaskTest`) is Python source run as a script in the jail with two globals
bound: ``SOURCE``, the text of the task's file after the action, and ``FILE``, its name.
It passes when it runs to the end and fails when it raises (an ``assert``, a
``SyntaxError`` …). ``srl.apply`` runs a task's tests after every well-formed action
(activities/srl/checks.py) and scores the fraction that passed (``tests_passed`` in
:class:`keel.srl.rewards.Reward`); a task without tests has ``tests_passed`` ``None``.

The synthetic Python templates (:mod:`keel.srl.synth`) get generated checks
(:func:`synth_tests`) that hold on the task's pre- *and* post-text: they state what the
refactoring keeps (the file compiles; the calls it touches are all still there, with the
same arguments; a renamed name is used consistently), so the gold action passes them and
an action that breaks the code (renames only the definition, deletes a call) fails. They
are static checks (``ast``, ``tokenize``) of the file's text, not runs of the file: the
synthetic tasks' files are real library modules, whose import would run their
dependencies and module-level side effects. Pure: the checks are evaluated here (on the
pre- and post-text, when a task is made) by executing this module's own constant
:data:`CHECK_LIBRARY`, never a file's code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: At most this many tests per task, each at most ``MAX_TEST_CHARS`` characters.
MAX_TESTS: Final = 8
MAX_TEST_CHARS: Final = 20_000
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class TaskTest(BaseModel):
    """One test of a task: a name, its language (Python: the jail's interpreter runs it)
    and its source. The source must compile (checked when the task is made)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64)
    language: Literal["python"] = "python"
    source: str = Field(min_length=1, max_length=MAX_TEST_CHARS)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(f"test name {value!r}: use 1-64 of [A-Za-z0-9_.-]")
        return value

    @field_validator("source")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            compile(value, "<test>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
            raise ValueError(f"test source does not compile as Python: {e}") from None
        return value


def check_tests(tests: Sequence[TaskTest]) -> None:
    """A task's tests: at most :data:`MAX_TESTS`, names unique (``ValueError`` otherwise)."""
    if len(tests) > MAX_TESTS:
        raise ValueError(f"{len(tests)} tests: a task has at most {MAX_TESTS}")
    names = [t.name for t in tests]
    if len(set(names)) != len(names):
        raise ValueError(f"test names repeat: {names}")


#: The functions the generated checks call, prepended to each check's source (so a test
#: is self-contained in the jail). Plain syntax, stdlib only: it runs under the jail's
#: interpreter. Each returns a JSON-like value a check compares with the one its task's
#: pre-text gave.
CHECK_LIBRARY: Final = '''\
import ast
import io
import re
import tokenize


_TREES = {}


def _parse(source):
    # The host evaluates several checks on the same pre- and post-text, and a file's
    # templates share its pre-text: parse each once (the 8 most recently used kept).
    tree = _TREES.pop(source, None)
    if tree is None:
        tree = ast.parse(source)
        if len(_TREES) >= 8:
            del _TREES[next(iter(_TREES))]  # the least recently used
    _TREES[source] = tree
    return tree


_LINES = {}


def _text(source, node):
    # ast.get_source_segment, with the line starts (UTF-8 byte offsets) found once.
    found = _LINES.get(source)
    if found is None:
        if len(_LINES) >= 4:
            _LINES.clear()
        data = source.encode("utf-8")
        starts = [0] + [m.end() for m in re.finditer(b"\\r\\n|\\r|\\n", data)]
        found = _LINES[source] = (data, starts)
    data, starts = found
    start = starts[node.lineno - 1] + node.col_offset
    end = starts[node.end_lineno - 1] + node.end_col_offset
    return " ".join(data[start:end].decode("utf-8", "replace").split())


def _callee(func):
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        inner = _callee(func.value)
        return func.attr if inner is None else inner + "." + func.attr
    return None


_CALLS = {}


def _call_nodes(source):
    # Every call of the text with its callee, in ast.walk order, found once: the host
    # evaluates a calls check per template on the same text (a walk of a large module
    # each time was most of synthesising a task).
    found = _CALLS.pop(source, None)
    if found is None:
        found = [
            (_callee(node.func), node)
            for node in ast.walk(_parse(source))
            if isinstance(node, ast.Call)
        ]
        if len(_CALLS) >= 8:
            del _CALLS[next(iter(_CALLS))]  # the least recently used
    _CALLS[source] = found
    return found


def calls(source, names, none_default=False):
    """The calls whose callee is one of names (or ends in .name), by their arguments
    (sorted texts; with none_default, a second positional argument None is dropped)."""
    found = {}
    for callee, node in _call_nodes(source):
        if callee is None or not any(callee == n or callee.endswith("." + n) for n in names):
            continue
        args = list(node.args)
        if none_default and len(args) == 2 and isinstance(args[1], ast.Constant):
            if args[1].value is None:
                args = args[:1]
        texts = [_text(source, a) for a in args]
        texts += [(k.arg or "**") + "=" + _text(source, k.value) for k in node.keywords]
        key = " | ".join(sorted(texts))
        found[key] = found.get(key, 0) + 1
    return found


def names(source, old, new):
    """How many NAME tokens are old or new, and how many of the two occur."""
    seen = [
        t.string
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.NAME and t.string in (old, new)
    ]
    return {"count": len(seen), "distinct": len(set(seen))}


def none_comparisons(source):
    """The comparisons with None, by operand and sense (== and is, != and is not alike)."""
    found = {}
    for node in ast.walk(_parse(source)):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
            continue
        right = node.comparators[0]
        if not (isinstance(right, ast.Constant) and right.value is None):
            continue
        if isinstance(node.ops[0], (ast.Eq, ast.Is)):
            key = _text(source, node.left) + " is None"
        elif isinstance(node.ops[0], (ast.NotEq, ast.IsNot)):
            key = _text(source, node.left) + " is not None"
        else:
            continue
        found[key] = found.get(key, 0) + 1
    return found


def compiles(source, file):
    compile(source, file, "exec", dont_inherit=True)
    return True
'''

# The library's functions, here: our own constant, never a file's code.
_LIBRARY_SCOPE: dict[str, Any] = {"__name__": "keel_srl_checks"}
exec(compile(CHECK_LIBRARY, "<keel.srl.checks>", "exec"), _LIBRARY_SCOPE)

#: A check: the library function, its keyword arguments (JSON-like, after ``SOURCE``).
Check = tuple[str, dict[str, Any]]
#: What each check says when it fails.
_WHAT: Final[dict[str, str]] = {
    "calls": "the calls the task touches, with their arguments, are all still there",
    "names": "the renamed name is used everywhere, the old one nowhere",
    "none_comparisons": "every comparison with None is still there, in the same sense",
}


def evaluate(function: str, source: str, params: dict[str, Any]) -> Any:
    """``function(source, **params)`` of :data:`CHECK_LIBRARY`, as the jail runs it."""
    return _LIBRARY_SCOPE[function](source, **params)


def _holds(function: str, params: dict[str, Any], texts: Sequence[str]) -> Any:
    """The value ``function`` gives on every one of ``texts`` (``None``: they differ or a
    text does not parse or tokenize)."""
    try:
        values = [evaluate(function, t, params) for t in texts]
    except Exception:  # SyntaxError, tokenize.TokenError, RecursionError …: not on both
        return None
    return values[0] if all(v == values[0] for v in values) else None


def check_test(function: str, params: dict[str, Any], expected: Any) -> TaskTest | None:
    """The test that ``function(SOURCE, **params) == expected``; ``None`` when its source
    would be over :data:`MAX_TEST_CHARS` (a function called very often)."""
    source = (
        CHECK_LIBRARY
        + f"\n\nexpected = {expected!r}\nfound = {function}(SOURCE, **{params!r})\n"
        + f"assert found == expected, {_WHAT.get(function, function)!r}\n"
    )
    if len(source) > MAX_TEST_CHARS:
        return None
    return TaskTest(name=f"{function}_kept", source=source)


COMPILES_TEST: Final = TaskTest(
    name="compiles",
    source=CHECK_LIBRARY + "\n\ncompiles(SOURCE, FILE)\n",
)


def synth_tests(checks: Sequence[Check], pre: str, post: str) -> list[TaskTest]:
    """The tests of a synthetic Python task: ``compiles`` and one per check of ``checks``
    whose value is the same, and not empty, on ``pre`` and ``post``; a check that does not
    hold on both is left out. No test when none holds (the caller's task has none)."""
    out: list[TaskTest] = []
    for function, params in checks:
        value = _holds(function, params, (pre, post))
        test = check_test(function, params, value) if value else None
        if test is not None:
            out.append(test)
    if not out or _holds("compiles", {"file": "file"}, (pre, post)) is None:
        return out
    return [COMPILES_TEST, *out]
