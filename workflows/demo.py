"""``KeelDemo``: the main job the README's first command runs.

It shows each family built so far end to end: an LLM call through the gateway (to the
embedded local model), then an approval gate opened as a child workflow, decided by a
person (the demo decides it through the API), then the outcome.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from keel.demo import DEMO_WORKFLOW_TYPE, DemoInput, DemoResult
    from keel.gates import GateRequest
    from keel.llm import LLMMessage, LLMRequest
    from keel.refs import LLM_COMPLETE
    from workflows.common import call
    from workflows.gate import open_gate


@workflow.defn(name=DEMO_WORKFLOW_TYPE)
class KeelDemo:
    @workflow.run
    async def run(self, inp: DemoInput) -> DemoResult:
        llm = await call(
            LLM_COMPLETE,
            LLMRequest(
                model=inp.model,
                messages=[
                    LLMMessage(role="system", content="You write one short, plain sentence."),
                    LLMMessage(role="user", content=f"Describe {inp.topic} in one sentence."),
                ],
                params={"max_tokens": 64, "temperature": 0.0, "seed": 7},
            ),
            summary=f"draft about {inp.topic}",
        )
        draft = llm.content.strip()
        gate = await open_gate(
            GateRequest(
                name="publish",
                requester=inp.requester,
                approvers=inp.approvers,
                subject=f"Publish this draft? {draft[:200]}",
                details={"model": llm.model_name, "tokens": llm.usage.total_tokens},
                expires_in_s=inp.expires_in_s,
            )
        )
        return DemoResult(draft=draft, llm=llm, gate=gate, published=gate.status == "approved")
