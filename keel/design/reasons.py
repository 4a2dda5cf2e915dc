"""Reason Cards, the Design Rationale section and the node keys that name them (§19, §21.3, §22.2, §23.4).

A Reason Card is the user-facing, structured account of one decision: inputs, options,
choice, policy and cost impact, risks. It is built from the nodes' structured outputs,
never from model transcripts. Its ``decision_id`` is derived from the node idempotency
key, so replaying a node yields the same card id. Timestamps are passed in (the workflow
supplies ``workflow.now()``), keeping this module free of clocks.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, Literal

import blake3
from pydantic import BaseModel, ConfigDict, Field

from keel.design.critics import CostEstimate, TechReview
from keel.design.planner import Choice, Gap, Plan
from keel.design.policy import PolicyReport, Status
from keel.design.workload import fmt_number
from keel.digest import canonical_json, digest_bytes, digest_json

Agent = Literal[
    "intake", "planner", "critic.tech", "critic.cost", "critic.security", "policy", "codegen"
]
Trigger = Literal["constraints_updated", "user_approve", "user_reject", "regen"]


def node_idempotency_key(thread_id: str, node: str, node_input: Any) -> str:
    """``blake3(thread_id | node | canonical_json(input))`` as ``blake3:<hex>`` (§21.3).

    A ``|`` inside the thread id or node name would let two different pairs share a key,
    so it is refused.
    """
    if "|" in thread_id or "|" in node:
        raise ValueError("thread id and node name must not contain '|'")
    head = f"{thread_id}|{node}|".encode()
    return digest_bytes(head + canonical_json(node_input))


def decision_id(idempotency_key: str, suffix: str = "") -> str:
    """A UUID drawn from the node key (plus ``suffix`` when one node makes several cards)."""
    raw = blake3.blake3(f"{idempotency_key}|{suffix}".encode()).digest()[:16]
    return str(uuid.UUID(bytes=raw, version=4))


def prompt_pack_hash(prompts: Mapping[str, str]) -> str:
    """One digest over a pack of markdown prompts, ``{name: text}`` (§23.4).

    Names are sorted and each text hashed after CRLF to LF, so a checkout's line endings
    or a dict's order do not change the pack's identity; any edit to a text does.
    """
    members = {
        name: digest_bytes(text.replace("\r\n", "\n").encode("utf-8"))
        for name, text in prompts.items()
    }
    return digest_json({"prompt_pack": members})


class CardInputs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    constraints_keys: list[str] = Field(default_factory=list)
    artifacts: list[str] = Field(default_factory=list)


class CardCandidate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    summary: str
    tradeoffs: list[str] = Field(default_factory=list)


class CardChoice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    justification: str


class ReasonCard(BaseModel):
    """The §22.2 Reason Card, plus the prompt pack hash of §23.4."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision_id: str
    agent: Agent
    node_name: str
    trigger: Trigger
    inputs: CardInputs
    candidates: list[CardCandidate] = Field(default_factory=list)
    choice: CardChoice | None = None
    policy_results: dict[str, Status] = Field(default_factory=dict)
    impacts: dict[str, float | None] = Field(default_factory=dict)
    confidence: float = Field(ge=0.0, le=1.0)
    risks: list[str] = Field(default_factory=list)
    links: dict[str, str] = Field(default_factory=dict)
    ts: str
    prompt_pack_hash: str | None = None


