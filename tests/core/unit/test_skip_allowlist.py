"""The skip allow-list (tests/support/skips.py, tests/skip_allowlist.toml): a skip, xfail
or xpass that no entry allows fails the run and is named with its reason; an allowed one
passes and its entry is printed; under pytest-xdist each skip counts once. Each case is a
pytest run of its own (pytester) with an allow-list file of its own."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.skips import DEFAULT_ALLOWLIST, load

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parents[3]

TESTS = """
import pytest


def test_passes():
    pass


def test_skipped():
    pytest.skip("no frobnicator on this host")


@pytest.mark.parametrize("case", ["a", "b"])
def test_param(case):
    if case == "b":
        pytest.skip("b has nothing to check")
"""


@pytest.fixture(autouse=True)
def bare_pytest(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs load only the plugins they name (the installed ones take seconds each)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")


def run(pytester: pytest.Pytester, allowlist: str, *args: str) -> pytest.RunResult:
    path = pytester.path / "allow.toml"
    path.write_text(allowlist)
    return pytester.runpytest("-p", "tests.support.skips", f"--skip-allowlist={path}", *args)


def entry(test: str, reason: str = "a reason", message: str | None = None) -> str:
    text = f'[[allow]]\ntest = "{test}"\nreason = "{reason}"\n'
    return text + (f'message = "{message}"\n' if message is not None else "")


def test_an_unlisted_skip_fails_the_run_and_is_named(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS)
    result = run(pytester, entry("test_x.py::test_param[b]", "b is the odd one"))
    result.assert_outcomes(passed=2, skipped=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*skips NOT in the allow-list: the run fails*",
            "SKIPPED test_x.py::test_skipped: no frobnicator on this host",
            "*2 passed, 2 skipped, 1 not allow-listed*",
        ]
    )
    # The listed case is allowed (an entry's brackets are literal, not a character class).
    result.stdout.no_fnmatch_line("SKIPPED test_x.py::test_param*")


def test_listed_skips_pass_and_their_entries_are_printed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS)
    allow = entry("test_x.py::test_skipped", "the frobnicator is optional") + entry(
        "test_x.py::test_param[b]", "b has nothing to check"
    )
    result = run(pytester, allow)
    result.assert_outcomes(passed=2, skipped=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "*skips the allow-list allows*",
            "test_x.py::test_skipped: 1 skipped: the frobnicator is optional",
            "test_x.py::test_param[[]b[]]: 1 skipped: b has nothing to check",
        ]
    )
    result.stdout.no_fnmatch_line("*NOT in the allow-list*")


def test_a_pattern_allows_every_test_it_matches(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS)
    result = run(pytester, entry("test_x.py::*", "all of them"))
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["test_x.py::*: 2 skipped: all of them"])


def test_an_entry_with_a_message_allows_only_that_skip(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS)
    allow = entry("test_x.py::*", "frobnicator", message="no frobnicator *")
    result = run(pytester, allow)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["SKIPPED test_x.py::test_param[[]b[]]: b has nothing to check"])
    result.stdout.no_fnmatch_line("SKIPPED test_x.py::test_skipped*")


def test_xfail_xpass_and_a_skipped_module_count_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_x="""
        import pytest

        @pytest.mark.xfail(reason="known bug")
        def test_xfails():
            assert False

        @pytest.mark.xfail(reason="fixed?")
        def test_xpasses():
            pass
        """,
        test_gone="""
        import pytest

        pytest.importorskip("no_such_module_here")
        """,
    )
    result = run(pytester, "")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random(
        [
            "XFAILED test_x.py::test_xfails: known bug",
            "XPASSED test_x.py::test_xpasses: fixed?",
            "SKIPPED test_gone.py: could not import 'no_such_module_here'*",
        ]
    )
    allow = entry("test_x.py::*", "the bug") + entry("test_gone.py", "optional module")
    assert run(pytester, allow).ret == pytest.ExitCode.OK


def test_a_failing_run_keeps_its_own_exit_status(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS + "\n\ndef test_fails():\n    assert False\n")
    result = run(pytester, "")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["*1 failed, 2 passed, 2 skipped, 2 not allow-listed*"])


def test_an_entry_without_a_reason_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_x=TESTS)
    result = run(pytester, '[[allow]]\ntest = "test_x.py::test_skipped"\n')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*entry 1 (test_x.py::test_skipped) needs a reason*"])


def test_under_xdist_each_skip_counts_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers report to the controller, which judges; the workers do not."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    pytester.makepyfile(test_x=TESTS, test_y=TESTS)
    path = pytester.path / "allow.toml"
    path.write_text(entry("test_y.py::*", "y may skip"))
    result = pytester.runpytest_subprocess(
        "-p", "xdist.plugin", "-p", "tests.support.skips", f"--skip-allowlist={path}",
        "-n", "2", "--dist", "loadfile",
    )  # fmt: skip
    result.assert_outcomes(passed=4, skipped=4)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "test_y.py::*: 2 skipped: y may skip",
            "*skips NOT in the allow-list*",
            "*4 passed, 4 skipped, 2 not allow-listed*",
        ]
    )
    assert result.stdout.str().count("SKIPPED test_x.py::test_skipped: no frob") == 1


def test_the_allow_list_of_the_suite_is_valid_and_explains_each_entry() -> None:
    entries = load(DEFAULT_ALLOWLIST)
    assert entries, "tests/skip_allowlist.toml is missing"
    for e in entries:
        assert len(e.reason) > 20, e
        file = e.test.split("::", 1)[0]
        assert "*" not in file and (REPO / file).is_file(), f"no such test file: {e.test}"
