"""What a gate request accepts: limits that keep the workflow's timers valid."""

from __future__ import annotations

from datetime import timedelta

import pytest
from pydantic import ValidationError

from keel.gates import GateRequest, GateSummaryMemo, summary_memo

YEAR_S = 365 * 24 * 3600


def request(**kw: object) -> GateRequest:
    return GateRequest(name="deploy", requester="alice", approvers=["bob"], **kw)  # type: ignore[arg-type]


def test_a_reminder_interval_over_a_year_is_refused() -> None:
    # 1e300 s once reached the workflow and failed its task on every attempt
    # (OverflowError building the timer); the API now answers 422 instead.
    with pytest.raises(ValidationError, match="remind_every_s"):
        request(remind_every_s=1e300, max_reminders=1)
    with pytest.raises(ValidationError, match="remind_every_s"):
        request(remind_every_s=YEAR_S + 1, max_reminders=1)


def test_the_largest_limits_still_make_valid_timers() -> None:
    r = request(remind_every_s=YEAR_S, expires_in_s=YEAR_S, max_reminders=1)
    assert timedelta(seconds=r.remind_every_s or 0) == timedelta(days=365)
    assert timedelta(seconds=r.expires_in_s) == timedelta(days=365)


def test_the_api_body_has_the_same_limits_as_the_request() -> None:
    # A body the API accepts must make a valid GateRequest: a looser body bound once let
    # remind_every_s=3e16 through to a 500 (found by the OpenAPI fuzz).
    from api.routes.gates import OpenGateBody

    with pytest.raises(ValidationError, match="remind_every_s"):
        OpenGateBody(name="release", remind_every_s=3.0e16)
    body = OpenGateBody(name="release", remind_every_s=YEAR_S, expires_in_s=YEAR_S)
    request(remind_every_s=body.remind_every_s, expires_in_s=body.expires_in_s, max_reminders=1)


def test_the_summary_memo_is_what_a_gate_list_shows_of_the_request() -> None:
    req = GateRequest(
        name="deploy",
        requester="alice",
        approvers=["carol", "bob", "carol"],
        subject="ship ♡",
        details={"big": "x" * 1000},
        expires_in_s=90,
        webhook_url="http://127.0.0.1:1/hook",
    )
    memo = summary_memo(req)
    assert memo == GateSummaryMemo(
        requester="alice", subject="ship ♡", approvers=["bob", "carol"], expires_in_s=90
    )
    # Only the summary: no details, no webhook url (a memo is in every visibility row).
    assert set(memo.model_dump()) == {"requester", "subject", "approvers", "expires_in_s"}
    # A newer writer's extra field is ignored; a memo without a requester or expiry is not one.
    assert GateSummaryMemo.model_validate({**memo.model_dump(), "later": 1}) == memo
    for broken in ({"requester": "", "expires_in_s": 1}, {"requester": "alice"}, "text"):
        with pytest.raises(ValidationError):
            GateSummaryMemo.model_validate(broken)
