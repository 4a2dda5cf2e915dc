"""Reading a run's history in tests: which activities it ran, local ones included."""

from __future__ import annotations

import json
from typing import Any

from temporalio.client import WorkflowHandle

LOCAL_ACTIVITY_MARKER = "core_local_activity"


async def activity_names(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Every activity the run ran, in history order: scheduled ones by their scheduled
    event, local ones by their marker."""
    names: list[str] = []
    async for e in handle.fetch_history_events():
        if e.HasField("activity_task_scheduled_event_attributes"):
            names.append(e.activity_task_scheduled_event_attributes.activity_type.name)
        elif e.marker_recorded_event_attributes.marker_name == LOCAL_ACTIVITY_MARKER:
            data = e.marker_recorded_event_attributes.details["data"].payloads[0].data
            names.append(json.loads(data)["activity_type"])
    return names


async def local_activity_names(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """The local activities the run completed, in history order (their markers)."""
    return [name for name, _ in await local_activity_results(handle)]


async def local_activity_results(handle: WorkflowHandle[Any, Any]) -> list[tuple[str, Any]]:
    """(activity type, result as JSON) of each local activity the run completed, in
    history order (None for one whose marker carries no result)."""
    results: list[tuple[str, Any]] = []
    async for e in handle.fetch_history_events():
        marker = e.marker_recorded_event_attributes
        if marker.marker_name == LOCAL_ACTIVITY_MARKER:
            data = json.loads(marker.details["data"].payloads[0].data)
            payloads = marker.details["result"].payloads if "result" in marker.details else []
            result = json.loads(payloads[0].data) if payloads else None
            results.append((data["activity_type"], result))
    return results
