"""Why a design use case (``client/design_cases.py``, ``client/design_files.py``) will not
do what it was asked: one exception class per reason, its fields what the ``design`` CLI
and the API need to say so, each in its own words, codes and exit codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.service import RPCError

from keel.design.steps import DesignStatus


class DesignRefusal(Exception):
    """A use case refused; the subclass says why."""


@dataclass(eq=False)
class ProjectNotFound(DesignRefusal):
    project: str


@dataclass(eq=False)
class InvalidProjectId(DesignRefusal):
    project: str


@dataclass(eq=False)
class NotProjectOwner(DesignRefusal):
    project: str
    owner: str
    actor: str


@dataclass(eq=False)
class PreviousNotStored(DesignRefusal):
    """The previous decision set named is no stored (persisted) set of the project."""

    project: str
    previous: str


@dataclass(eq=False)
class WebhookNotAllowed(DesignRefusal):
    """The worker would refuse the webhook URL: refused now rather than every notice."""

    url: str


@dataclass(eq=False)
class NoRun(DesignRefusal):
    """The decision set has no pipeline run."""

    project: str
    decision_set: str


@dataclass(eq=False)
class NotRunning(DesignRefusal):
    project: str
    decision_set: str
    status: str


@dataclass(eq=False)
class NoWorker(DesignRefusal):
    """The run is running but no worker answered its ``status`` query."""

    project: str
    decision_set: str
    error: RPCError


@dataclass(eq=False)
class InvalidAnswer(DesignRefusal):
    """The workflow refused an answer that does not validate; ``issues`` name the field."""

    message: str
    issues: Any
    status: DesignStatus


@dataclass(eq=False)
class NoOpenQuestions(DesignRefusal):
    message: str
    status: DesignStatus


@dataclass(eq=False)
class NoOpenGate(DesignRefusal):
    """The run waits for no approval (``status.phase`` says what it does)."""

    project: str
    decision_set: str
    status: DesignStatus


@dataclass(eq=False)
class GateNotOpenYet(DesignRefusal):
    gate_id: str


@dataclass(eq=False)
class NotCompleted(DesignRefusal):
    decision_set: str
    status: str


@dataclass(eq=False)
class HasRepository(DesignRefusal):
    decision_set: str


@dataclass(eq=False)
class NoArchive(DesignRefusal):
    """The decision set has no repository archive (not finished, or planned only)."""

    project: str
    decision_set: str


@dataclass(eq=False)
class NoSuchArchive(DesignRefusal):
    """``digest`` is no decision set's archive, or the artifact store lost it."""

    digest: str


@dataclass(eq=False)
class NoRepository(DesignRefusal):
    decision_set: str


@dataclass(eq=False)
class NoSuchFile(DesignRefusal):
    """No file ``path`` in the repository (``or_before``: nor in the previous one's)."""

    decision_set: str
    path: str
    or_before: bool = False


@dataclass(eq=False)
class FileTooLarge(DesignRefusal):
    path: str
    size: int


@dataclass(eq=False)
class NotText(DesignRefusal):
    path: str
