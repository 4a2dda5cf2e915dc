"""The floor: the least work of a given shape that the same Temporal server can do.

The latency benches run these beside Keel's own workflows, on the same server and worker
process, so that each prints Keel's time as a ratio of what Temporal itself needs:

* ``FloorLLM``: a workflow that runs one activity, which makes one LiteLLM call to the
  given OpenAI-compatible server and returns its text; started and awaited like
  ``RllmApp``;
* ``FloorLocalFirst``: ``FloorLLM`` with one local activity (``floor.pause``, a sleep of
  the given milliseconds) in its first workflow task, before the activity, where
  ``RllmApp`` runs ``rllm.load``: ``bench/local_activity_dispatch.py`` compares the two;
* ``FloorGate``: a workflow that waits for one Update, whose handler records the decision
  and returns the state; the workflow then completes, like ``ApprovalGate``. A ``state``
  Query lets the bench wait until it runs, as it does for a gate. It runs outside the
  SDK's workflow sandbox, as ``ApprovalGate`` does, so the sandbox's cost is in neither
  and the ratio is what the gate adds to a bare Update.

Nothing here is Keel: no schema check, no stats, no audit, no sandbox.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow


class FloorCall(BaseModel):
    api_base: str
    prompt: str


class FloorPausedCall(BaseModel):
    call: FloorCall
    pause_ms: int = 10


class FloorState(BaseModel):
    decision: str = ""
    actor: str = ""


@activity.defn(name="floor.complete")
async def floor_complete(call: FloorCall) -> str:
    """One chat completion through LiteLLM, its own retries off."""
    from activities.llm import load_litellm_async

    litellm = await load_litellm_async()
    resp = await litellm.acompletion(
        model="openai/scripted",
        api_base=call.api_base,
        api_key="no-key",
        messages=[{"role": "user", "content": call.prompt}],
        response_format={"type": "json_object"},
        num_retries=0,
    )
    return str(resp.choices[0].message.content)


@workflow.defn(name="FloorLLM")
class FloorLLM:
    @workflow.run
    async def run(self, call: FloorCall) -> str:
        return await workflow.execute_activity(
            floor_complete, call, start_to_close_timeout=timedelta(minutes=1)
        )


@activity.defn(name="floor.pause")
async def floor_pause(ms: int) -> int:
    """Sleep ``ms`` milliseconds: a local activity's least work."""
    await asyncio.sleep(ms / 1000)
    return ms


@workflow.defn(name="FloorLocalFirst")
class FloorLocalFirst:
    @workflow.run
    async def run(self, inp: FloorPausedCall) -> str:
        await workflow.execute_local_activity(
            floor_pause, inp.pause_ms, start_to_close_timeout=timedelta(seconds=10)
        )
        return await workflow.execute_activity(
            floor_complete, inp.call, start_to_close_timeout=timedelta(minutes=1)
        )


@workflow.defn(name="FloorGate", sandboxed=False)
class FloorGate:
    def __init__(self) -> None:
        self._state = FloorState()

    @workflow.run
    async def run(self) -> FloorState:
        await workflow.wait_condition(lambda: bool(self._state.decision))
        return self._state

    @workflow.update
    async def decide(self, decision: FloorState) -> FloorState:
        self._state = decision
        return self._state

    @workflow.query
    def state(self) -> FloorState:
        return self._state
