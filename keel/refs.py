"""Activity references: each activity's name with its input and output models.

A workflow calls an activity through its reference (``workflows.common.call``), never by
a bare string or by importing the class that implements it: the workflow then needs only
``keel`` (pure) and the history records the same activity type name as before. The
implementation declares itself under the same name (``@activity.defn(name=REF.name)``).

A family declares its references beside its activity models (``keel.rllm.run``,
``keel.mrp.steps``, ...); the activities every family shares are declared here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from pydantic import BaseModel

from keel.gates import WebhookDelivery, WebhookResult, WebhookTarget
from keel.llm import LLMRequest, LLMResponse
from keel.records import GateAuditEvent

In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out")


@dataclass(frozen=True, slots=True)
class ActivityRef(Generic[In, Out]):
    """An activity as a workflow sees it: the type name in history and its models.

    ``output`` is what the result is decoded into (a pydantic model, or ``bool`` for a
    record write that says whether it inserted).
    """

    name: str
    input: type[In]
    output: type[Out]


#: One model call through the gateway (activities/llm.py).
LLM_COMPLETE: ActivityRef[LLMRequest, LLMResponse] = ActivityRef(
    "llm.complete", LLMRequest, LLMResponse
)
#: One gate audit row, idempotent by its event key (activities/records.py).
RECORD_GATE_EVENT: ActivityRef[GateAuditEvent, bool] = ActivityRef(
    "records.gate_event", GateAuditEvent, bool
)
#: One signed webhook delivery (activities/notify.py).
NOTIFY_WEBHOOK: ActivityRef[WebhookDelivery, WebhookResult] = ActivityRef(
    "notify.webhook", WebhookDelivery, WebhookResult
)
#: Whether a notice would be sent anywhere: the request's url or the worker's default.
NOTIFY_HAS_TARGET: ActivityRef[WebhookTarget, bool] = ActivityRef(
    "notify.has_target", WebhookTarget, bool
)
