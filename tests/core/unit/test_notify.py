"""The webhook activity: signed deliveries, status mapping, and the URL allow-list."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.notify import NotifyActivities
from keel.gates import GateNotice, GateStatus, WebhookDelivery
from keel.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify, webhook_url_allowed
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


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:28998/hooks", True),
        ("http://127.0.0.1:28998/hooks/", True),
        ("http://127.0.0.1:28998/hooks/a/b", True),
        ("HTTP://127.0.0.1:28998/hooks/a", True),
        ("http://127.0.0.1:28998/hooks-evil", False),
        ("http://127.0.0.1:28998/hooksx/a", False),
        ("http://127.0.0.1:28998/hooks/../x", False),
        ("http://127.0.0.1:28998/hooks/%2e%2e/x", False),
        ("http://127.0.0.1:28998/hooks/a/./b", False),
        ("http://127.0.0.1:28998/hooks/a%2fb", False),
        ("http://127.0.0.1:28998@127.0.0.1:28997/hooks/x", False),
        ("http://user@127.0.0.1:28998/hooks/x", False),
        ("http://@127.0.0.1:28998/hooks/x", False),
        ("http://127.0.0.1:28997/hooks/x", False),
        ("http://127.0.0.1/hooks/x", False),
        ("https://127.0.0.1:28998/hooks/x", False),
        ("http://127.0.0.10:28998/hooks/x", False),
        ("http://127.0.0.1:28998/hooks/x?to=elsewhere", False),
        ("http://127.0.0.1:99999/hooks/x", False),
        ("http://127.0.0.1:28998\\@127.0.0.1:28997/hooks", False),
    ],
)
def test_allow_list_compares_origin_exactly_and_path_by_segments(url, ok):
    assert webhook_url_allowed(url, ["http://127.0.0.1:28998/hooks"]) is ok


def test_allow_list_default_ports_and_bare_origin():
    assert webhook_url_allowed("https://h.example/x", ["https://h.example:443"])
    assert webhook_url_allowed("http://h.example:80/x", ["http://h.example/"])
    assert not webhook_url_allowed("http://h.example:8080/x", ["http://h.example"])
    assert not webhook_url_allowed("http://h.example/x", ["http://user@h.example"])


async def test_userinfo_url_does_not_reach_the_host_after_the_at_sign():
    with WebhookReceiver() as allowed, WebhookReceiver() as other:
        allowed_base = allowed.url.removesuffix("/hook")
        evil = f"{allowed_base}@{other.url.removeprefix('http://')}"
        acts = NotifyActivities(default_url="", secret="s3", allowed_prefixes=[allowed_base])
        with pytest.raises(ApplicationError) as info:
            await ActivityEnvironment().run(acts.webhook, delivery(evil))
    assert info.value.type == "WebhookMisconfigured" and info.value.non_retryable
    assert other.deliveries == [] and allowed.deliveries == []


async def test_redirects_are_not_followed():
    with (
        WebhookReceiver() as target,
        WebhookReceiver(statuses=[307], headers={"Location": "TARGET"}) as first,
    ):
        first.headers["Location"] = target.url
        acts = NotifyActivities(default_url=first.url, secret="s3")
        with pytest.raises(ApplicationError) as info:
            await ActivityEnvironment().run(acts.webhook, delivery())
    assert info.value.type == "WebhookRejected" and info.value.non_retryable
    assert len(first.deliveries) == 1 and target.deliveries == []
