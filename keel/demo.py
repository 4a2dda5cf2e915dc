"""The ``KeelDemo`` workflow's input and result (workflows/demo.py runs it)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from keel.gates import GateState
from keel.llm import LLMResponse

#: The workflow type (workflows/demo.py).
DEMO_WORKFLOW_TYPE = "KeelDemo"


class DemoInput(BaseModel):
    """What ``keel demo`` asks: a topic for the model, who requests and who approves."""

    topic: str = "durable workflows for AI work"
    requester: str = "dev-requester"
    approvers: list[str] = Field(default_factory=lambda: ["dev-approver"])
    model: str = ""
    expires_in_s: float = 3600


class DemoResult(BaseModel):
    """The draft, the model call behind it, the gate's end state, and whether it was
    published (approved)."""

    draft: str
    llm: LLMResponse
    gate: GateState
    published: bool