def _choice_card(
    choice: Choice,
    decision: str,
    keys: list[str],
    penalty: float,
    impacts: dict[str, float | None],
    risks: list[str],
    shared: dict[str, Any],
) -> ReasonCard:
    """The planner card of a capability's choice, with every candidate (an excluded one
    says why); ``shared`` holds the fields every planner card of the node has."""
    excluded = sum(1 for c in choice.candidates if c.excluded)
    share = excluded / len(choice.candidates) if choice.candidates else 0.0
    return ReasonCard(
        decision_id=decision,
        inputs=CardInputs(constraints_keys=keys, artifacts=[f"capability:{choice.pattern_id}"]),
        candidates=[
            CardCandidate(
                id=c.id,
                summary=c.summary + (f" (excluded: {c.excluded})" if c.excluded else ""),
                tradeoffs=c.tradeoffs,
            )
            for c in choice.candidates
        ],
        choice=CardChoice(id=choice.pattern_id, justification=choice.justification),
        impacts=impacts,
        confidence=max(0.05, round(0.9 - 0.3 * share - penalty, 2)),
        risks=risks,
        **shared,
    )


def _gap_card(
    gap: Gap, decision: str, keys: list[str], risks: list[str], shared: dict[str, Any]
) -> ReasonCard:
    """The planner card of a capability no pattern fits (every candidate excluded)."""
    return ReasonCard(
        decision_id=decision,
        inputs=CardInputs(constraints_keys=keys),
        candidates=[
            CardCandidate(id=c.id, summary=f"{c.summary} (excluded: {c.excluded})")
            for c in gap.candidates
        ],
        choice=None,
        confidence=0.05,
        risks=risks,
        **shared,
    )


def planner_cards(
    plan: Plan,
    *,
    idempotency_key: str,
    constraints_keys: list[str],
    trigger: Trigger,
    ts: str,
    policy: PolicyReport | None = None,
    prompt_pack: str | None = None,
    policy_results: Mapping[str, Status] | None = None,
    impacts: Mapping[str, Mapping[str, float | None]] | None = None,
    refusals: list[str] | None = None,
    model: str = "",
) -> list[ReasonCard]:
    """One card per capability: the choice with its candidates, or the gap.

    Confidence falls with each excluded candidate's share and each planning assumption,
    so a choice made by elimination or on guessed constraints reads less sure.
    ``policy_results`` (the structural rules on the plan) fills every card when no
    ``policy`` report is given; ``impacts`` is per pattern id; ``refusals`` (model
    proposals the rules refused, by capability prefix ``<capability> -> ...``) go to the
    risks of the capability's card; ``model`` names the planner agent's model.
    """
    penalty = 0.1 * len(plan.assumptions)
    keys = sorted(constraints_keys)
    shared: dict[str, Any] = {
        "agent": "planner",
        "node_name": "planner",
        "trigger": trigger,
        "policy_results": dict(policy.summary() if policy else (policy_results or {})),
        "links": {"model": model} if model else {},
        "ts": ts,
        "prompt_pack_hash": prompt_pack,
    }

    def refused(cap: str) -> list[str]:
        return [r for r in refusals or [] if f" {cap} -> " in r]

    cards = [
        _choice_card(
            choice,
            decision_id(idempotency_key, choice.capability.value),
            keys,
            penalty,
            dict((impacts or {}).get(choice.pattern_id, {})),
            [*plan.assumptions, *refused(choice.capability.value)],
            shared,
        )
        for choice in plan.choices
    ]
    for gap in plan.gaps:
        risks = [gap.detail, *plan.assumptions, *refused(gap.capability.value)]
        decision = decision_id(idempotency_key, gap.capability.value)
        cards.append(_gap_card(gap, decision, keys, risks, shared))
    return cards


def _review_impacts(review: TechReview) -> dict[str, float | None]:
    count = {s: float(sum(1 for r in review.risks if r.severity == s)) for s in ("high", "medium")}
    return {"risks": float(len(review.risks)), "high": count["high"], "medium": count["medium"]}


