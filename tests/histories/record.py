"""Record the replay corpus: ``uv run python -m tests.histories.record``.

WHEN TO RE-RECORD. ``tests/test_replay.py`` replays every history here against the
current workflow code. If you change a workflow on purpose and that test fails with a
``NondeterminismError``, the change alters the commands the workflow issues (an activity,
timer, child workflow, search attribute upsert added, removed or reordered). Then:

* if runs started on the old code may still be open anywhere (any deployed worker), keep
  the old path behind ``workflow.patched("<change-id>")`` and do NOT re-record: the old
  histories are exactly what proves the patch keeps those runs replayable. Re-record
  only later, when ``workflow.deprecate_patch`` is used and no old run can remain;
* if no such run can exist (the workflow was never deployed, or every old run is
  closed and past retention), re-record with this script and commit the new JSON files
  with the workflow change, saying so in the commit message.

Never re-record just to make a red replay test green: that deletes the evidence of the
break. Also re-record when you add a scenario (append its name to ``CORPUS`` in
``tests/histories/__init__.py``). See docs/replay.md.

WHAT IT DOES. Starts its own Temporal dev server (loopback, free ports, a temp dir), a
scripted OpenAI-compatible server and a webhook receiver (both loopback, in-process), runs
a Keel worker, drives each scenario, checks it ended as intended, and writes each
workflow's history (``handle.fetch_history().to_json()``) to ``tests/histories/<name>.json``.
Everything it starts is stopped before it exits: the dev server by its PID (process
group), the HTTP servers by shutdown. It takes about 20 s.

Options: ``--only NAME`` (repeatable) records some scenarios; ``--out DIR`` writes elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.service import RPCError

from client.gate import start_gate as start_gate_through_client
from client.srl import start_collection, upload_tasks
from client.temporal import connect
from keel.demo import DemoInput, DemoResult
from keel.design.steps import DesignAnswers, DesignInput, DesignResult, DesignStatus
from keel.design.steps import workflow_id as design_workflow_id
from keel.gates import (
    GATE_SUMMARY_MEMO,
    GateComment,
    GateDecision,
    GateRequest,
    GateState,
    GateStatus,
    GateSummaryMemo,
    gate_workflow_id,
)
from keel.mrp.run import MRPJobInput, MRPJobResult, workflow_id_for
from keel.rllm.run import RllmRunInput, RllmRunResult
from keel.settings import Settings
from keel.srl.steps import CollectionInput, EpisodeResult
from services.processes import TemporalDevServer, free_port
from store.artifacts import artifact_store_from_settings
from store.files import bundle_files
from tests.histories import CORPUS, HISTORIES_DIR
from tests.support.scripted_openai import (
    RecordedRequest,
    ScriptedOpenAIServer,
    ScriptedReply,
    write_models_config,
)
from tests.support.srl import (
    RENAME_F,
    SWAP_ANSWER,
    answer_with,
    divide_tasks,
    tasks_jsonl,
    two_step_task,
)
from tests.support.webhook_receiver import WebhookReceiver
from workers.main import build_worker
from workflows.demo import KeelDemo
from workflows.design import DesignPipeline
from workflows.gate import ApprovalGate
from workflows.mrp import MRPJob
from workflows.rllm import RllmApp

log = logging.getLogger("tests.histories.record")

# Fixed ids (each recording runs on a fresh server) keep re-recorded files easy to diff.
ID_PREFIX = "replay"
DEMO_DRAFT = "Durable workflows let AI work survive crashes and wait for people."
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RLLM_TEXT = "Temporal keeps workflow state durable. Workers can crash; the workflow resumes."
RLLM_SUMMARY = '{"summary": "Workflows survive worker crashes.", "sentences": 1}'
RLLM_KEYWORDS = '{"keywords": ["Temporal", "workflow", "temporal", "workers"]}'


@dataclass
class Ctx:
    client: Client
    task_queue: str
    webhook_url: str
    llm: ScriptedOpenAIServer
    settings: Settings


Histories = dict[str, str]  # file stem -> history JSON
Scenario = Callable[[Ctx], Awaitable[Histories]]


class ScenarioFailed(RuntimeError):
    """A scenario did not end as intended; its history would be the wrong evidence."""


def expect(ok: bool, what: str) -> None:
    if not ok:
        raise ScenarioFailed(what)


async def history_json(handle: WorkflowHandle) -> str:
    history = await handle.fetch_history()
    return history.to_json() + "\n"


async def start_gate(ctx: Ctx, scenario: str, **kw: object) -> WorkflowHandle:
    request = GateRequest(name="deploy", requester="alice", approvers=["bob"], **kw)  # type: ignore[arg-type]
    return await ctx.client.start_workflow(
        ApprovalGate.run,
        request,
        id=gate_workflow_id(f"{ID_PREFIX}/{scenario}", request.name),
        task_queue=ctx.task_queue,
    )


async def poll(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = 30) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if await check():
            return
        await asyncio.sleep(0.1)
    raise ScenarioFailed(f"timed out waiting for {what}")


# -- scenarios -----------------------------------------------------------------------------


async def gate_approved_update(ctx: Ctx, scenario: str = "gate_approved_update") -> Histories:
    """A comment (update), a forged decision (signal, refused and audited), then approval."""
    handle = await start_gate(ctx, scenario, subject="ship v2")
    state = await handle.execute_update(
        ApprovalGate.comment,
        GateComment(actor="carol", comment="what about rollback?", request_id="c-1"),
    )
    expect(len(state.comments) == 1, "comment applied")
    await handle.signal(ApprovalGate.decide_signal, GateDecision(decision="approve", actor="eve"))

    async def refused() -> bool:
        return bool((await handle.query(ApprovalGate.state)).refused)

    # The refusal must be in history before the approval, or the scenario is a race.
    await poll(refused, "the forged signal to be refused")
    await handle.execute_update(
        ApprovalGate.decide,
        GateDecision(decision="approve", actor="bob", comment="lgtm", request_id="r-1"),
    )
    result = await handle.result()
    expect(result.status == GateStatus.APPROVED, f"approved, got {result.status}")
    expect([r.actor for r in result.refused] == ["eve"], "eve's signal refused")
    return {scenario: await history_json(handle)}


async def gate_local_audit(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-local-handler-audit``: the comment, refusal
    and decision records are local activities (markers), "opened" a regular one."""
    return await gate_approved_update(ctx, "gate_local_audit")


