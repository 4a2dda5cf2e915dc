"""MRP histories recorded by this family's tests (``KEEL_RECORD_MRP_HISTORY=1``) for the
workflow changes they cover; ``tests/mrp/unit/test_mrp_histories_replay.py`` replays each
against today's code (``tests/histories`` holds the shared corpus)."""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

HISTORIES = Path(__file__).resolve().parent


async def replay(name: str, text: str) -> BaseException | None:
    """Replay one history (JSON) against today's MRP workflows, in the sandbox; the
    failure, or None."""
    from workers.main import WORKFLOWS, plugins

    history = WorkflowHistory.from_json(name, text)
    started = history.events[0].workflow_execution_started_event_attributes
    history = WorkflowHistory(started.workflow_id or name, history.events)
    replayer = Replayer(
        workflows=list(WORKFLOWS),
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=SandboxedWorkflowRunner(),
        plugins=plugins(),
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return result.replay_failure


def windows_before_first_done(history: WorkflowHistory) -> int:
    """How many map windows a run had scheduled when its first activity finished: the
    windows it kept in flight at the start."""
    scheduled = 0
    for event in history.events:
        attrs = event.activity_task_scheduled_event_attributes
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled += attrs.activity_type.name == "mrp.map_window"
        if event.HasField("activity_task_completed_event_attributes") and scheduled:
            break
    return scheduled


async def check_and_record(name: str, history: WorkflowHistory, patch: str) -> None:
    """The run's history has ``patch``'s marker and replays against today's code; with
    ``KEEL_RECORD_MRP_HISTORY=1`` it is written here as ``<name>.json``."""
    import base64
    import os

    marker = base64.b64encode(f'{{"id":"{patch}"'.encode()).decode()[:20]
    text = history.to_json()
    assert marker in text, "the patch marker is in the new history"
    assert await replay(name, text) is None
    if os.environ.get("KEEL_RECORD_MRP_HISTORY"):
        (HISTORIES / f"{name}.json").write_text(text)
