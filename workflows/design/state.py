"""The graph's state and what travels with it: the run's context, the effects a node
asks the workflow to apply (the read model's updates), the ports a node may call, and
the small helpers every node uses."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypedDict

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from keel.design import steps
    from keel.design.coverage import Coverage, IntakeSnapshot, Question
    from keel.design.critics import CostEstimate, Risk, TechReview
    from keel.design.planner import Plan, Revision
    from keel.design.policy import PolicyReport, PolicySettings
    from keel.design.reasons import ReasonCard, node_idempotency_key
    from keel.design.steps import (
        AgentRun,
        ApprovalRecord,
        CodegenOutput,
        DesignEvent,
        DesignInput,
        Finding,
        LoadOutput,
        RepairRound,
        ValidateOutput,
    )


@dataclass(frozen=True)
class DesignContext:
    """What every node reads besides the graph's own keys: the run's input, the design
    data ``design.load`` returned (an activity result, so in history), the policy in
    force and the thread id its keys are drawn from. Travels in the state (``ctx``)."""

    thread_id: str
    inp: DesignInput
    data: LoadOutput
    policy: PolicySettings

    def key(self, node: str, node_input: Any) -> str:
        """The node's idempotency key (§21.3): thread = the workflow's id."""
        return node_idempotency_key(self.thread_id, node, dump_deep(node_input))

    def validators_key(self, files_digest: str) -> str:
        """The validators' key on the files ``files_digest``: the run's selection
        (``DesignInput.validators``) is part of it when there is one, so runs without
        one keep the key they always had."""
        only = self.inp.validators
        return self.key(
            "validators", {"files": files_digest} | ({} if only is None else {"only": only})
        )


# --- effects: what a node asks the workflow class to note (it applies them in order) ---


@dataclass(frozen=True)
class Run:
    """A node's run: the query's progress and an ``agent_runs`` row."""

    node: str
    node_input: Any
    output: dict[str, Any]
    key: str | None = None
    provider: str = "workflow"
    model: str = ""
    tokens: int = 0
    latency_ms: int = 0

    @classmethod
    def of_model(
        cls, node: str, node_input: Any, output: dict[str, Any], key: str, out: ModelCall
    ) -> Run:
        """The run of a node that asked a model: ``out``'s model, tokens and latency."""
        return cls(
            node,
            node_input,
            output,
            key=key,
            provider="llm",
            model=out.model,
            tokens=out.tokens_total,
            latency_ms=out.latency_ms,
        )


class ModelCall(Protocol):
    """What an activity that asked a model reports of the call (``AgentOutput``,
    ``IntakeOutput``)."""

    @property
    def model(self) -> str: ...

    @property
    def tokens_total(self) -> int: ...

    @property
    def latency_ms(self) -> int: ...


@dataclass(frozen=True)
class Event:
    """An event for the stream and the ``events`` table (envelope added when applied)."""

    kind: str
    payload: dict[str, Any]


@dataclass(frozen=True)
class Notify:
    """A webhook notice, sent beside the pipeline if the input names a URL."""

    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class SetStatus:
    """Fields of the ``status`` query to set."""

    fields: dict[str, Any]


@dataclass(frozen=True)
class Approval:
    record: ApprovalRecord
    rejection_comment: str | None = None


@dataclass(frozen=True)
class Stored:
    """An event persist already wrote (run-complete), as written."""

    event: DesignEvent


Effect = Run | Event | Notify | SetStatus | Approval | Stored


@dataclass(frozen=True)
class DesignPorts:
    """What a node may ask of the workflow while it runs, passed explicitly as the
    graph's runtime context (``Runtime.context``): apply effects now (before a wait or an
    activity that must see them), wait for Update ``answers``, and read the run's journal
    (``agent_runs``, approvals, events) for persist."""

    emit: Callable[[list[Effect]], None]
    ask: Callable[[list[Question], IntakeSnapshot, int], Awaitable[IntakeSnapshot]]
    journal: Callable[[], tuple[list[AgentRun], list[ApprovalRecord], list[DesignEvent]]]


class GraphState(TypedDict, total=False):
    """The graph's shared state (plan §21.2): each node merges its keys in."""

    ctx: DesignContext
    effects: list[Effect]
    snapshot: IntakeSnapshot
    coverage: Coverage
    question_round: int
    plan: Plan
    plan_round: int
    rejection_comment: str | None
    pending_revision: Revision | None
    revision: Revision | None
    revisions: int
    review: TechReview
    security: TechReview
    agent_revise: list[Risk]
    cost: CostEstimate
    policy: PolicyReport
    gate_required: bool
    gate_reasons: list[str]
    gate_status: str
    cards: list[ReasonCard]
    codegen: CodegenOutput
    validation: ValidateOutput
    repairs: list[RepairRound]
    findings: list[Finding]
    rationale: dict[str, Any]
    rationale_md: str
    outcome: str
    version: int
    archive_digest: str | None
    git_commit: str | None
    diff: dict[str, Any] | None


def dump(value: Any) -> Any:
    """A model as JSON data; anything else as it is."""
    return value.model_dump(mode="json") if hasattr(value, "model_dump") else value


def now_iso() -> str:
    """The workflow's clock (deterministic), ISO 8601."""
    return workflow.now().isoformat()


def card_events(cards: list[ReasonCard]) -> list[Effect]:
    """One ``reason_card`` event per card."""
    return [Event(steps.EVENT_REASON_CARD, c.model_dump(mode="json")) for c in cards]


def dump_deep(value: Any) -> Any:
    """Models anywhere in dicts, lists and tuples as JSON data (for keys and digests)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: dump_deep(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [dump_deep(v) for v in value]
    return value