async def gate_audit_after_answer(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-audit-after-answer``: each handler answers
    at once and its audit row (comment, refusal, decision) is written after, in order, by
    the writer task as a regular activity."""
    return await gate_approved_update(ctx, "gate_audit_after_answer")


async def gate_audit_rows_at_once(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-audit-rows-at-once``: each audit row's
    activity starts where the row is made (no writer task between them)."""
    return await gate_approved_update(ctx, "gate_audit_rows_at_once")


async def gate_open_local(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-open-local``: the "opened" row and the
    webhook-target answer are local activities in the first task; no webhook configured,
    so no notice activity at all."""
    return await gate_approved_update(ctx, "gate_open_local")


async def gate_handler_rows_local(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-handler-rows-local``: the comment's, the
    refusal's and the decision's rows are local activities of the tasks that answer them
    (markers); no activity is scheduled at all."""
    return await gate_approved_update(ctx, "gate_handler_rows_local")


async def gate_readers_signal(ctx: Ctx) -> Histories:
    """A gate started without ``KeelReaders`` (as before it existed) gets it from
    ``keel_refresh_readers`` (``keel migrate-search-attributes``), then is approved."""
    return await _gate_gets_readers(ctx, "gate_readers_signal", signal=True)


async def gate_self_readers(ctx: Ctx) -> Histories:
    """A gate started with no ``KeelReaders`` (``temporal workflow start``) sets them itself
    from its request (patch ``gate-self-readers``), then is approved."""
    return await _gate_gets_readers(ctx, "gate_self_readers", signal=False)


async def _gate_gets_readers(ctx: Ctx, scenario: str, *, signal: bool) -> Histories:
    handle = await start_gate(ctx, scenario)
    key = SearchAttributeKey.for_keyword_list("KeelReaders")
    if signal:
        await handle.signal("keel_refresh_readers")

    async def has_readers() -> bool:
        return (await handle.describe()).typed_search_attributes.get(key) is not None

    await poll(has_readers, "the gate to set KeelReaders")
    readers = (await handle.describe()).typed_search_attributes.get(key)
    expect(readers == ["user:alice", "user:bob"], f"KeelReaders from the request, got {readers}")
    await handle.execute_update(
        ApprovalGate.decide,
        GateDecision(decision="approve", actor="bob", comment="ok", request_id="r-1"),
    )
    result = await handle.result()
    expect(result.status == GateStatus.APPROVED, f"approved, got {result.status}")
    return {scenario: await history_json(handle)}


async def gate_summary_memo(ctx: Ctx) -> Histories:
    """A gate started with no memo (``temporal workflow start``, a workflow's child) sets
    its summary memo itself from its request (patch ``gate-summary-memo``), after its
    ``KeelReaders``; then it is approved."""
    scenario = "gate_summary_memo"
    handle = await start_gate(ctx, scenario, subject="ship v3", expires_in_s=900)

    async def has_memo() -> bool:
        return GATE_SUMMARY_MEMO in await (await handle.describe()).memo()

    await poll(has_memo, "the gate to set its summary memo")
    desc = await handle.describe()
    memo = await desc.memo_value(GATE_SUMMARY_MEMO, type_hint=GateSummaryMemo)
    want = GateSummaryMemo(
        requester="alice", subject="ship v3", approvers=["bob"], expires_in_s=900
    )
    expect(memo == want, f"the summary memo from the request, got {memo}")
    await handle.execute_update(
        ApprovalGate.decide,
        GateDecision(decision="approve", actor="bob", comment="ok", request_id="r-1"),
    )
    result = await handle.result()
    expect(result.status == GateStatus.APPROVED, f"approved, got {result.status}")
    return {scenario: await history_json(handle)}


async def gate_summary_memo_at_start(ctx: Ctx) -> Histories:
    """A gate started through ``client.gate.start_gate`` (its access and summary memos and
    ``KeelReaders`` at the start) after patch ``gate-summary-memo``: it sets nothing
    itself, then is rejected by signal."""
    scenario = "gate_summary_memo_at_start"
    request = GateRequest(name="deploy", requester="alice", approvers=["bob"], subject="v4")
    handle = await start_gate_through_client(
        ctx.client,
        request,
        gate_id=gate_workflow_id(f"{ID_PREFIX}/{scenario}", request.name),
        task_queue=ctx.task_queue,
    )
    await handle.signal(
        ApprovalGate.decide_signal, GateDecision(decision="reject", actor="bob", comment="no")
    )
    result = await handle.result()
    expect(result.status == GateStatus.REJECTED, f"rejected, got {result.status}")
    return {scenario: await history_json(handle)}


async def gate_rejected_signal(ctx: Ctx) -> Histories:
    handle = await start_gate(ctx, "gate_rejected_signal")
    await handle.signal(
        ApprovalGate.decide_signal, GateDecision(decision="reject", actor="bob", comment="no")
    )
    result = await handle.result()
    expect(result.status == GateStatus.REJECTED, f"rejected, got {result.status}")
    return {"gate_rejected_signal": await history_json(handle)}


async def gate_expired_with_reminders(
    ctx: Ctx, scenario: str = "gate_expired_with_reminders"
) -> Histories:
    """Real time, kept short: reminders at ~1 s and ~2 s, expiry at 3 s, webhooks delivered."""
    handle = await start_gate(
        ctx,
        scenario,
        expires_in_s=3,
        remind_every_s=1,
        max_reminders=2,
        webhook_url=ctx.webhook_url,
    )
    result = await handle.result()
    expect(result.status == GateStatus.EXPIRED, f"expired, got {result.status}")
    expect(result.reminders_sent == 2, f"2 reminders, got {result.reminders_sent}")
    return {scenario: await history_json(handle)}


async def gate_open_local_webhook(ctx: Ctx) -> Histories:
    """gate_expired_with_reminders after patch ``gate-open-local``: a webhook is set, so
    the target answer is yes and every notice is sent as before."""
    return await gate_expired_with_reminders(ctx, "gate_open_local_webhook")


async def gate_duplicate_request(ctx: Ctx, scenario: str = "gate_duplicate_request") -> Histories:
    """The same decision twice at once (a client retry): applied once, same answer twice."""
    handle = await start_gate(ctx, scenario)
    decision = GateDecision(decision="approve", actor="bob", request_id="req-1")
    first, again = await asyncio.gather(
        handle.execute_update(ApprovalGate.decide, decision),
        handle.execute_update(ApprovalGate.decide, decision),
    )
    expect(first == again, "both updates answered with the same state")
    result = await handle.result()
    expect(result.status == GateStatus.APPROVED, f"approved, got {result.status}")
    return {scenario: await history_json(handle)}


async def gate_open_local_early(ctx: Ctx) -> Histories:
    """gate_duplicate_request after patch ``gate-open-local``: the decisions are sent right
    after the start, so they may reach the run before its local activities answer."""
    return await gate_duplicate_request(ctx, "gate_open_local_early")


async def gate_handler_rows_local_early(ctx: Ctx) -> Histories:
    """gate_duplicate_request after patch ``gate-handler-rows-local``: the two identical
    decisions reach the run with its first task, beside the opening's local activities."""
    return await gate_duplicate_request(ctx, "gate_handler_rows_local_early")


async def gate_one_marker(ctx: Ctx) -> Histories:
    """gate_approved_update after patch ``gate-one-marker``: the first task records that
    one patch marker (none of the eight before it), sets its search attributes in one
    upsert, and the decision leaves the expiry timer to lapse (no ``TimerCanceled``)."""
    return await gate_approved_update(ctx, "gate_one_marker")


async def gate_one_marker_early(ctx: Ctx) -> Histories:
    """gate_duplicate_request after patch ``gate-one-marker``."""
    return await gate_duplicate_request(ctx, "gate_one_marker_early")


async def gate_one_marker_expired(ctx: Ctx) -> Histories:
    """gate_expired_with_reminders after patch ``gate-one-marker``: the expiry is its own
    timer task's, and still ends the gate ``expired`` after two reminders."""
    return await gate_expired_with_reminders(ctx, "gate_one_marker_expired")


async def gate_shared_key(ctx: Ctx) -> Histories:
    """One request id used by a comment and then by another actor's approval (patch
    ``gate-dedup-by-actor-action``): both apply."""
    handle = await start_gate(ctx, "gate_shared_key")
    await handle.execute_update(
        ApprovalGate.comment, GateComment(actor="alice", comment="please", request_id="K")
    )
    state = await handle.execute_update(
        ApprovalGate.decide, GateDecision(decision="approve", actor="bob", request_id="K")
    )
    expect(state.status == GateStatus.APPROVED, f"approved, got {state.status}")
    result = await handle.result()
    expect(len(result.comments) == 1, "the comment is kept")
    return {"gate_shared_key": await history_json(handle)}


async def demo_approved(ctx: Ctx, scenario: str = "demo_approved") -> Histories:
    """KeelDemo end to end: scripted LLM call, then its publish gate approved by update."""
    wid = f"{ID_PREFIX}/{scenario}"
    handle = await ctx.client.start_workflow(
        KeelDemo.run,
        DemoInput(requester="alice", approvers=["bob"], expires_in_s=600),
        id=wid,
        task_queue=ctx.task_queue,
    )
    gate = ctx.client.get_workflow_handle(gate_workflow_id(wid, "publish"), result_type=GateState)

    async def gate_started() -> bool:
        try:
            await gate.describe()
        except RPCError:
            return False
        return True

    await poll(gate_started, "the publish gate to start")
    await gate.execute_update(
        ApprovalGate.decide,
        GateDecision(decision="approve", actor="bob", comment="ship it", request_id="pub-1"),
    )
    result = await handle.result()
    expect(isinstance(result, DemoResult), "a DemoResult")
    expect(result.published and result.draft == DEMO_DRAFT, f"published draft, got {result}")
    if scenario != "demo_approved":
        # After patch ``gate-child-readers``: the gate starts with who may read it.
        desc = await gate.describe()
        readers = desc.typed_search_attributes.get(
            SearchAttributeKey.for_keyword_list("KeelReaders")
        )
        expect(readers == ["user:alice", "user:bob"], f"the gate's KeelReaders, got {readers}")
    return {
        scenario: await history_json(handle),
        f"{scenario}_gate": await history_json(gate),
    }


async def demo_child_readers(ctx: Ctx) -> Histories:
    """demo_approved after patch ``gate-child-readers``: the publish gate (a child) starts
    with ``KeelReaders`` (its requester and approvers), behind the patch marker."""
    return await demo_approved(ctx, "demo_child_readers")


async def run_rllm(ctx: Ctx, scenario: str, app: str) -> WorkflowHandle:
    handle = await ctx.client.start_workflow(
        RllmApp.run,
        RllmRunInput(path=app, files=bundle_files(EXAMPLES / app), input=RLLM_TEXT),
        id=f"{ID_PREFIX}/{scenario}",
        task_queue=ctx.task_queue,
    )
    return handle


async def rllm_success(ctx: Ctx) -> Histories:
    """summary.rllm answered validly at the first attempt."""
    ctx.llm.enqueue(ScriptedReply(content=RLLM_SUMMARY))
    handle = await run_rllm(ctx, "rllm_success", "summary.rllm")
    result: RllmRunResult = await handle.result()
    expect(result.retries == 0 and result.output["sentences"] == 1, f"first try: {result}")
    return {"rllm_success": await history_json(handle)}


async def rllm_local_steps(ctx: Ctx) -> Histories:
    """summary.rllm after patch ``rllm-local-load-and-stats``: load and the stats record
    as local activities (markers), the model call as a regular activity."""
    ctx.llm.enqueue(ScriptedReply(content=RLLM_SUMMARY))
    handle = await run_rllm(ctx, "rllm_local_steps", "summary.rllm")
    result: RllmRunResult = await handle.result()
    expect(result.retries == 0 and result.output["sentences"] == 1, f"first try: {result}")
    return {"rllm_local_steps": await history_json(handle)}


async def rllm_progress_memo(ctx: Ctx) -> Histories:
    """summary.rllm after patch ``keel-progress-memo``: the step the model attempt waits in
    (``step attempt:1``) upserted as the run's progress memo ``keel_progress``."""
    ctx.llm.enqueue(ScriptedReply(content=RLLM_SUMMARY))
    handle = await run_rllm(ctx, "rllm_progress_memo", "summary.rllm")
    result: RllmRunResult = await handle.result()
    expect(result.retries == 0, f"first try: {result}")
    history = await history_json(handle)
    expect("keel_progress" in history, "the progress memo is upserted")
    return {"rllm_progress_memo": history}


async def rllm_recovered(ctx: Ctx) -> Histories:
    """summary.rllm: the first answer lacks a required field, the recovery retry fixes it."""
    ctx.llm.enqueue(
        ScriptedReply(content='{"summary": "Workflows survive worker crashes."}'),
        ScriptedReply(content=RLLM_SUMMARY),
    )
    handle = await run_rllm(ctx, "rllm_recovered", "summary.rllm")
    result: RllmRunResult = await handle.result()
    expect([a.ok for a in result.attempts] == [False, True], f"recovered: {result.attempts}")
    return {"rllm_recovered": await history_json(handle)}


async def rllm_composed(ctx: Ctx) -> Histories:
    """compose_summary_keywords.rllm: two children (one with pre and post blocks), merged."""

    def by_prompt(req: RecordedRequest) -> ScriptedReply:
        messages = (req.json or {}).get("messages") or [{}]
        prompt = str(messages[-1].get("content", ""))
        return ScriptedReply(content=RLLM_KEYWORDS if "keywords" in prompt else RLLM_SUMMARY)

    before = ctx.llm.default
    ctx.llm.default = by_prompt  # the children run in parallel: answer by what is asked
    try:
        handle = await run_rllm(ctx, "rllm_composed", "compose_summary_keywords.rllm")
        result: RllmRunResult = await handle.result()
    finally:
        ctx.llm.default = before
    expect(
        result.output["keywords"] == ["Temporal", "workflow", "workers"],
        f"merged output: {result.output}",
    )
    child = ctx.client.get_workflow_handle(f"{handle.id}/keywords_of")
    return {
        "rllm_composed": await history_json(handle),
        "rllm_composed_keywords": await history_json(child),
    }


MRP_CONFIG = Path(__file__).resolve().parents[1] / "support" / "mrp_operators" / "mrp.yaml"


# Free text that states no region: the pipeline asks, then a reviewer rejects round 1.
DESIGN_TEXT = "Nightly batch retraining of a churn model on internal CRM data, on AWS."
DESIGN_EXTRACTED = json.dumps(
    {
        "constraints": {
            "cloud": "aws",
            "workload_types": ["batch"],
            "data_classification": "internal",
        },
        "ambiguous": {"budget_band": "no budget named"},
    }
)


async def design_gate(ctx: Ctx, parent: str, name: str, decision: str, comment: str) -> None:
    gate = ctx.client.get_workflow_handle(gate_workflow_id(parent, name), result_type=GateState)

    async def gate_started() -> bool:
        try:
            await gate.describe()
        except RPCError:
            return False
        return True

    await poll(gate_started, f"design gate {name} to start")
    await gate.execute_update(
        "decide",
        GateDecision(decision=decision, actor="bob", comment=comment, request_id=name),  # type: ignore[arg-type]
        result_type=GateState,
    )


async def design_replanned(ctx: Ctx) -> Histories:
    """DesignPipeline: intake through the model, a question answered by Update, round 1
    rejected with a comment, the planner again, round 2 approved, the repository generated
    and validated; then an iteration on the approved set whose cost rise forces the gate."""
    project = f"{ID_PREFIX}-design"
    ctx.llm.enqueue(ScriptedReply(content=DESIGN_EXTRACTED))
    handle = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            requirements=DESIGN_TEXT,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )

    async def asking() -> bool:
        status = await handle.query("status")
        return bool(status["phase"] == "waiting_for_answers")

    await poll(asking, "the design questions")
    await handle.execute_update(
        "answers",
        DesignAnswers(answers={"regions": ["us-east-1"], "budget_band": "medium"}),
        result_type=DesignStatus,
    )
    await design_gate(ctx, handle.id, "plan-r1", "reject", "too expensive")
    await design_gate(ctx, handle.id, "plan-r2", "approve", "")
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}")
    expect(result.plan_rounds == 2, f"two planner rounds, got {result.plan_rounds}")

    second = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds2",
            requester="alice",
            previous_decision_set="ds1",
            intake={"regions": ["us-east-1", "us-west-2"]},
            require_approval=False,
            generate=False,
        ),
        id=design_workflow_id(project, "ds2"),
        task_queue=ctx.task_queue,
    )
    await design_gate(ctx, second.id, "plan-r1", "approve", "")
    iterated: DesignResult = await second.result()
    expect(iterated.diff is not None, "a diff against ds1")
    expect((iterated.cost_delta_usd or 0) > 0, f"a cost rise: {iterated.cost_delta_usd}")
    return {
        "design_replanned": await history_json(handle),
        "design_iteration": await history_json(second),
    }


