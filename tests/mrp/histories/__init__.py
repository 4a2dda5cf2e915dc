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
