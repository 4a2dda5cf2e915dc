"""Replay the recorded corpus (``tests/histories/*.json``) against today's workflow code.

No server is needed. A failure here means a workflow change would break runs that are
open in production: guard it with ``workflow.patched`` or, if no old run can exist,
re-record (docs/replay.md says which). The last test proves the check has teeth.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

with workflow.unsafe.imports_passed_through():
    from keel.gates import GATE_WORKFLOW_TYPE, GateRequest, GateState
    from tests.histories import CORPUS, HISTORIES_DIR
    from workers.main import WORKFLOWS, plugins
    from workflows.gate import ApprovalGate

# The expected names plus anything else committed there, so a new file is replayed too
# and a missing one is a failing test of its own rather than a silently shorter run.
NAMES = sorted(set(CORPUS) | {p.stem for p in HISTORIES_DIR.glob("*.json")})


def load(name: str) -> WorkflowHistory:
    path = HISTORIES_DIR / f"{name}.json"
    assert path.is_file(), f"{path} is missing: run `uv run python -m tests.histories.record`"
    history = WorkflowHistory.from_json(name, path.read_text())
    started = history.events[0].workflow_execution_started_event_attributes
    # The id the workflow saw when recorded (child ids are derived from it).
    return WorkflowHistory(started.workflow_id or name, history.events)


def test_corpus_is_complete() -> None:
    present = {p.stem for p in HISTORIES_DIR.glob("*.json")}
    assert set(CORPUS) <= present, f"missing histories: {sorted(set(CORPUS) - present)}"
    # Every workflow family registered on the worker has at least one history.
    types = {
        load(name).events[0].workflow_execution_started_event_attributes.workflow_type.name
        for name in present
    }
    assert types >= {GATE_WORKFLOW_TYPE, "KeelDemo", "RllmApp", "MRPJob"}


def sandboxed_replayer(workflows: list[type], **kwargs: Any) -> Replayer:
    """A replayer that runs every workflow in the sandbox, whatever its ``sandboxed``."""
    return Replayer(
        workflows=workflows,
        data_converter=pydantic_data_converter,
        unsandboxed_workflow_runner=SandboxedWorkflowRunner(),
        **kwargs,
    )


@pytest.mark.parametrize("name", NAMES)
async def test_history_replays(name: str) -> None:
    history = load(name)
    # Every workflow the worker registers, so a new family's histories replay too, each
    # inside the SDK's sandbox, the ones the worker runs outside it (``sandboxed=False``:
    # ApprovalGate) included, so a clock read or an import with side effects fails here.
    replayer = sandboxed_replayer(list(WORKFLOWS), plugins=plugins())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{name}: {result.replay_failure!r}"


@workflow.defn(name=GATE_WORKFLOW_TYPE)
class ChangedApprovalGate(ApprovalGate):
    """ApprovalGate with a timer added before its first command: not replay-safe."""

    @workflow.run
    async def run(self, request: GateRequest) -> GateState:
        await workflow.sleep(timedelta(seconds=1))
        return await super().run(request)


async def test_changed_gate_is_nondeterministic() -> None:
    replayer = Replayer(workflows=[ChangedApprovalGate], data_converter=pydantic_data_converter)
    with pytest.raises(workflow.NondeterminismError) as info:
        await replayer.replay_workflow(load("gate_approved_update"), raise_on_replay_failure=True)
    # Core names the mismatch: the new timer against the history's search attribute upsert.
    message = str(info.value)
    assert "TMPRL1100" in message and "Timer" in message, message


@workflow.defn(name=GATE_WORKFLOW_TYPE, sandboxed=False)
class ClockReadingGate(ApprovalGate):
    """ApprovalGate reading the wall clock: the sandbox refuses it, even for a workflow
    the worker runs outside the sandbox."""

    @workflow.run
    async def run(self, request: GateRequest) -> GateState:
        datetime.now()
        return await super().run(request)


async def test_unsandboxed_gate_still_replays_in_the_sandbox() -> None:
    # The worker runs the gate outside the sandbox; this replay runs it inside.
    assert getattr(ApprovalGate, "__temporal_workflow_definition").sandboxed is False
    result = await sandboxed_replayer([ClockReadingGate]).replay_workflow(
        load("gate_approved_update"), raise_on_replay_failure=False
    )
    assert result.replay_failure is not None
    assert "datetime.datetime.now" in str(result.replay_failure), result.replay_failure