# What SmolLM2 made of the issue 24 paragraph, with the required fields filled: the
# availability read as 9.5 (the schema's minimum is 90), twice.
DESIGN_UNFIT_TEXT = (
    "Nightly retraining of a churn model on 200 GB/day of event data in eu-west-1, GDPR, "
    "batch scoring plus a low-latency API under 100 ms, budget under $2k/month"
)
DESIGN_UNFIT = json.dumps(
    {
        "constraints": {
            "cloud": "aws",
            "regions": ["eu-west-1"],
            "budget_band": "medium",
            "workload_types": ["batch", "online"],
            "data_classification": "confidential",
            "sla_latency_ms": 100,
            "compliance": ["gdpr"],
            "availability_target": 9.5,
        },
        "ambiguous": {},
    }
)


async def design_intake_unfit(ctx: Ctx) -> Histories:
    """DesignPipeline (patch ``design-intake-unfit``): the intake reply does not fit, the
    re-ask neither; the valid fields are kept and the unfit one asked, answered by Update;
    no gate, no codegen."""
    project = f"{ID_PREFIX}-design-unfit"
    ctx.llm.enqueue(ScriptedReply(content=DESIGN_UNFIT), ScriptedReply(content=DESIGN_UNFIT))
    handle = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            requirements=DESIGN_UNFIT_TEXT,
            require_approval=False,
            generate=False,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )

    async def asking() -> bool:
        status = await handle.query("status")
        fields = [q["field"] for q in status["questions"]]
        return bool(status["phase"] == "waiting_for_answers" and fields == ["availability_target"])

    await poll(asking, "the question about the availability")
    await handle.execute_update(
        "answers",
        DesignAnswers(answers={"availability_target": 99.5}),
        result_type=DesignStatus,
    )
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}")
    expect(result.constraints.availability_target == 99.5, "the answered availability")
    expect(result.constraints.regions == ["eu-west-1"], "the valid fields kept")
    return {"design_intake_unfit": await history_json(handle)}