def critic_tech_card(
    review: TechReview,
    *,
    idempotency_key: str,
    trigger: Trigger,
    ts: str,
    prompt_pack: str | None = None,
    refusals: list[str] | None = None,
    model: str = "",
    agent: Agent = "critic.tech",
    node_name: str = "critic_tech",
    policy_results: Mapping[str, Status] | None = None,
) -> ReasonCard:
    """A critic's card (technical by default; ``agent``/``node_name`` for the security
    critic): its risks, the policy rule its findings feed, impacts (risk counts) and the
    model proposals the rules refused."""
    high = sum(1 for r in review.risks if r.severity == "high")
    if policy_results is None:
        policy_results = {"tech_risks": "warn" if high else "pass"}
    return ReasonCard(
        decision_id=decision_id(idempotency_key),
        agent=agent,
        node_name=node_name,
        trigger=trigger,
        inputs=CardInputs(artifacts=sorted({p for r in review.risks for p in r.patterns})),
        policy_results=dict(policy_results),
        impacts=_review_impacts(review),
        confidence=max(0.1, round(0.9 - 0.2 * high, 2)),
        risks=[f"[{r.severity}] {r.detail}" for r in review.risks] + list(refusals or []),
        links={"model": model} if model else {},
        ts=ts,
        prompt_pack_hash=prompt_pack,
    )


def critic_cost_card(
    cost: CostEstimate,
    *,
    idempotency_key: str,
    trigger: Trigger,
    ts: str,
    prompt_pack: str | None = None,
    budget_status: Status | None = None,
    extra_risks: list[str] | None = None,
    model: str = "",
) -> ReasonCard:
    impacts: dict[str, float | None] = {"monthly_usd": cost.monthly_usd}
    if cost.delta_vs_prev_usd is not None:
        impacts["delta_vs_prev_usd"] = cost.delta_vs_prev_usd
        impacts["delta_vs_prev_pct"] = cost.delta_vs_prev_pct
    risks = [f"unpriced: {u.service} ({u.qty}, {u.reason})" for u in cost.unpriced]
    # Workload inputs the form left out are priced at a default: say which, and that the
    # estimate rests on them.
    risks += [
        f"assumed: {v.name} = {fmt_number(v.value)} {v.unit} ({v.detail})".replace(" ()", "")
        for v in cost.assumed
    ]
    if cost.previous_method is not None and cost.previous_method != cost.method:
        risks.append(
            f"method changed: the previous estimate used {cost.previous_method}, this one "
            f"{cost.method}; the delta mixes the two"
        )
    risks += list(extra_risks or [])
    confidence = 0.6 if cost.complete else 0.3
    if cost.assumed:
        confidence = max(0.3, round(confidence - 0.05 * len(cost.assumed), 2))
    return ReasonCard(
        decision_id=decision_id(idempotency_key),
        agent="critic.cost",
        node_name="critic_cost",
        trigger=trigger,
        inputs=CardInputs(artifacts=sorted({line.pattern_id for line in cost.breakdown})),
        policy_results={"budget_band": budget_status} if budget_status else {},
        impacts=impacts,
        confidence=confidence,
        risks=risks,
        links={"cost": "/reports/cost.json", **({"model": model} if model else {})},
        ts=ts,
        prompt_pack_hash=prompt_pack,
    )


def policy_card(
    policy: PolicyReport,
    cost: CostEstimate,
    *,
    gate_required: bool,
    gate_reasons: list[str],
    idempotency_key: str,
    ts: str,
    prompt_pack: str | None = None,
    trigger: Trigger = "regen",
) -> ReasonCard:
    """The policy node's card: every rule's result, the cost it judged, and whether a human
    must approve (the choice: ``gate`` or ``no_gate``)."""
    impacts: dict[str, float | None] = {
        "monthly_usd": cost.monthly_usd,
        "gate_required": 1.0 if gate_required else 0.0,
    }
    if cost.delta_vs_prev_usd is not None:
        impacts["delta_vs_prev_usd"] = cost.delta_vs_prev_usd
        impacts["delta_vs_prev_pct"] = cost.delta_vs_prev_pct
    why = "; ".join(gate_reasons) or "no threshold crossed and no rule fails"
    return ReasonCard(
        decision_id=decision_id(idempotency_key),
        agent="policy",
        node_name="policy_eval",
        trigger=trigger,
        inputs=CardInputs(artifacts=["/reports/policy.json"]),
        choice=CardChoice(id="gate" if gate_required else "no_gate", justification=why),
        policy_results=policy.summary(),
        impacts=impacts,
        confidence=0.9 if policy.overall == "pass" else 0.7,
        risks=[f"[{r.status}] {r.id}: {r.detail}" for r in policy.rules if r.status != "pass"],
        links={"policy": "/reports/policy.json"},
        ts=ts,
        prompt_pack_hash=prompt_pack,
    )


