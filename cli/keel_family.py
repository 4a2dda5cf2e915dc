"""The ``keel`` CLI's failure family (how Keel's exceptions are reported), its logging
set-up and stderr line, shared by its command modules (``cli/keel.py``, ``cli/actors.py``)."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import typer

from cli import toolkit

if TYPE_CHECKING:
    from cli.envelope import CliError


log = logging.getLogger("keel")


def _translate(err: BaseException) -> CliError | None:
    """Keel's own exceptions as the CLI reports them (None: not one of them)."""
    from keel.srl.errors import ActorsConfigError
    from services.processes import ServiceError

    if isinstance(err, ActorsConfigError):
        return KEEL.failure("usage", str(err)).error
    if isinstance(err, ServiceError):
        return KEEL.failure("error", str(err)).error
    return None


#: The toolkit's wrapper for ``keel`` (failures, output, entry point).
KEEL = toolkit.Family("keel", _translate, bad_settings="error")


def _setup_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _say_err(line: str) -> None:
    typer.echo(line, err=True)