async def design_cost_workload(ctx: Ctx, scenario: str = "design_cost_workload") -> Histories:
    """DesignPipeline from a guided form that states its workload: the cost critic sizes the
    bill of materials from it (patch ``design-cost-from-workload``); no gate, no codegen."""
    project = f"{ID_PREFIX}-design-cost" + ("" if scenario == "design_cost_workload" else "-p")
    handle = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            intake={
                "cloud": "aws",
                "regions": ["us-east-1"],
                "budget_band": "medium",
                "data_classification": "internal",
                "workload_types": ["batch"],
                "throughput": {"data_gb_per_day": 50},
                "retention_days": 90,
                "training_runs_per_month": 30,
            },
            require_approval=False,
            generate=False,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}")
    cost = result.cost
    expect(cost is not None and bool(cost.workload), f"a workload-sized estimate: {cost}")
    stated = {v.name: v.value for v in (cost.workload if cost else []) if v.source == "stated"}
    expect(stated.get("data_gb_per_day") == 50, f"the stated volume priced: {stated}")
    return {scenario: await history_json(handle)}


async def design_progress_memo(ctx: Ctx) -> Histories:
    """``design_cost_workload`` recorded with patch ``keel-progress-memo``: the run's
    progress memo (its phase or node, and the nodes run) upserted as it goes."""
    return await design_cost_workload(ctx, "design_progress_memo")


