"""SRL fixtures: small hand-checked tasks (one file each, a gold action that real ast-grep
turns into exactly ``post``) and their task file in the artifact store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from tests.support.srl import tasks_jsonl

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "srl" / "tasks.jsonl"

#: Six hand-checked tasks (Python, JavaScript, TypeScript, Java), as `keel demo` runs them.
HAND_TASKS: list[dict[str, Any]] = [
    json.loads(line) for line in EXAMPLE_TASKS.read_text().splitlines() if line.strip()
]


@pytest.fixture
def hand_tasks_digest(settings: Settings) -> str:
    """The hand tasks' file in this test's artifact store."""
    return artifact_store_from_settings(settings).put_bytes(tasks_jsonl(HAND_TASKS))


async def collection_events(client: Client, collection: str) -> tuple[list[str], list[str]]:
    """Every run of collection ``collection``'s workflow (``srl/<collection>``, in run
    order): its history's event types, and the activity types it scheduled."""
    types: list[str] = []
    activities: list[str] = []
    async for wf in client.list_workflows(f"WorkflowId = 'srl/{collection}'"):
        history = await client.get_workflow_handle(wf.id, run_id=wf.run_id).fetch_history()
        for event in history.events:
            types.append(EventType.Name(event.event_type))
            if event.HasField("activity_task_scheduled_event_attributes"):
                activities.append(event.activity_task_scheduled_event_attributes.activity_type.name)
    return types, activities
