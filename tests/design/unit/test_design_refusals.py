"""Every reason a design use case refuses (``client/design_refusals.py``) has its words in
both entry points: an HTTP error in the API (``api/routes/design_errors.py``: never a 500
for a refusal) and a documented error type and exit code in the ``design`` CLI
(``cli/design_text.refusal``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from api.routes.design_errors import refused
from cli.design_text import refusal
from cli.toolkit import EXIT_CODES
from client import design_refusals as why
from keel.design.steps import DesignStatus

REASONS = [
    cls
    for _, cls in inspect.getmembers(why, inspect.isclass)
    if issubclass(cls, why.DesignRefusal) and cls is not why.DesignRefusal
]
#: A value for each field type the reasons have.
VALUES: dict[str, Any] = {
    "str": "x",
    "int": 9,
    "bool": True,
    "Any": [{"loc": ["answers", "regions"], "msg": "bad"}],
    "DesignStatus": DesignStatus(phase="waiting_for_approval", node="gate_hitl", plan_round=2),
    "RPCError": RPCError("no worker", RPCStatusCode.DEADLINE_EXCEEDED, b""),
}


def example(cls: type[why.DesignRefusal]) -> why.DesignRefusal:
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: VALUES[str(f.type)] for f in fields})


def test_there_are_reasons() -> None:
    assert len(REASONS) >= 20, REASONS


@pytest.mark.parametrize("cls", REASONS, ids=lambda c: c.__name__)
def test_each_reason_is_an_http_error_below_500_but_no_worker(
    cls: type[why.DesignRefusal],
) -> None:
    err = refused(example(cls), "acme", "ds1")
    assert err.message and err.code
    if cls is why.NoWorker:
        assert err.status == 503 and err.headers == {"Retry-After": "5"}
    else:
        assert 400 <= err.status < 500, (cls, err.status)


@pytest.mark.parametrize("cls", REASONS, ids=lambda c: c.__name__)
def test_each_reason_is_a_documented_cli_error(cls: type[why.DesignRefusal]) -> None:
    code, message, _ = refusal(example(cls), "no open gate")
    assert code in EXIT_CODES["design"], code
    assert message and message != cls.__name__, (cls, message)


def test_the_run_reasons_name_the_run_and_node() -> None:
    status = VALUES["DesignStatus"]
    err = refused(why.NoOpenGate("acme", "ds1", status), "acme", "ds1")
    assert (err.status, err.code) == (409, "no_open_gate")
    assert err.run_id == "design/acme/ds1" and err.node_name == "gate_hitl"
    assert "phase waiting_for_approval" in err.message
    invalid = refused(why.InvalidAnswer("regions: bad", VALUES["Any"], status), "acme", "ds1")
    assert (invalid.status, invalid.details) == (422, VALUES["Any"])
    code, message, _ = refusal(why.NotRunning("acme", "ds1", "completed"), "no open gate")
    assert (code, message) == ("not_found", "acme/ds1 has no open gate: the run is completed")


def test_a_previous_set_not_stored_names_the_field() -> None:
    err = refused(why.PreviousNotStored("acme", "ds0"), "acme")
    assert err.status == 422
    assert err.details == [{"loc": ["body", "previous_decision_set"], "msg": "not stored"}]