async def start_batch_codegen(ctx: Ctx, project: str, *, repair_rounds: int) -> WorkflowHandle:
    """DesignPipeline from the guided batch form on AWS, no gate, the repository written by
    the scripted model (``codegen_model="local"``) with ``repair_rounds`` repair rounds."""
    return await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            intake={
                "cloud": "aws",
                "workload_types": ["batch"],
                "data_classification": "internal",
                "budget_band": "medium",
                "regions": ["us-east-1"],
            },
            require_approval=False,
            codegen="litellm",
            codegen_model="local",
            repair_rounds=repair_rounds,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )


async def design_validation_failed(ctx: Ctx) -> Histories:
    """DesignPipeline with patch ``design-validate-shipped-tree``: the guided form, no gate,
    a model's repository (scripted) with an unencrypted S3 bucket; the validators run on
    the shipped tree (rationale and SBOM added), checkov fails, the run ends
    ``validation_failed`` with the validated tree as its archive."""
    from activities.design.codegen import render_request
    from tests.design.codegen_cases import request_for

    tree = render_request(request_for("batch_training"))
    tree["infra/ingest/raw.tf"] = 'resource "aws_s3_bucket" "raw" {\n  bucket = "raw"\n}\n'
    ctx.llm.enqueue(ScriptedReply(content=json.dumps({"files": tree})))
    project = f"{ID_PREFIX}-design-vf"
    # Recorded before repair rounds: a re-recording keeps the failure unrepaired.
    handle = await start_batch_codegen(ctx, project, repair_rounds=0)
    result: DesignResult = await handle.result()
    expect(result.status == "validation_failed", f"validation_failed, got {result.status}")
    expect(result.validation.get("checkov") == "failed", f"checkov failed: {result.validation}")
    expect(result.validated_tree_digest is not None, "the shipped tree was validated")
    return {"design_validation_failed": await history_json(handle)}


async def design_repaired(ctx: Ctx) -> Histories:
    """DesignPipeline with patch ``design-repair-rounds``: the guided form, no gate, a
    scripted model's repository whose handler (``app/score.py``) has a syntax error; ruff,
    mypy and pytest fail, one repair round (``design.repair``: ruff --fix, then the
    model's fixed handler) and the validators again, which pass: the run completes."""
    from tests.support.design_repo import MODEL_FILES

    handler = "app/score.py"
    broken = {**MODEL_FILES, handler: MODEL_FILES[handler].replace("len(values)", "len(values")}
    ctx.llm.enqueue(
        ScriptedReply(content=json.dumps({"files": broken})),
        ScriptedReply(content=json.dumps({"files": {handler: MODEL_FILES[handler]}})),
    )
    project = f"{ID_PREFIX}-design-rp"
    handle = await start_batch_codegen(ctx, project, repair_rounds=2)
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}: {result.validation}")
    expect(len(result.repairs) == 1, f"one repair round: {result.repairs}")
    expect(result.repairs[0].files_changed == [handler], f"the handler: {result.repairs}")
    return {"design_repaired": await history_json(handle)}


async def design_auto_revised(ctx: Ctx) -> Histories:
    """DesignPipeline (patch ``design-auto-revise``), the rules alone: a streaming form on a
    medium budget whose estimate is over the band's ceiling; the critics send the plan
    back once (planner round 2, cheaper ingest), then policy; no gate, no codegen."""
    project = f"{ID_PREFIX}-design-revised"
    handle = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            intake={
                "cloud": "aws",
                "regions": ["us-east-1"],
                "budget_band": "medium",
                "data_classification": "internal",
                "workload_types": ["streaming"],
                "deployment_pref": "containers",
                "throughput": {"data_gb_per_day": 500, "requests_per_s": 10},
            },
            require_approval=False,
            generate=False,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}")
    expect(result.plan_rounds == 2, f"the critics sent the plan back once: {result.plan_rounds}")
    expect(result.nodes_run.count("planner") == 2, f"two planner runs: {result.nodes_run}")
    return {"design_auto_revised": await history_json(handle)}


#: The rules' plan of DESIGN_AGENT_FORM, by capability.
DESIGN_AGENT_RULES_PLAN = {
    "ingest": "ingest:s3-batch",
    "transform": "transform:glue-etl",
    "store": "store:s3-lakehouse",
    "feature": "feature:glue-offline-features",
    "train": "train:ecs-fargate-jobs",
    "serve": "serve:sagemaker-batch-transform",
    "observe": "observe:cloudwatch",
    "govern": "govern:lake-formation-cloudtrail",
}


