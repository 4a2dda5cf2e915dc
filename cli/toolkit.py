"""What every Keel CLI (``keel``, ``mrp``, ``runllm``, and the families to come) shares.

- :data:`output`: the output mode (JSON on stdout, or text for people), :func:`note`
  (progress on stderr, never mixed into the JSON) and :class:`StatusLine` (a live one);
- :class:`cli.envelope.CliError`, the one error model: the family, its error type, the
  message, the exit code and the family's own payload in ``details``; :func:`report`
  writes it in the family's documented shape (:data:`ERROR_STYLES`), :class:`CliFailure`
  raises it;
- :data:`EXIT_CODES`, every family's exit-code table, read from the families registry
  (``keel/families.py``) and nowhere else;
- :func:`load_settings` and :func:`sessions`: one way to get ``Settings`` and a session
  factory (``store.db.get_sessionmaker``);
- :func:`run`: a CLI run (:func:`cli._exit.run_app` with the family's error handler);
- :class:`Family`: all of the above for one family, the one wrapper every CLI uses
  (``FAMILY = Family("mrp", translate=...)``; ``FAMILY.fail(...)``, ``FAMILY.emit(...)``,
  ``with FAMILY.reported(): ...``, ``FAMILY.main(app, argv)``).

Importing this module stays cheap (no pydantic, Temporal, SQLAlchemy, LiteLLM or Ray):
those are imported inside the functions that need them (``bench/cli_latency.py``); the
error model lives in ``cli/envelope.py`` for that reason (pydantic costs ``mrp --help``
a quarter of a second).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, NoReturn, TypeVar

import click
import typer

from cli._exit import run_app
from keel import families

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from cli.envelope import CliError
    from keel.settings import Settings

T = TypeVar("T")
V = TypeVar("V")

#: The ``keel`` CLI's own exit codes (it is every family's shared command, not a family).
KEEL_EXIT_CODES: dict[str, int] = {"ok": 0, "error": 1, "usage": 2, "not_running": 3}


class _ByFamily(Mapping[str, V]):
    """A live view of one field of every registered family (``keel/families.py``), with the
    ``keel`` CLI's own entry first: a family registered later is in it at once."""

    def __init__(self, keel: V, table: Callable[[], dict[str, V]]) -> None:
        self._keel = keel
        self._table = table

    def _all(self) -> dict[str, V]:
        return {"keel": self._keel, **self._table()}

    def __getitem__(self, family: str) -> V:
        return self._all()[family]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Exit codes of every CLI family (stable; documented in docs/mrp-cli.md, docs/runllm-cli.md
#: and README.md), by family: each family's table is its entry in ``keel/families.py``,
#: read from there and nowhere else. ``runllm``'s 10-19 are the ten ``.rllm`` error classes'
#: (``keel.rllm.errors``, fixed by the .rllm spec; tests/core/unit/test_cli_toolkit.py checks
#: that this table and those classes agree).
EXIT_CODES: Mapping[str, Mapping[str, int]] = _ByFamily(KEEL_EXIT_CODES, families.exit_codes)

#: How each family writes an error on stdout. ``envelope``: ``{"error": CliError}`` in
#: JSON mode (nothing on stdout in text mode). ``payload``: the family's payload itself,
#: always (the ``.rllm`` spec fixes ``RllmErrorPayload`` as ``runllm``'s error document).
#: Each family's is its entry's ``error_style`` (``keel/families.py``).
ERROR_STYLES: Mapping[str, Literal["envelope", "payload"]] = _ByFamily(
    "envelope", families.error_styles
)


# -- output --------------------------------------------------------------------------------


class Output:
    """The process's output mode: one JSON document on stdout, or text for people."""

    def __init__(self) -> None:
        self.json = True

    @property
    def human(self) -> bool:
        return not self.json

    @staticmethod
    def default() -> bool:
        """The one default of every CLI: JSON unless stdout is a terminal."""
        return not sys.stdout.isatty()

    def choose(self, force_json: bool | None, *, verbose: bool = False) -> bool:
        """Set the mode: ``force_json`` when given (``--json``/``--text``), else text with
        ``verbose`` or on a terminal, JSON otherwise. Returns whether the mode is JSON."""
        if force_json is not None:
            self.json = force_json
        else:
            self.json = not verbose and self.default()
        return self.json

    def from_argv(self, argv: list[str]) -> None:
        """The mode the command line asked for, when it failed before a command chose one."""
        if "--json" in argv:
            self.json = True
        elif any(flag in argv for flag in ("--text", "--verbose", "-v")):
            self.json = False


output = Output()

#: Every command's ``--json/--text`` option (neither: :meth:`Output.default`).
JsonOpt = Annotated[
    bool | None,
    typer.Option("--json/--text", help="JSON or text output (default: text on a terminal)"),
]


def dumps(obj: Any, *, pretty: bool) -> str:
    """JSON as the CLIs print it (indented for people, one line for programs)."""
    return json.dumps(obj, ensure_ascii=False, indent=2 if pretty else None, default=str)


def note(text: str) -> None:
    """Progress for people, on stderr (never mixed into the JSON on stdout)."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


class StatusLine:
    """A progress line on stderr (for a terminal), rewritten in place: :meth:`show` writes
    a line only when it differs from the last one, :meth:`clear` erases it."""

    def __init__(self) -> None:
        self.last = ""

    def show(self, line: str) -> None:
        if line != self.last:
            sys.stderr.write("\r\033[K" + line)
            sys.stderr.flush()
            self.last = line

    @staticmethod
    def clear() -> None:
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()


# -- errors --------------------------------------------------------------------------------


class CliFailure(Exception):
    """A failure a command reports as a :class:`CliError` and leaves with its exit code."""

    def __init__(
        self,
        family: str,
        code: str,
        lines: list[str] | str,
        exit_code: int | None = None,
        details: Any = None,
        *,
        hint: str | None = None,
    ) -> None:
        from cli.envelope import CliError

        lines = [lines] if isinstance(lines, str) else lines
        self.error = CliError(
            family=family,
            type=code,
            message="; ".join(lines),
            exit_code=EXIT_CODES[family][code] if exit_code is None else exit_code,
            details=details,
            lines=lines,
            hint=hint,
        )
        super().__init__(self.error.message)

    @property
    def details(self) -> Any:
        return self.error.details

    @details.setter
    def details(self, value: Any) -> None:
        self.error.details = value


def report(err: CliError) -> int:
    """Write ``err`` in its family's shape (stdout) and its ``error:`` lines (stderr);
    returns the exit code."""
    style = ERROR_STYLES.get(err.family, "envelope")
    doc: Any = None
    if style == "payload":
        doc = err.details
    elif output.json:
        doc = err.envelope()
    if doc is not None:
        sys.stdout.write(dumps(doc, pretty=style == "envelope" or output.human) + "\n")
        sys.stdout.flush()
    for line in err.lines or [err.message]:
        sys.stderr.write(f"error: {line}\n")
    if err.hint and output.human:
        sys.stderr.write(f"hint: {err.hint}\n")
    sys.stderr.flush()
    return err.exit_code


Translate = Callable[[BaseException], "CliError | None"]


@contextlib.contextmanager
def reported(translate: Translate | None = None) -> Iterator[None]:
    """Turn a command's failures into their report and exit code: a :class:`CliFailure`,
    or any exception ``translate`` (the family's) maps to a :class:`CliError`."""
    try:
        yield
    except CliFailure as f:
        raise typer.Exit(report(f.error)) from None
    except Exception as e:
        err = translate(e) if translate is not None else None
        if err is None:
            raise
        raise typer.Exit(report(err)) from None


def run(
    app: typer.Typer,
    argv: list[str] | None,
    *,
    translate: Translate,
    usage: Callable[[str], CliError],
    unexpected: Callable[[BaseException], CliError],
    default_json: bool | None = None,
) -> int:
    """Run a family's CLI ``app`` and return its exit code (the entry point leaves with it:
    :meth:`Family.main`).

    Errors outside a command's :func:`reported` block (the command line, an exception no
    command expected) are reported as the family's ``usage`` or ``unexpected`` error,
    in the mode the command line asked for, else the one default (:meth:`Output.default`:
    text on a terminal, JSON otherwise).
    """
    output.json = Output.default() if default_json is None else default_json

    def on_error(err: BaseException) -> int:
        output.from_argv(sys.argv if argv is None else argv)
        if type(err).__name__ == "NoArgsIsHelpError":
            return EXIT_CODES["keel"]["usage"]  # the bare command: help was printed
        # Typer raises its own copy of click's exceptions (typer.exceptions.TyperException).
        if isinstance(err, click.ClickException | typer.exceptions.TyperException) and hasattr(
            err, "format_message"
        ):
            return report(usage(err.format_message()))
        if isinstance(err, CliFailure):
            return report(err.error)
        known = translate(err)
        if known is not None:
            return report(known)
        return report(unexpected(err))  # run_app printed the traceback (KEEL_DEBUG)

    return run_app(app, argv, on_error=on_error)


# -- one family's wrapper -------------------------------------------------------------------


class Family:
    """One CLI family's wrapper around the toolkit: its failures, its output, its entry.

    ``translate`` maps the family's own exceptions to a :class:`CliError` (None: not one
    of them); what every family shares comes after it: settings that do not validate
    (:class:`SettingsInvalid`) are the code ``bad_settings``, a service that could not be
    reached or started (``services.local.ServiceUnavailable``) the code ``unavailable``.
    (None: the family's ``translate`` reports them itself.) ``usage`` and ``unexpected`` override how a bad command line and an unexpected
    exception are reported (default: the family's ``usage`` and ``error`` codes).
    """

    def __init__(
        self,
        name: str,
        translate: Translate | None = None,
        *,
        bad_settings: str | None = "usage",
        unavailable: str | None = "error",
        usage: Callable[[str], CliError] | None = None,
        unexpected: Callable[[BaseException], CliError] | None = None,
    ) -> None:
        self.name = name
        self.exit_codes = EXIT_CODES[name]
        self._own = translate
        self._shared = {"settings": bad_settings, "unavailable": unavailable}
        self._usage = usage
        self._unexpected = unexpected

    def failure(
        self,
        code: str,
        lines: list[str] | str,
        exit_code: int | None = None,
        details: Any = None,
        *,
        hint: str | None = None,
    ) -> CliFailure:
        """The family's failure ``code`` (exit code from :data:`EXIT_CODES` unless given)."""
        return CliFailure(self.name, code, lines, exit_code, details, hint=hint)

    def fail(self, code: str, lines: list[str] | str, *more: Any, **named: Any) -> NoReturn:
        """Raise :meth:`failure` (same arguments), inside :meth:`reported`."""
        raise self.failure(code, lines, *more, **named)

    def fail_now(self, code: str, lines: list[str] | str, exit_code: int | None = None) -> NoReturn:
        """Report the failure and leave, outside a :meth:`reported` block."""
        raise typer.Exit(report(self.failure(code, lines, exit_code).error))

    def translate(self, err: BaseException) -> CliError | None:
        """The family's report of ``err`` (None: not one of its errors)."""
        if isinstance(err, CliFailure):
            return err.error
        own = self._own(err) if self._own is not None else None
        if own is not None:
            return own
        from services.local import ServiceUnavailable

        code = None
        if isinstance(err, SettingsInvalid):
            code = self._shared["settings"]
        elif isinstance(err, ServiceUnavailable):
            code = self._shared["unavailable"]
        if code is None:
            return None
        return self.failure(
            code, str(err), self.exit_codes.get(code, self.exit_codes["error"])
        ).error

    def reported(self) -> contextlib.AbstractContextManager[None]:
        """Turn a command's failures into their report and exit code (:func:`reported`)."""
        return reported(self.translate)

    @staticmethod
    def mode(force_json: bool | None, *, verbose: bool = False) -> bool:
        """Choose the output mode (``--json``/``--text``, else the one default); returns
        whether it is JSON."""
        return output.choose(force_json, verbose=verbose)

    @staticmethod
    def emit(doc: Any, text: str) -> None:
        """One JSON document, or the text for people."""
        typer.echo(dumps(doc, pretty=True) if output.json else text)

    def usage(self, message: str) -> CliError:
        if self._usage is not None:
            return self._usage(message)
        return self.failure("usage", message).error

    def unexpected(self, err: BaseException) -> CliError:
        if self._unexpected is not None:
            return self._unexpected(err)
        return self.failure("error", f"{type(err).__name__}: {err}").error

    def run(self, app: typer.Typer, argv: list[str] | None = None) -> int:
        """Run ``app`` in this process and return its exit code (:func:`run`): what
        :meth:`main` does, less the exit (tests/core/unit/test_cli_every_command.py)."""
        return run(
            app,
            argv,
            translate=self.translate,
            usage=self.usage,
            unexpected=self.unexpected,
        )

    def main(self, app: typer.Typer, argv: list[str] | None = None) -> NoReturn:
        """The console script: run ``app`` and leave with its exit code through
        ``os._exit`` (``cli/_exit.py`` says why)."""
        os._exit(self.run(app, argv))


# -- who acts -------------------------------------------------------------------------------


def user(explicit: str | None = None, *, fallback: str = "keel") -> str:
    """Who a CLI acts as: ``--as``, else ``$KEEL_USER``, else the login name."""
    import getpass
    import os

    if explicit:
        return explicit
    if os.environ.get("KEEL_USER"):
        return os.environ["KEEL_USER"]
    try:
        return getpass.getuser() or fallback
    except Exception:
        return fallback


# -- settings and sessions -----------------------------------------------------------------


class SettingsInvalid(Exception):
    """The ``KEEL_*`` settings do not validate; the message names each problem."""


def load_settings() -> Settings:
    """The process's ``Settings``; :class:`SettingsInvalid` when the environment is wrong."""
    from pydantic import ValidationError

    from keel.problems import problem_lines
    from keel.settings import get_settings

    try:
        return get_settings()
    except ValidationError as e:
        problems = "; ".join(problem_lines(e, root=""))
        raise SettingsInvalid(f"the KEEL_* settings are not valid: {problems}") from None


def sessions(settings: Settings) -> sessionmaker[Session]:
    """The process-wide session factory of the configured database (migrated on first use)."""
    from store.db import get_sessionmaker

    return get_sessionmaker(settings.resolved_database_url)
