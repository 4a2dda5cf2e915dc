"""Webhook notices, signed with HMAC-SHA256 (see ``keel.webhooks``).

The secret lives in the worker's settings, never in an activity input: history would
keep it. Delivery failures map to retryable or final errors by HTTP status.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from keel.digest import canonical_json
from keel.gates import WebhookDelivery, WebhookResult, WebhookTarget
from keel.refs import NOTIFY_HAS_TARGET, NOTIFY_WEBHOOK
from keel.retry import is_retryable_status, parse_retry_after
from keel.webhooks import (
    EVENT_HEADER,
    IDEMPOTENCY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    webhook_url_allowed,
)

log = logging.getLogger(__name__)


class NotifyActivities:
    """Activities that tell the outside world something happened."""

    def __init__(
        self,
        *,
        default_url: str,
        secret: str,
        allowed_prefixes: list[str] | tuple[str, ...] = (),
        timeout_s: float = 10.0,
    ) -> None:
        self._default_url = default_url
        self._secret = secret
        self._allowed_prefixes = tuple(allowed_prefixes)
        self._timeout_s = timeout_s

    @activity.defn(name=NOTIFY_HAS_TARGET.name)
    async def has_target(self, target: WebhookTarget) -> bool:
        """Whether ``webhook`` would try to deliver a notice for this url: a workflow asks
        once (as a local activity) and sends no notices when nothing would receive them."""
        return bool(self._url_for(target.url))

    def _url_for(self, url: str) -> str:
        """Where a notice for ``url`` goes: that url, else the worker's default."""
        return url or self._default_url

    @activity.defn(name=NOTIFY_WEBHOOK.name)
    async def webhook(self, delivery: WebhookDelivery) -> WebhookResult:
        url = self._url_for(delivery.url)
        if not url:
            return WebhookResult(delivered=False, skipped_reason="no webhook url configured")
        if not url.lower().startswith(("http://", "https://")):
            raise ApplicationError(
                "webhook url must be http(s)", type="WebhookMisconfigured", non_retryable=True
            )
        allowed = url == self._default_url or webhook_url_allowed(url, self._allowed_prefixes)
        if not allowed:
            # Workflow inputs come from users: never let one aim the worker at any host.
            raise ApplicationError(
                "webhook url is not under KEEL_WEBHOOK_ALLOWED_PREFIXES (same scheme, host "
                "and port, path under the allowed path, no userinfo)",
                type="WebhookMisconfigured",
                non_retryable=True,
            )
        body = canonical_json(delivery.notice)
        ts = int(time.time())
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._secret, ts, body),
            TIMESTAMP_HEADER: str(ts),
            EVENT_HEADER: delivery.notice.event,
            IDEMPOTENCY_HEADER: delivery.idempotency_key,
        }
        try:
            # A redirect would take the signed body to a host the allow-list never saw.
            async with httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=False) as client:
                resp = await client.post(url, content=body, headers=headers)
        except httpx.HTTPError as err:
            # Connection refused, DNS, timeouts: the receiver may come back.
            raise ApplicationError(
                f"webhook delivery failed: {type(err).__name__}", type="WebhookUnreachable"
            ) from None
        if resp.is_success:
            return WebhookResult(delivered=True, status_code=resp.status_code)
        retry_after = parse_retry_after(resp.headers.get("Retry-After"), now=datetime.now(UTC))
        raise ApplicationError(
            f"webhook answered HTTP {resp.status_code}",
            {"status_code": resp.status_code},
            type="WebhookRetryable" if is_retryable_status(resp.status_code) else "WebhookRejected",
            non_retryable=not is_retryable_status(resp.status_code),
            next_retry_delay=timedelta(seconds=retry_after) if retry_after is not None else None,
        )