async def design_agent_planned(ctx: Ctx) -> Histories:
    """DesignPipeline (patch ``design-agents``) with a capable model (the recorder's
    ``agent`` entry): the planner agent proposes a serving pattern outside the catalogue
    (refused by the rules, recorded) and another training pattern (taken); the three
    critic agents find nothing; no gate, no codegen."""
    choices = {**DESIGN_AGENT_RULES_PLAN, "serve": "serve:triton-gpu-fleet"}
    choices["train"] = "train:sagemaker-training"
    planner = {
        "choices": [{"capability": k, "pattern_id": v, "why": "r"} for k, v in choices.items()],
        "notes": "recorded",
    }
    ctx.llm.enqueue(
        ScriptedReply(content=json.dumps(planner)),
        *(ScriptedReply(content='{"findings": [], "summary": "none"}') for _ in range(3)),
    )
    project = f"{ID_PREFIX}-design-agents"
    handle = await ctx.client.start_workflow(
        DesignPipeline.run,
        DesignInput(
            project=project,
            decision_set="ds1",
            requester="alice",
            model="agent",
            intake={
                "cloud": "aws",
                "regions": ["eu-west-1"],
                "budget_band": "medium",
                "data_classification": "internal",
                "workload_types": ["batch"],
            },
            require_approval=False,
            generate=False,
        ),
        id=design_workflow_id(project, "ds1"),
        task_queue=ctx.task_queue,
    )
    result: DesignResult = await handle.result()
    expect(result.status == "completed", f"completed, got {result.status}")
    chosen = {c.capability.value: c.pattern_id for c in result.plan.choices} if result.plan else {}
    expected = {**DESIGN_AGENT_RULES_PLAN, "train": "train:sagemaker-training"}
    expect(chosen == expected, f"the refused proposal left out, the other taken: {chosen}")
    return {"design_agent_planned": await history_json(handle)}


def mrp_job(job_id: str, operator: str, params: str, extra: str = "") -> str:
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: ["alpha beta", "gamma", "delta epsilon zeta", "eta", "theta iota", "kappa"]
  shard_size: 1
