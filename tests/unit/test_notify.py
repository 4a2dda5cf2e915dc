"""The webhook activity: signed deliveries, status mapping, and the URL allow-list."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify import NotifyActivities
from keel.gates import GateNotice, GateStatus, WebhookDelivery
from keel.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from tests.support.webhook_receiver import WebhookReceiver


def delivery(url: str = "") -> WebhookDelivery:
    now = datetime.now(UTC)
    notice = GateNotice(
        event="gate.waiting", gate_id="p/gate/g", name="g", status=GateStatus.PENDING,
        subject="s", requester="alice", expires_at=now, at=now,
    )  # fmt: skip
    return WebhookDelivery(url=url, notice=notice, idempotency_key="k1")


async def test_delivers_signed_body_to_default_url():
    with WebhookReceiver() as rx:
        acts = NotifyActivities(default_url=rx.url, secret="s3")
        result = await ActivityEnvironment().run(acts.webhook, delivery())
    assert result.delivered and result.status_code == 200
    (d,) = rx.deliveries
    assert d.headers["Idempotency-Key"] == "k1"
    assert verify("s3", int(d.headers[TIMESTAMP_HEADER]), d.body, d.headers[SIGNATURE_HEADER],
                  now=time.time())  # fmt: skip


async def test_no_url_is_skipped_not_failed():
    acts = NotifyActivities(default_url="", secret="s3")
    result = await ActivityEnvironment().run(acts.webhook, delivery())
    assert not result.delivered and result.skipped_reason


@pytest.mark.parametrize(
    ("status", "retryable", "kind"), [(400, False, "WebhookRejected"), (429, True, "WebhookRetryable"),
                                      (503, True, "WebhookRetryable")]
)  # fmt: skip
async def test_status_mapping(status, retryable, kind):
    with WebhookReceiver(statuses=[status]) as rx:
        acts = NotifyActivities(default_url=rx.url, secret="s3")
        with pytest.raises(ApplicationError) as info:
            await ActivityEnvironment().run(acts.webhook, delivery())
    assert info.value.type == kind and info.value.non_retryable is (not retryable)


async def test_urls_outside_the_allow_list_are_refused_before_any_request():
    with WebhookReceiver() as rx:
        acts = NotifyActivities(default_url="", secret="s3", allowed_prefixes=[rx.url])
        ok = await ActivityEnvironment().run(acts.webhook, delivery(rx.url))
        assert ok.delivered
        for url in (
            "http://169.254.169.254/latest",
            "file:///etc/passwd",
            rx.url.replace("/hook", ""),
        ):
            with pytest.raises(ApplicationError) as info:
                await ActivityEnvironment().run(acts.webhook, delivery(url))
            assert info.value.type == "WebhookMisconfigured" and info.value.non_retryable
    assert len(rx.deliveries) == 1
