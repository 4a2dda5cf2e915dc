"""Skips are visible and never silently green: a pytest plugin (registered in
tests/conftest.py) that fails a run in which a test was skipped, xfailed or xpassed
without an entry of the allow-list saying it may be.

The allow-list is ``tests/skip_allowlist.toml`` (``--skip-allowlist=PATH`` reads another
file). Each entry is an ``[[allow]]`` table with:

``test``
    the node id of the test (``tests/x/test_y.py::test_z[param]``), or a pattern of node
    ids where ``*`` stands for any text (``[`` and ``]`` are plain characters here); a
    skip at collection (a module-level ``pytest.importorskip``) has the file's path;
``reason``
    why that test may be skipped on CI's machine (a 2-core x86 Linux box, as root, with
    no GPU and no network but the package registries, and everything scripts/test.sh
    installs): something that really can be missing there, not a way to quiet a failure;
``message`` (optional)
    a pattern (``*`` as above) that the skip's own reason must match: the entry then
    allows that skip only, not any other skip of the same test.

At the end of the run the plugin prints each entry that allowed a skip, and, if any skip,
xfail or xpass matched no entry, lists each with its reason and sets the exit status to 1
(tests failed), whatever else passed; the closing line counts them as "not allow-listed".
pytest's ``-ra`` (pyproject.toml) still lists every skip with its reason.

A test with nothing to check under some parameter leaves that parameter out of its
parametrisation instead of skipping it; a test body never ``return``s early before its
assertions (a property test uses ``hypothesis.assume`` or a narrower strategy).

Under pytest-xdist the controller sees every worker's reports (``pytest_runtest_logreport``,
and ``pytest_collectreport`` for a skipped collection): the plugin counts and decides
there, and does nothing on the workers, so each skip counts once.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

DEFAULT_ALLOWLIST = Path(__file__).resolve().parents[1] / "skip_allowlist.toml"
#: The word the closing line counts unallowed skips under ("1 passed, 1 skipped, 1 not
#: allow-listed").
STAT = "not allow-listed"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--skip-allowlist",
        default=str(DEFAULT_ALLOWLIST),
        help="the skips a run may have (tests/support/skips.py); any other skip fails it",
    )


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller decides
        return
    path = Path(config.getoption("--skip-allowlist"))
    config.pluginmanager.register(SkipAllowList(load(path)), "keel-skip-allowlist")


def glob(pattern: str) -> re.Pattern[str]:
    """``*`` matches any text; everything else is literal (node ids have brackets)."""
    return re.compile(".*".join(re.escape(part) for part in pattern.split("*")), re.S)


@dataclass
class Entry:
    test: str
    reason: str
    message: str | None = None
    used: list[str] = field(default_factory=list)

    def allows(self, nodeid: str, why: str) -> bool:
        if not glob(self.test).fullmatch(nodeid):
            return False
        return self.message is None or glob(self.message).fullmatch(why) is not None


def load(path: Path) -> list[Entry]:
    """The entries of an allow-list file; a missing file allows nothing."""
    if not path.exists():
        return []
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise pytest.UsageError(f"{path}: {err}") from err
    entries = []
    for i, raw in enumerate(data.pop("allow", [])):
        unknown = set(raw) - {"test", "reason", "message"}
        test, reason = raw.get("test"), raw.get("reason")
        if unknown or not isinstance(test, str) or not test:
            raise pytest.UsageError(
                f"{path}: entry {i + 1} needs a test (a node id or pattern), a reason and "
                f"at most a message; it has {sorted(raw)}"
            )
        if not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(f"{path}: entry {i + 1} ({test}) needs a reason")
        message = raw.get("message")
        if message is not None and not isinstance(message, str):
            raise pytest.UsageError(f"{path}: entry {i + 1} ({test}): message is not text")
        entries.append(Entry(test, reason.strip(), message))
    if data:
        raise pytest.UsageError(f"{path}: unknown keys {sorted(data)} (only [[allow]] tables)")
    return entries


@dataclass
class Skip:
    nodeid: str
    kind: str  # "skipped", "xfailed" or "xpassed"
    why: str


def skip_of(report: pytest.TestReport | pytest.CollectReport) -> Skip | None:
    """What ``report`` says was not run as a test that passed or failed, if it does."""
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        kind = "xfailed" if report.skipped else "xpassed" if report.passed else ""
        return Skip(report.nodeid, kind, str(wasxfail).removeprefix("reason: ")) if kind else None
    if not report.skipped:
        return None
    longrepr: Any = report.longrepr  # (file, line, reason) for a skip
    tuple3 = isinstance(longrepr, tuple) and len(longrepr) == 3
    why = str(longrepr[2] if tuple3 else longrepr)
    return Skip(report.nodeid, "skipped", why.removeprefix("Skipped: "))


class SkipAllowList:
    """Collects every skip of the run and judges them at its end (one per session)."""

    def __init__(self, entries: list[Entry]) -> None:
        self.entries = entries
        self.skips: dict[str, Skip] = {}
        self.unallowed: list[Skip] = []

    def _see(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        skip = skip_of(report)
        if skip is not None:
            self.skips.setdefault(skip.nodeid, skip)  # one per test, whichever phase

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._see(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._see(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        for skip in self.skips.values():
            entry = next((e for e in self.entries if e.allows(skip.nodeid, skip.why)), None)
            if entry is None:
                self.unallowed.append(skip)
            else:
                entry.used.append(skip.nodeid)
        if not self.unallowed:
            return
        if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.stats.setdefault(STAT, []).extend(self.unallowed)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        used = [e for e in self.entries if e.used]
        if used:
            tr.write_sep("=", "skips the allow-list allows (tests/support/skips.py)")
            for entry in used:
                tr.write_line(f"{entry.test}: {len(entry.used)} skipped: {entry.reason}")
        if self.unallowed:
            tr.write_sep("=", "skips NOT in the allow-list: the run fails", red=True, bold=True)
            for skip in self.unallowed:
                tr.write_line(f"{skip.kind.upper()} {skip.nodeid}: {skip.why}", red=True)
            tr.write_line(
                "Each of these must run (a parameter with nothing to check is left out of "
                "the parametrisation); a skip that CI's machine can have for a good reason "
                f"gets an entry in {tr.config.getoption('--skip-allowlist')} "
                "(tests/support/skips.py says how)."
            )
