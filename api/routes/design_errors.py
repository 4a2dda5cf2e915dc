"""The HTTP error of each reason a design use case refuses (``client.design_refusals``):
the API's words, codes and statuses for them, which ``design`` CLI says in its own."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from api.errors import ApiError, refusal_error
from client import design_refusals as why
from keel.design.steps import workflow_id
from keel.gates import GateRefusal

#: ``reason -> (status, code, message of (reason, decision set id))``.
_HTTP: dict[type[why.DesignRefusal], tuple[int, str, Callable[[Any, str], str]]] = {
    why.ProjectNotFound: (404, "not_found", lambda r, _: f"no project {r.project!r}"),
    why.NotProjectOwner: (404, "not_found", lambda r, _: f"no project {r.project!r}"),
    why.InvalidProjectId: (
        422,
        "validation_failed",
        lambda r, _: f"a project id is letters, digits, '.', '_' and '-', not {r.project!r}",
    ),
    why.PreviousNotStored: (
        422,
        "validation_failed",
        lambda r, _: (
            f"previous_decision_set {r.previous!r} is not a stored decision set of {r.project!r}"
        ),
    ),
    why.WebhookNotAllowed: (
        422,
        "validation_failed",
        lambda r, _: "webhook_url is not KEEL_WEBHOOK_URL nor under KEEL_WEBHOOK_ALLOWED_PREFIXES",
    ),
    why.NoRun: (409, "conflict", lambda _, ds: f"decision set {ds!r} is not running"),
    why.NotRunning: (409, "conflict", lambda _, ds: f"decision set {ds!r} is not running"),
    why.NoWorker: (
        503,
        "no_worker",
        lambda _, ds: f"no worker answered for decision set {ds!r}: try again shortly",
    ),
    why.InvalidAnswer: (422, "validation_failed", lambda r, _: r.message),
    why.NoOpenQuestions: (409, "no_open_questions", lambda r, _: r.message),
    why.NoOpenGate: (
        409,
        "no_open_gate",
        lambda r, ds: (
            f"decision set {ds!r} is not waiting for an approval (phase {r.status.phase})"
        ),
    ),
    why.GateNotOpenYet: (409, "no_open_gate", lambda r, _: f"gate {r.gate_id!r} is not open yet"),
    why.NotCompleted: (
        409,
        "conflict",
        lambda r, ds: f"decision set {ds!r} is {r.status}, not completed",
    ),
    why.HasRepository: (
        409,
        "conflict",
        lambda _, ds: f"decision set {ds!r} has its repository already",
    ),
    why.NoArchive: (
        404,
        "not_found",
        lambda _, ds: f"decision set {ds!r} has no repository archive",
    ),
    why.NoSuchArchive: (404, "not_found", lambda r, _: "no such archive"),
    why.NoRepository: (404, "not_found", lambda _, ds: f"decision set {ds!r} has no repository"),
    why.NoSuchFile: (
        404,
        "not_found",
        lambda r, ds: f"no file {r.path!r} in {ds!r}" + (" or before" if r.or_before else ""),
    ),
    why.FileTooLarge: (
        413,
        "too_large",
        lambda r, _: f"{r.path!r} is {r.size} bytes; download the archive",
    ),
    why.NotText: (415, "not_text", lambda r, _: f"{r.path!r} is not UTF-8 text"),
}

#: The reasons about a run: their error names it (``run_id``).
_OF_A_RUN = (
    why.NoRun,
    why.NotRunning,
    why.NoWorker,
    why.InvalidAnswer,
    why.NoOpenQuestions,
    why.NoOpenGate,
    why.GateNotOpenYet,
    why.NotCompleted,
)
#: The fields of the request a refusal names (``details``).
_FIELD = {why.PreviousNotStored: "previous_decision_set", why.WebhookNotAllowed: "webhook_url"}
_FIELD_MSG = {why.PreviousNotStored: "not stored", why.WebhookNotAllowed: "not allowed"}


def refused(r: why.DesignRefusal, project: str = "", ds: str = "") -> ApiError:
    """The HTTP error of refusal ``r`` on decision set ``ds`` of ``project``."""
    status, code, message = _HTTP[type(r)]
    details: Any = None
    field = _FIELD.get(type(r))
    if field is not None:
        details = [{"loc": ["body", field], "msg": _FIELD_MSG[type(r)]}]
    if isinstance(r, why.InvalidAnswer):
        details = r.issues
    run_id = workflow_id(project, ds) if isinstance(r, _OF_A_RUN) else None
    node = (
        r.status.node
        if isinstance(r, why.InvalidAnswer | why.NoOpenQuestions | why.NoOpenGate)
        else None
    )
    headers = {"Retry-After": "5"} if isinstance(r, why.NoWorker) else None
    return ApiError(status, code, message(r, ds), details, headers, run_id=run_id, node_name=node)


@contextlib.contextmanager
def refusals(project: str = "", ds: str = "") -> Iterator[None]:
    """Answer a use case's refusal (and a gate's) on ``ds`` with its HTTP error."""
    try:
        yield
    except why.DesignRefusal as r:
        raise refused(r, project, ds) from None
    except GateRefusal as err:
        raise refusal_error(err, run_id=workflow_id(project, ds), node_name="gate_hitl") from None
