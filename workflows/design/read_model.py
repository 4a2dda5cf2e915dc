"""The read model a run keeps: the ``status`` and ``events`` queries, the ``agent_runs``
rows and approvals persist writes, and the webhook notices; the effects the graph's
nodes emit are applied here."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from keel.design import steps
    from keel.design.reasons import node_idempotency_key
    from keel.design.steps import (
        AgentRun,
        ApprovalRecord,
        DesignEvent,
        DesignInput,
        DesignStatus,
    )
    from keel.digest import digest_json
    from keel.gates import DesignNotice, WebhookDelivery
    from keel.progress import RunProgress
    from keel.refs import NOTIFY_WEBHOOK
    from workflows.common import call
    from workflows.readers import ProgressMemo

from workflows.design.state import (
    Approval,
    Effect,
    Event,
    Notify,
    Run,
    SetStatus,
    Stored,
    dump_deep,
)


class ReadModel:
    """What a run shows while it runs and what persist writes: the ``status`` query's
    fields, the ``events`` stream, the ``agent_runs`` rows and the approvals. The graph's
    nodes change it only through their effects (:meth:`emit`); ``DesignPipeline`` adds the
    graph, the Update and the queries."""

    def __init__(self, inp: DesignInput) -> None:
        self.inp = inp
        self.status = DesignStatus(phase="starting")
        self.agent_runs: list[AgentRun] = []
        self.approvals: list[ApprovalRecord] = []
        self.events: list[DesignEvent] = []
        self.rejection_comments: list[str] = []
        # Webhook notices run beside the pipeline: a slow receiver never holds it up.
        self._notices: list[asyncio.Task[None]] = []
        # What GET /runs shows of a running run (patch keel-progress-memo; started by run).
        self._memo = ProgressMemo()

    def show_progress(self) -> None:
        """The run's progress memo: its phase, or the node running (``codegen``), with
        the count of nodes run so far (the graph's length depends on the run)."""
        phase = self.status.phase
        if phase == "running" and self.status.node:
            phase = self.status.node
        done = len(self.status.nodes_run)
        self._memo.show(RunProgress(phase=phase, done=done, unit="nodes run"))

    # --- the ports the nodes are given (DesignPorts), and helpers -------------------

    def emit(self, effects: list[Effect]) -> None:
        """Apply a node's effects in order. By the effect's type name: the graph's nodes
        are the worker's module (the plugin holds the graph built at worker start) while
        this class is the sandbox's copy, so ``isinstance`` across the two would fail."""
        for e in effects:
            kind = type(e).__name__
            if kind == "Run":
                run = cast(Run, e)
                self.run_node(
                    run.node,
                    run.node_input,
                    run.output,
                    key=run.key,
                    provider=run.provider,
                    model=run.model,
                    tokens=run.tokens,
                    latency_ms=run.latency_ms,
                )
            elif kind == "Event":
                event = cast(Event, e)
                self.event(event.kind, event.payload)
            elif kind == "Notify":
                notice = cast(Notify, e)
                self.notify(notice.event, **notice.fields)
            elif kind == "SetStatus":
                for name, value in cast(SetStatus, e).fields.items():
                    setattr(self.status, name, value)
            elif kind == "Approval":
                approval = cast(Approval, e)
                self.approvals.append(approval.record)
                if approval.rejection_comment is not None:
                    self.rejection_comments.append(approval.rejection_comment)
            elif kind == "Stored":
                self.events.append(cast(Stored, e).event)
            else:
                raise TypeError(f"unknown effect {kind}")
        self.show_progress()

    def journal(self) -> tuple[list[AgentRun], list[ApprovalRecord], list[DesignEvent]]:
        """The run's ``agent_runs``, approvals and events so far (persist writes them)."""
        return self.agent_runs, self.approvals, self.events

    def key(self, node: str, node_input: Any) -> str:
        """The node's idempotency key (§21.3): thread = this workflow's id."""
        return node_idempotency_key(workflow.info().workflow_id, node, dump_deep(node_input))

    def now(self) -> str:
        return workflow.now().isoformat()

    def run_node(
        self,
        node: str,
        node_input: Any,
        output: dict[str, Any],
        *,
        key: str | None = None,
        provider: str = "workflow",
        model: str = "",
        tokens: int = 0,
        latency_ms: int = 0,
    ) -> None:
        """Note a node's run: the query's progress and an ``agent_runs`` row."""
        self.status.node = node
        self.status.nodes_run.append(node)
        run_key = key or self.key(node, node_input)
        # A node that runs again (a new round) with the same input keeps one key; the
        # round count makes each run's row its own.
        seq = sum(1 for r in self.agent_runs if r.agent == node)
        self.agent_runs.append(
            AgentRun(
                key=run_key if seq == 0 else f"{run_key}#{seq}",
                agent=node,
                provider=provider,
                model=model,
                input_digest=digest_json(dump_deep(node_input)),
                output=output,
                tokens_total=tokens,
                latency_ms=latency_ms,
            )
        )

    def event(self, kind: str, payload: dict[str, Any]) -> None:
        """Note an event: the ``events`` query shows it at once, persist writes it."""
        envelope = {
            "project_id": self.inp.project,
            "decision_set_id": self.inp.decision_set,
            "node_name": self.status.node,
            "ts": self.now(),
        }
        self.events.append(
            DesignEvent(
                key=steps.event_key(len(self.events), kind),
                type=kind,
                payload={**envelope, **payload},
            )
        )

    def notify(self, event: str, **fields: Any) -> None:
        """Send webhook notice ``event`` beside the pipeline, if the input names a URL."""
        if self.inp.webhook_url:
            self._notices.append(asyncio.create_task(self._deliver(event, **fields)))

    async def _deliver(self, event: str, **fields: Any) -> None:
        info = workflow.info()
        notice = DesignNotice(
            event=event,  # type: ignore[arg-type]
            project_id=self.inp.project,
            decision_set_id=self.inp.decision_set,
            workflow_id=info.workflow_id,
            node_name=self.status.node,
            at=workflow.now(),
            **fields,
        )
        # One key per event and round: a retried delivery is the same notice to receivers.
        round_ = fields.get("plan_round")
        suffix = f":{round_}" if round_ is not None else ""
        try:
            await call(
                NOTIFY_WEBHOOK,
                WebhookDelivery(
                    url=self.inp.webhook_url or "",
                    notice=notice,
                    idempotency_key=f"{info.run_id}:{event}{suffix}",
                ),
                summary=f"notify {event}",
            )
        except ActivityError as err:
            # A notice that cannot be delivered must not fail the design.
            workflow.logger.warning("design notice %s not delivered: %s", event, err.cause)
