"""Pydantic models whose ``model_json_schema()`` serve as ``.rllm`` schemas in tests.

They exercise what pydantic emits: ``$defs`` with ``$ref`` for nested models, ``anyOf``
with ``null`` for optional fields, ``enum`` for Enum classes, ``const``-free literals,
defaults, ``title`` and ``format``.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Priority(StrEnum):
    low = "low"
    high = "high"


class Address(BaseModel):
    model_config = ConfigDict(extra="forbid")

    city: str = Field(min_length=2)
    postcode: str | None = None


class Customer(BaseModel):
    name: str
    email: str = Field(json_schema_extra={"format": "email"})
    address: Address
    billing: Address | None = None


class TicketIn(BaseModel):
    text: str = Field(min_length=1, description="The customer's message")
    customer: Customer
    channel: Literal["mail", "chat"] = "mail"


class Action(BaseModel):
    kind: Literal["refund", "reply", "escalate"]
    amount: float | None = Field(default=None, ge=0)


class TicketOut(BaseModel):
    priority: Priority
    summary: str = Field(max_length=80)
    actions: list[Action] = Field(min_length=1)
    follow_up: Address | None = None


def schema_of(model: type[BaseModel], *, declare_draft: bool = False) -> dict[str, Any]:
    schema = model.model_json_schema()
    if declare_draft:
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return schema


def ticket_app(name: str = "ticket", prompt: str = "Triage: {{ text }}\n", extra: str = "") -> str:
    """An app whose input and output schemas are exactly what pydantic exports."""
    return (
        "---\n"
        f"name: {name}\n"
        "description: Triage a support ticket.\n"
        "version: 1.0.0\n"
        "author: tests\n"
        "max_context_window: 4096\n"
        f"input_schema: {json.dumps(schema_of(TicketIn, declare_draft=True))}\n"
        f"output_schema: {json.dumps(schema_of(TicketOut))}\n"
        "llm: {provider: keel, model: local}\n"
        "llm_params: {temperature: 0, max_tokens: 200}\n"
        f"{extra}"
        "---\n" + prompt
    )