map:
  operator: {operator}
  params: {params}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:
  max_workers: 2
  budget_units: "100000"
{extra}"""


async def mrp_gated(ctx: Ctx, job_id: str, decision: str) -> tuple[MRPJobResult, str]:
    """MRPJob on threads in windows of 2 shards with a publish gate that bob decides."""
    wid = workflow_id_for(job_id, f"rec-{job_id}")
    yaml_text = mrp_job(
        job_id,
        "word-count@1.0.0",
        "{}",
        "approval:\n  gate: publish\n  approvers: [bob]\n  expires_in_s: 600\n",
    )
    handle = await ctx.client.start_workflow(
        MRPJob.run,
        MRPJobInput(job_yaml=yaml_text, backend="threads", window_size=2, requester="alice"),
        id=wid,
        task_queue=ctx.task_queue,
    )
    gate = ctx.client.get_workflow_handle(gate_workflow_id(wid, "publish"), result_type=GateState)

    async def gate_started() -> bool:
        try:
            await gate.describe()
        except RPCError:
            return False
        return True

    await poll(gate_started, "the publish gate to start")
    decided = await gate.execute_update(
        "decide",
        GateDecision(decision=decision, actor="bob", comment=decision, request_id=f"{job_id}-1"),  # type: ignore[arg-type]
        result_type=GateState,
    )
    expect(decided.status != GateStatus.PENDING, f"decided, got {decided.status}")
    result: MRPJobResult = await handle.result()
    return result, await history_json(handle)


async def mrp_approved(ctx: Ctx) -> Histories:
    """Map, reduce, publish gate approved, produce."""
    result, history = await mrp_gated(ctx, "mrp-approved", "approve")
    expect(result.status == "succeeded", f"succeeded, got {result.status}")
    expect(result.counters.run == 6 and len(result.produced) == 2, f"6 shards, 2 files: {result}")
    return {"mrp_approved": history}


async def mrp_progress_memo(ctx: Ctx) -> Histories:
    """mrp_approved after patch ``keel-progress-memo``: each phase and each finished window
    upserted as the run's progress memo ``keel_progress`` (compile, map 0/3 .. 3/3
    windows, reduce, approval, produce)."""
    result, history = await mrp_gated(ctx, "mrp-progress", "approve")
    expect(result.status == "succeeded", f"succeeded, got {result.status}")
    expect("keel_progress" in history, "the progress memo is upserted")
    return {"mrp_progress_memo": history}


async def mrp_rejected(ctx: Ctx) -> Histories:
    """The publish gate rejected: map and reduce ran, produce never does."""
    result, history = await mrp_gated(ctx, "mrp-rejected", "reject")
    expect(result.status == "rejected", f"rejected, got {result.status}")
    expect(not result.produced, f"nothing produced: {result.produced}")
    return {"mrp_rejected": history}


async def mrp_evaluation_failed(ctx: Ctx) -> Histories:
    """MRPJob whose evaluator scores under min_score: the run ends before produce."""
    evaluator = (
        "evaluator:\n  operator: rules-check@1.0.0\n  params:\n    rules:\n"
        '      - {name: impossible, path: totals.items, op: "==", value: -1}\n'
        '  min_score: "1"\n'
    )
    handle = await ctx.client.start_workflow(
        MRPJob.run,
        MRPJobInput(
            job_yaml=mrp_job("mrp-eval-failed", "word-count@1.0.0", "{}", evaluator),
            backend="threads",
            window_size=2,
        ),
        id=workflow_id_for("mrp-eval-failed", "rec-eval-failed"),
        task_queue=ctx.task_queue,
    )
    result: MRPJobResult = await handle.result()
    expect(result.status == "evaluation_failed", f"evaluation_failed, got {result.status}")
    return {"mrp_evaluation_failed": await history_json(handle)}


async def mrp_overlap_windows(ctx: Ctx) -> Histories:
    """MRPJob with windows larger than max_workers (4 shards, 2 workers): after patch
    ``mrp-overlap-windows`` two windows run at once, one worker each."""
    handle = await ctx.client.start_workflow(
        MRPJob.run,
        MRPJobInput(
            job_yaml=mrp_job("mrp-overlap", "word-count@1.0.0", "{}"),
            backend="threads",
            window_size=4,
        ),
        id=workflow_id_for("mrp-overlap", "rec-overlap"),
        task_queue=ctx.task_queue,
    )
    result: MRPJobResult = await handle.result()
    expect(result.status == "succeeded", f"succeeded, got {result.status}")
    history = await history_json(handle)
    expect("core_patch" in history, "the overlap patch marker is recorded")
    return {"mrp_overlap_windows": history}


async def mrp_budget_exceeded(ctx: Ctx) -> Histories:
    """MRPJob whose shards cost more than estimated: the kill switch cancels the map."""
    handle = await ctx.client.start_workflow(
        MRPJob.run,
        MRPJobInput(
            job_yaml=mrp_job("mrp-budget", "expensive@1.0.0", '{extra_units_per_item: "100"}'),
            backend="threads",
            window_size=1,
        ),
        id=workflow_id_for("mrp-budget", "rec-budget"),
        task_queue=ctx.task_queue,
    )
    result: MRPJobResult = await handle.result()
    expect(result.status == "budget_exceeded", f"budget_exceeded, got {result.status}")
    return {"mrp_budget_exceeded": await history_json(handle)}


async def mrp_partial_success(ctx: Ctx) -> Histories:
    """MRPJob with ``map.min_success_ratio: 0.5`` whose flaky operator fails 2 of 6 shards
    for good: after patch ``mrp-min-success-ratio`` the windows go on, and the run reduces
    over the 4 shards that succeeded."""
    params = json.dumps(
        {
            "state_dir": str(ctx.settings.data_dir / "flaky-partial"),
            "fail_times": 1000,
            "only_shards": ["shard-000001", "shard-000004"],
        }
    )
    yaml_text = mrp_job("mrp-partial", "flaky@1.0.0", params).replace(
        "  params: ", '  min_success_ratio: "0.5"\n  params: ', 1
    )
    handle = await ctx.client.start_workflow(
        MRPJob.run,
        MRPJobInput(
            job_yaml=yaml_text.replace("max_workers: 2", "max_workers: 2\n  max_shard_retries: 0"),
            backend="threads",
            window_size=2,
        ),
        id=workflow_id_for("mrp-partial", "rec-partial"),
        task_queue=ctx.task_queue,
    )
    result: MRPJobResult = await handle.result()
    expect(result.status == "succeeded", f"succeeded, got {result.status}")
    expect(result.counters.failed == 2, f"2 failed shards: {result.counters}")
    history = await history_json(handle)
    marker = base64.b64encode(b'{"id":"mrp-min-success-ratio","deprecated":false}').decode()
    expect(marker in history, "the min-success-ratio patch marker is recorded")
    return {"mrp_partial_success": history}


async def srl_collection(
    ctx: Ctx,
    name: str = f"{ID_PREFIX}-srl",
    stems: tuple[str, str, str] = (
        "srl_collection",
        "srl_collection_last",
        "srl_episode_recovered",
    ),
) -> Histories:
    """A teacher collection of three tasks, two per run (so it continues as new once); one
    answer is malformed (a recorded step with reward -1) and that episode's second step
    is verified."""
    data = tasks_jsonl(divide_tasks(3))
    digest, count = upload_tasks(artifact_store_from_settings(ctx.settings), data)
    inp = CollectionInput(
        collection=name,
        tasks_digest=digest,
        task_count=count,
        source="teacher",
        model="local",
        window=2,
        per_run=2,
        step_mode="free_running",  # step 2 goes on from the malformed step 1
    )
    before = ctx.llm.default
    ctx.llm.enqueue(ScriptedReply(content="no tags at all"))
    ctx.llm.default = ScriptedReply(content=SWAP_ANSWER)
    try:
        handle = await start_collection(ctx.client, inp, task_queue=ctx.task_queue)
        result = await handle.result()
    finally:
        ctx.llm.default = before
    t = result.totals
    expect((t.episodes, t.steps, t.verified_steps, t.format_errors) == (3, 4, 3, 1), f"{t}")
    first_run = ctx.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    episodes = [
        ctx.client.get_workflow_handle(f"srl/{inp.collection}/swap-{i}", result_type=EpisodeResult)
        for i in range(3)
    ]
    two_steps = None
    for ep in episodes:
        r = await ep.result()
        if r.steps == 2:
            two_steps = ep
    expect(two_steps is not None, "an episode with a malformed step and a verified one")
    assert two_steps is not None
    return {
        stems[0]: await history_json(first_run),
        stems[1]: await history_json(handle),
        stems[2]: await history_json(two_steps),
    }


async def srl_progress_memo(ctx: Ctx) -> Histories:
    """srl_collection after patch ``keel-progress-memo``: each run of the collection
    upserts its progress memo ``keel_progress`` (episodes done of all) at its start, once
    the task window is read and after each episode."""
    histories = await srl_collection(
        ctx,
        f"{ID_PREFIX}-srl-progress",
        ("srl_collection_progress", "srl_collection_progress_last", "srl_episode_progress"),
    )
    for stem in ("srl_collection_progress", "srl_collection_progress_last"):
        expect("keel_progress" in histories[stem], f"{stem}: the progress memo is upserted")
    return histories


async def srl_resume(ctx: Ctx) -> Histories:
    """A teacher collection of two tasks with two samples each (episodes ``swap-<i>`` and
    ``swap-<i>~s1``, each with its own seed), then the same collection run again: every
    step is found recorded (patch ``srl-resume-recorded``), no model is asked and no
    ``srl.apply`` runs."""
    data = tasks_jsonl(divide_tasks(2))
    digest, count = upload_tasks(artifact_store_from_settings(ctx.settings), data)
    inp = CollectionInput(
        collection=f"{ID_PREFIX}-srl-resume",
        tasks_digest=digest,
        task_count=count,
        source="teacher",
        model="local",
        samples=2,
        window=2,
        temperature=0.7,
        step_mode="free_running",
    )
    before = ctx.llm.default
    ctx.llm.default = ScriptedReply(content=SWAP_ANSWER)
    try:
        first = await start_collection(ctx.client, inp, task_queue=ctx.task_queue)
        result = await first.result()
        asked = len(ctx.llm.requests)
        sample = ctx.client.get_workflow_handle(f"srl/{inp.collection}/swap-1~s1")
        sample_history = await history_json(sample)
        again = await start_collection(ctx.client, inp, task_queue=ctx.task_queue)
        resumed = await again.result()
    finally:
        ctx.llm.default = before
    t, r = result.totals, resumed.totals
    expect((t.episodes, t.steps, t.verified_steps) == (4, 4, 4), f"first run {t}")
    expect((r.steps, r.reused_steps) == (4, 4), f"run again {r}")
    expect(len(ctx.llm.requests) == asked, "the run again asked no model")
    episode = ctx.client.get_workflow_handle(f"srl/{inp.collection}/swap-0")
    return {
        "srl_collection_samples": await history_json(first),
        "srl_episode_sample": sample_history,
        "srl_collection_resumed": await history_json(again),
        "srl_episode_resumed": await history_json(episode),
    }


async def srl_expert_prefix(ctx: Ctx) -> Histories:
    """A teacher collection in the default step mode, ``expert_prefix`` (patch
    ``srl-step-mode``), of one task with a two-step expert (swap ``f``'s arguments, then
    rename it): the teacher renames first (the expert's step 2, at step 1: destructive),
    then, from the expert's step-1 file, renames again (verified)."""
    data = tasks_jsonl([two_step_task()])
    digest, count = upload_tasks(artifact_store_from_settings(ctx.settings), data)
    inp = CollectionInput(
        collection=f"{ID_PREFIX}-srl-prefix",
        tasks_digest=digest,
        task_count=count,
        source="teacher",
        model="local",
    )
    ctx.llm.enqueue(ScriptedReply(content=answer_with(RENAME_F, "rename")))
    ctx.llm.enqueue(ScriptedReply(content=answer_with(RENAME_F, "rename")))
    handle = await start_collection(ctx.client, inp, task_queue=ctx.task_queue)
    result = await handle.result()
    t = result.totals
    expect((t.episodes, t.steps, t.verified_steps) == (1, 2, 1), f"{t}")
    expect(t.verified_episodes == 1, f"the episode ends verified: {t}")
    episode = ctx.client.get_workflow_handle(f"srl/{inp.collection}/swap-rename")
    history = await history_json(episode)
    marker = base64.b64encode(b'{"id":"srl-step-mode","deprecated":false}').decode()
    expect(marker in history, "the step-mode patch marker is recorded")
    return {
        "srl_collection_prefix": await history_json(handle),
        "srl_episode_prefix": history,
    }


SCENARIOS: dict[str, Scenario] = {
    "gate_approved_update": gate_approved_update,
    "gate_local_audit": gate_local_audit,
    "gate_audit_after_answer": gate_audit_after_answer,
    "gate_audit_rows_at_once": gate_audit_rows_at_once,
    "gate_open_local": gate_open_local,
    "gate_open_local_webhook": gate_open_local_webhook,
    "gate_open_local_early": gate_open_local_early,
    "gate_handler_rows_local": gate_handler_rows_local,
    "gate_handler_rows_local_early": gate_handler_rows_local_early,
    "gate_one_marker": gate_one_marker,
    "gate_one_marker_early": gate_one_marker_early,
    "gate_one_marker_expired": gate_one_marker_expired,
    "gate_rejected_signal": gate_rejected_signal,
    "gate_readers_signal": gate_readers_signal,
    "gate_self_readers": gate_self_readers,
    "gate_summary_memo": gate_summary_memo,
    "gate_summary_memo_at_start": gate_summary_memo_at_start,
    "gate_expired_with_reminders": gate_expired_with_reminders,
    "gate_duplicate_request": gate_duplicate_request,
    "gate_shared_key": gate_shared_key,
    "demo_approved": demo_approved,
    "demo_child_readers": demo_child_readers,
    "rllm_success": rllm_success,
    "rllm_recovered": rllm_recovered,
    "rllm_local_steps": rllm_local_steps,
    "rllm_composed": rllm_composed,
    "rllm_progress_memo": rllm_progress_memo,
    "mrp_approved": mrp_approved,
    "mrp_budget_exceeded": mrp_budget_exceeded,
    "mrp_overlap_windows": mrp_overlap_windows,
    "mrp_rejected": mrp_rejected,
    "mrp_evaluation_failed": mrp_evaluation_failed,
    "mrp_partial_success": mrp_partial_success,
    "mrp_progress_memo": mrp_progress_memo,
    "srl_collection": srl_collection,
    "srl_resume": srl_resume,
    "srl_expert_prefix": srl_expert_prefix,
    "srl_progress_memo": srl_progress_memo,
    "design_replanned": design_replanned,
    "design_intake_unfit": design_intake_unfit,
    "design_cost_workload": design_cost_workload,
    "design_progress_memo": design_progress_memo,
    "design_validation_failed": design_validation_failed,
    "design_repaired": design_repaired,
    "design_auto_revised": design_auto_revised,
    "design_agent_planned": design_agent_planned,
}


# -- driver --------------------------------------------------------------------------------


async def record(names: list[str], out: Path) -> list[Path]:
    """Run ``names`` on a fresh dev server and write their histories under ``out``."""
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="keel-record-") as tmp_s:
        tmp = Path(tmp_s)
        server = TemporalDevServer(
            db_file=tmp / "temporal.db",
            log_path=tmp / "temporal.log",
            port=free_port(),
            ui_port=None,
        )
        pid = server.start()
        log.info("dev server pid %d on %s", pid, server.address)
        try:
            with (
                ScriptedOpenAIServer(default=ScriptedReply(content=DEMO_DRAFT)) as llm,
                WebhookReceiver() as hooks,
            ):
                write_models_config(tmp / "models.yaml", llm.base_url)
                # A second entry on the same server, marked capable: the design agents'.
                with (tmp / "models.yaml").open("a") as f:
                    f.write(
                        "  agent:\n    litellm_model: openai/scripted\n"
                        f"    api_base: {llm.base_url}\n    capable: true\n"
                        "    structured_output: json_schema\n"
                    )
                settings = Settings(
                    env="test",
                    data_dir=tmp / "keel",
                    temporal_address=server.address,
                    task_queue="keel-replay-corpus",  # a fresh server: a fixed name diffs cleanly
                    webhook_url="",
                    # The receiver's own url, so scenarios that name it get their notices.
                    webhook_allowed_prefixes=[hooks.url],
                    metrics_port=0,
                    models_config=tmp / "models.yaml",
                    mrp_config=MRP_CONFIG,
                )
                client = await connect(settings)
                ctx = Ctx(
                    client=client,
                    task_queue=settings.task_queue,
                    webhook_url=hooks.url,
                    llm=llm,
                    settings=settings,
                )
                async with build_worker(client, settings):
                    for name in names:
                        log.info("recording %s", name)
                        histories = await asyncio.wait_for(SCENARIOS[name](ctx), timeout=120)
                        for stem, text in histories.items():
                            path = out / f"{stem}.json"
                            path.write_text(text)
                            written.append(path)
                            log.info("wrote %s (%d bytes)", path, len(text))
        finally:
            server.stop()
            log.info("dev server pid %d stopped", pid)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--out", type=Path, default=HISTORIES_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    names = args.only or list(SCENARIOS)
    args.out.mkdir(parents=True, exist_ok=True)
    written = asyncio.run(record(names, args.out))
    if not args.only:
        missing = set(CORPUS) - {p.stem for p in written}
        if missing:
            log.error("CORPUS names not recorded by any scenario: %s", sorted(missing))
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
