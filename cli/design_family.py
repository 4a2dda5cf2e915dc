"""The ``design`` CLI's family wrapper (``cli/toolkit.py``): its exit codes, how its
failures read (a use case's refusal in the CLI's words, ``cli/design_text.refusal``), who
it acts as and the one way its commands run (:func:`command`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from cli import toolkit
from cli.design_text import refusal
from cli.toolkit import note

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from cli.envelope import CliError
    from keel.settings import Settings

EXIT_CODES = toolkit.EXIT_CODES["design"]
#: The exit code of each end a pipeline can reach (its ``run-complete`` status).
OUTCOME_EXIT = {
    "completed": EXIT_CODES["ok"],
    "rejected": EXIT_CODES["rejected"],
    "expired": EXIT_CODES["expired"],
    "not_covered": EXIT_CODES["not_covered"],
    "validation_failed": EXIT_CODES["validation_failed"],
}


def _translate(err: BaseException) -> CliError | None:
    from pydantic import ValidationError
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from client.design import DecisionSetNotFound
    from client.design_refusals import DesignRefusal
    from client.temporal import cause_chain
    from keel.gates import GateRefusal
    from keel.problems import problem_lines
    from store.design import DecisionSetExists, NotYours

    if isinstance(err, DesignRefusal):
        code, message, hint = refusal(err)
        return DESIGN.failure(code, message, hint=hint).error
    if isinstance(err, DecisionSetNotFound):
        return DESIGN.failure("not_found", str(err)).error
    if isinstance(err, NotYours | DecisionSetExists | WorkflowAlreadyStartedError):
        return DESIGN.failure("conflict", str(err)).error
    if isinstance(err, WorkflowUpdateFailedError):
        return DESIGN.failure("refused", str(cause_chain(err)[-1])).error
    if isinstance(err, GateRefusal):  # the round's gate refused the decision (client/gate.py)
        return DESIGN.failure("refused", err.message).error
    if isinstance(err, ValidationError):
        return DESIGN.failure("invalid_input", problem_lines(err, root="")).error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
DESIGN = toolkit.Family("design", _translate)


def user(explicit: str | None = None) -> str:
    """Who the CLI acts as (``toolkit.user``; ``design`` when no login name is known)."""
    return toolkit.user(explicit, fallback="design")


@dataclass
class Call:
    """What a command acts with, each read when first used: the settings, the store and
    the user (``--as``)."""

    as_user: str | None

    @cached_property
    def settings(self) -> Settings:
        return toolkit.load_settings()

    @cached_property
    def sm(self) -> sessionmaker[Session]:
        return toolkit.sessions(self.settings)

    @cached_property
    def actor(self) -> str:
        return user(self.as_user)


@contextlib.contextmanager
def command(json_out: bool | None, as_user: str | None = None, what: str = "") -> Iterator[Call]:
    """A command's output mode and failures (a use case's refusal in the CLI's words;
    ``what`` the command wants of a run, for a run that is not running)."""
    from client.design_refusals import DesignRefusal

    DESIGN.mode(json_out)
    with DESIGN.reported():
        try:
            yield Call(as_user)
        except DesignRefusal as r:
            code, message, hint = refusal(r, what)
            DESIGN.fail(code, message, hint=hint)


async def with_client(settings: Settings, work: Any) -> Any:
    """``await work(client)`` on the configured server. Never starts one: these commands
    answer or read a running decision set, and none runs on a server that is down."""
    from services.local import LocalServices

    services = LocalServices(settings, note)
    try:
        return await work(await services.connect(start=False))
    finally:
        await asyncio.to_thread(services.stop, True)