def codegen_card(
    *,
    provider: str,
    model: str,
    files_digest: str,
    file_count: int,
    capabilities: list[str],
    policy: PolicyReport | None,
    cost: CostEstimate | None,
    idempotency_key: str,
    ts: str,
    prompt_pack: str | None = None,
) -> ReasonCard:
    """The codegen node's card: who wrote the repository, from which plan, how big."""
    impacts: dict[str, float | None] = {"files": float(file_count)}
    if cost is not None:
        impacts["monthly_usd"] = cost.monthly_usd
    who = provider + (f" ({model})" if model else "")
    return ReasonCard(
        decision_id=decision_id(idempotency_key),
        agent="codegen",
        node_name="codegen",
        trigger="user_approve",
        inputs=CardInputs(artifacts=[f"capability:{c}" for c in capabilities]),
        choice=CardChoice(
            id=provider,
            justification=f"{file_count} files by {who} for "
            f"{len(capabilities)} capabilities; validated before it ships",
        ),
        policy_results=policy.summary() if policy else {},
        impacts=impacts,
        confidence=0.8 if provider == "template" else 0.6,
        links={"repository": files_digest, **({"model": model} if model else {})},
        ts=ts,
        prompt_pack_hash=prompt_pack,
    )


def rationale_json(cards: list[ReasonCard]) -> dict[str, Any]:
    """The ``/reports/rationale.json`` document."""
    return {"version": 1, "reason_cards": [c.model_dump(mode="json") for c in cards]}


def design_rationale_md(
    plan: Plan,
    cards: list[ReasonCard],
    policy: PolicyReport | None = None,
    cost: CostEstimate | None = None,
) -> str:
    """The Design Rationale section for the generated README (markdown)."""
    out = ["## Design Rationale", ""]
    if plan.assumptions:
        out.append("Assumptions: " + "; ".join(plan.assumptions) + ".")
        out.append("")
    out.append("| Capability | Choice | Why |")
    out.append("|---|---|---|")
    for choice in plan.choices:
        why = choice.justification.replace("|", "/")
        out.append(f"| {choice.capability.value} | `{choice.pattern_id}` | {why} |")
    for gap in plan.gaps:
        out.append(f"| {gap.capability.value} | none | {gap.detail} |")
    if policy is not None:
        out += ["", f"Policy overall: **{policy.overall}**", ""]
        out += [f"- `{r.id}`: {r.status} ({r.detail})" for r in policy.rules]
    if cost is not None:
        out += ["", f"Estimated monthly cost: ${cost.monthly_usd:,.2f} ({cost.method})"]
        if cost.unpriced:
            out.append(f"Unpriced, not in the total: {', '.join(u.service for u in cost.unpriced)}")
    risks = sorted({r for c in cards for r in c.risks if c.agent == "critic.tech"})
    if risks:
        out += ["", "Risks:", *(f"- {r}" for r in risks)]
    return "\n".join(out) + "\n"


__all__ = [
    "CardCandidate",
    "CardChoice",
    "CardInputs",
    "ReasonCard",
    "codegen_card",
    "critic_cost_card",
    "critic_tech_card",
    "decision_id",
    "design_rationale_md",
    "node_idempotency_key",
    "planner_cards",
    "policy_card",
    "prompt_pack_hash",
    "rationale_json",
]
