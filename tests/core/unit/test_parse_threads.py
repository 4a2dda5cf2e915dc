"""CPython before 3.13 keeps ``ast.parse``'s recursion count in interpreter-wide state
(cpython gh-106905): two threads parsing at once raise SystemError "AST constructor
recursion depth mismatch" when a switch lands inside one parse (garbage collection running
a finalizer is enough). Keel's own parses go one at a time with the garbage collector
paused (``activities.srl.data.uninterrupted``); tests/conftest.py wraps the test
process's ``ast.parse`` (pytest's assertion rewriting included) the same way."""

from __future__ import annotations

import ast
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from activities.srl.data import python_syntax_error

#: A real file of a few hundred lines: long enough for a thread switch inside one parse.
SOURCE = Path(threading.__file__).read_text()


class _Cycle:
    """Garbage in a reference cycle with a finalizer that parses (as a finalizer that
    formats a traceback does): the collector runs it, and may switch threads, in the
    middle of whatever allocates next."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        ast.parse("x = (1, [2, {3: 4}])")


def _race(parse: Callable[[str], object], threads: int = 3, rounds: int = 20) -> Counter[str]:
    errors: Counter[str] = Counter()

    def work() -> None:
        for _ in range(rounds):
            for _ in range(5):
                _Cycle()
            try:
                parse(SOURCE)
            except Exception as e:  # the assertion below names what was raised
                errors[f"{type(e).__name__}: {e}"[:80]] += 1

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    finally:
        sys.setswitchinterval(old)
    return errors


def test_keel_parses_python_from_many_threads_at_once() -> None:
    assert python_syntax_error(SOURCE) is None
    assert _race(python_syntax_error) == Counter()


def test_the_test_process_parses_from_many_threads_at_once() -> None:
    assert _race(ast.parse) == Counter()


def test_a_syntax_error_is_named() -> None:
    assert python_syntax_error("def f(:\n") == "SyntaxError: invalid syntax (<unknown>, line 1)"
