"""Agents with rules as the guardrail (issue 24 §4): what the planner and critic agents
are asked, the replies they may give, and the rules that check every proposal.

When the decision set's model is a capable one (``ModelSpec.capable``), the planner's
choice among catalogue patterns and the technical, cost and security critics ask the
model (activity ``design.agent``, schema-constrained). The rules stay in charge:

* a planner proposal is **refused and recorded** when its pattern is not in the
  catalogue, is for another capability or cloud, is excluded by a hard rule for these
  constraints (compliance, workload, latency, availability, throughput, a reviewer's
  avoid, an unmet ``requires``), breaks a policy rule the rules' plan passes, or when the
  reply leaves a capability out; the rules' choice stands for that capability;
* a critic finding naming a pattern that is not in the catalogue or not in the plan is
  refused; the rules' findings are always kept (a model adds, never removes);
* with no capable model the rules decide alone (this module is not called).

Pure: no I/O. The activity validates replies with the models here; the workflow applies
the guardrails.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keel.design.constraints import BUDGET_BAND_CEILING_USD, FIELD_NAMES, Constraints, is_stated
from keel.design.critics import CostEstimate, Risk, TechReview
from keel.design.patterns import MANDATORY_CAPABILITIES, Pattern, PatternCatalog
from keel.design.planner import Choice, Gap, Plan, Revision
from keel.design.policy import PolicySettings, structural_failures
from keel.problems import where

AgentName = Literal["planner", "critic_tech", "critic_cost", "critic_security"]
#: The prompt file (``configs/design/prompts/<name>.md``) of each agent.
PROMPTS: dict[str, str] = {
    "planner": "planner",
    "critic_tech": "critic_tech",
    "critic_cost": "critic_cost",
    "critic_security": "critic_security",
}
#: How many findings one critic reply may add.
MAX_FINDINGS = 12


class _Reply(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AgentChoice(_Reply):
    capability: str = Field(max_length=40)
    pattern_id: str = Field(max_length=80)
    why: str = Field(default="", max_length=600)


class PlannerReply(_Reply):
    """What the planner agent answers: one pattern per capability."""

    choices: list[AgentChoice] = Field(max_length=20)
    notes: str = Field(default="", max_length=1000)


class AgentFinding(_Reply):
    severity: Literal["low", "medium", "high"]
    detail: str = Field(min_length=1, max_length=600)
    patterns: list[str] = Field(default_factory=list, max_length=10)
    revise: bool = Field(
        default=False, description="send the plan back to the planner (high findings only)"
    )


class CriticReply(_Reply):
    """What a critic agent answers: findings beside the rules' own."""

    findings: list[AgentFinding] = Field(default_factory=list, max_length=MAX_FINDINGS)
    summary: str = Field(default="", max_length=1000)


def reply_model(agent: str) -> type[PlannerReply] | type[CriticReply]:
    return PlannerReply if agent == "planner" else CriticReply


def reply_schema(agent: str, catalog: PatternCatalog | None = None) -> dict[str, Any]:
    """The JSON Schema an agent's request carries; the planner's names the catalogue's
    pattern ids (a capable server then cannot answer another; the rules check anyway)."""
    schema = reply_model(agent).model_json_schema()
    if agent == "planner" and catalog is not None:
        choice = schema["$defs"]["AgentChoice"]["properties"]
        choice["pattern_id"]["enum"] = sorted(p.id for p in catalog.patterns)
        choice["capability"]["enum"] = [c.value for c in MANDATORY_CAPABILITIES]
    return schema


def read_agent_reply(agent: str, content: str) -> tuple[dict[str, Any] | None, list[str]]:
    """The reply as the agent's model (dumped), or ``None`` and the problems a re-ask
    quotes."""
    try:
        data = json.loads(content)
    except (ValueError, RecursionError) as exc:
        return None, [f"the reply is not JSON: {str(exc)[:200]}"]
    try:
        reply = reply_model(agent).model_validate(data)
    except ValidationError as exc:
        problems = []
        for e in exc.errors(include_url=False)[:12]:
            place = where(e["loc"], "(the reply)")
            problems.append(f"{place}: {e['msg']}"[:300])
        return None, problems
    return reply.model_dump(mode="json"), []


def agent_recovery_prompt(agent: str, problems: list[str]) -> str:
    listed = "\n".join(f"- {p}" for p in problems) or "- (none given)"
    shape = (
        '{"choices": [{"capability", "pattern_id", "why"}], "notes"}'
        if agent == "planner"
        else '{"findings": [{"severity", "detail", "patterns", "revise"}], "summary"}'
    )
    return (
        "Your previous answer could not be used. Problems found in it:\n"
        f"{listed}\n\nAnswer again with only one JSON object of this shape: {shape}."
    )


RefusalRule = Literal[
    "not_in_catalogue",
    "wrong_capability",
    "excluded",
    "policy",
    "requires",
    "missing_capability",
    "not_in_plan",
    "duplicate",
    "unusable_reply",
    "unreachable",
]


class Refusal(BaseModel):
    """A model proposal the rules refused, and why (in the node's output and its card)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    proposal: str
    rule: RefusalRule
    reason: str

    def line(self) -> str:
        return f"refused {self.agent} proposal {self.proposal}: {self.reason} ({self.rule})"


# --- what the agents are told ------------------------------------------------------------


def _stated(constraints: Constraints) -> dict[str, Any]:
    dumped = constraints.model_dump(mode="json")
    return {f: dumped[f] for f in FIELD_NAMES if is_stated(constraints, f)}


def planner_message(
    constraints: Constraints,
    rules_plan: Plan,
    catalog: PatternCatalog,
    *,
    rejection_comment: str | None = None,
    revision: Revision | None = None,
) -> str:
    """The planner agent's user message: the constraints, every capability's candidates
    (eligible ones with the rules' score, excluded ones with why) and the rules' choice."""
    by_id = catalog.by_id()
    capabilities = []
    items: list[Choice | Gap] = [*rules_plan.choices, *rules_plan.gaps]
    for item in items:
        rules_choice = item.pattern_id if isinstance(item, Choice) else None
        cands = []
        for c in item.candidates:
            p = by_id.get(c.id)
            entry: dict[str, Any] = {"id": c.id, "summary": c.summary}
            if p is not None:
                entry |= {
                    "cost_tier": p.cost_tier,
                    "deployment": p.deployment.value,
                    "p95_latency_ms": p.p95_latency_ms,
                    "availability": p.availability,
                    "requires": p.requires,
                }
            if c.excluded:
                entry["excluded"] = c.excluded
            else:
                entry["rules_score"] = c.score
            cands.append(entry)
        capabilities.append(
            {"capability": item.capability.value, "rules_choice": rules_choice, "candidates": cands}
        )
    body: dict[str, Any] = {
        "constraints": _stated(constraints),
        "assumptions": rules_plan.assumptions,
        "capabilities": capabilities,
    }
    if rejection_comment:
        body["reviewer_rejected_with"] = rejection_comment
    if revision is not None:
        body["critics_sent_back"] = revision.model_dump(mode="json")
    return json.dumps(body, sort_keys=True)


def critic_message(
    agent: str,
    constraints: Constraints,
    plan: Plan,
    catalog: PatternCatalog,
    rules_findings: TechReview,
    *,
    cost: CostEstimate | None = None,
    settings: PolicySettings | None = None,
) -> str:
    """A critic agent's user message: the constraints, the plan, the rules' findings and
    (cost critic) the estimate against the band, (security critic) the organisation's
    policy."""
    by_id = catalog.by_id()
    body: dict[str, Any] = {
        "constraints": _stated(constraints),
        "plan": [
            {
                "capability": c.capability.value,
                "pattern_id": c.pattern_id,
                "summary": by_id[c.pattern_id].summary if c.pattern_id in by_id else "",
            }
            for c in plan.choices
        ],
        "gaps": [g.capability.value for g in plan.gaps],
        "rules_findings": [r.model_dump(mode="json") for r in rules_findings.risks],
    }
    if agent == "critic_cost" and cost is not None:
        band = constraints.budget_band
        body["cost"] = {
            "monthly_usd": cost.monthly_usd,
            "by_capability": cost.by_capability,
            "band": band.value if band else None,
            "band_ceiling_usd": BUDGET_BAND_CEILING_USD[band] if band else None,
            "unpriced": [u.service for u in cost.unpriced],
        }
    if agent == "critic_security" and settings is not None:
        body["organisation_policy"] = settings.model_dump(mode="json")
    return json.dumps(body, sort_keys=True)


# --- the guardrails -------------------------------------------------------------------


class AgentPlan(BaseModel):
    """The plan after the rules checked a planner agent's reply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    plan: Plan
    accepted: dict[str, str] = Field(
        default_factory=dict, description="capability -> the model's pattern the rules took"
    )
    refusals: list[Refusal] = Field(default_factory=list)
    notes: str = ""


def _with_choice(plan: Plan, choice: Choice) -> Plan:
    return plan.model_copy(
        update={
            "choices": [choice if c.capability == choice.capability else c for c in plan.choices]
        }
    )


def _unmet_requires(plan: Plan, catalog: PatternCatalog) -> set[str]:
    by_id = catalog.by_id()
    chosen = set(plan.pattern_ids())
    return {
        pid
        for pid in chosen
        if pid in by_id and by_id[pid].requires and not set(by_id[pid].requires) & chosen
    }


def _refused(what: str, rule: RefusalRule, reason: str) -> Refusal:
    """A refusal of one planner proposal."""
    return Refusal(agent="planner", proposal=what, rule=rule, reason=reason)


def _proposals(
    parsed: PlannerReply,
    rules_by_cap: dict[str, Choice],
    gap_caps: dict[str, Gap],
    out: list[Refusal],
) -> dict[str, AgentChoice]:
    """The reply's choice per capability of the plan; a second choice for a capability
    and a capability the plan does not have are refused (into ``out``)."""
    proposals: dict[str, AgentChoice] = {}
    for ch in parsed.choices:
        what = f"{ch.capability} -> {ch.pattern_id}"
        if ch.capability in proposals:
            out.append(_refused(what, "duplicate", "a second choice for the same capability"))
            continue
        if ch.capability not in rules_by_cap and ch.capability not in gap_caps:
            out.append(
                _refused(
                    what,
                    "wrong_capability",
                    f"{ch.capability!r} is not a capability of the plan",
                )
            )
            continue
        proposals[ch.capability] = ch
    return proposals


def _candidate_refusal(
    cap: str,
    ch: AgentChoice,
    item: Choice | Gap,
    by_id: dict[str, Pattern],
    catalog: PatternCatalog,
    cloud: str,
) -> Refusal | None:
    """Why the proposed pattern cannot stand for ``cap`` at all (not in the catalogue,
    another capability's, not a candidate, excluded by a hard rule), or ``None``."""
    what = f"{cap} -> {ch.pattern_id}"
    pattern = by_id.get(ch.pattern_id)
    if pattern is None:
        return _refused(
            what,
            "not_in_catalogue",
            f"{ch.pattern_id!r} is not in catalogue {catalog.version}",
        )
    if pattern.capability.value != cap:
        return _refused(
            what,
            "wrong_capability",
            f"{ch.pattern_id} is a {pattern.capability.value} pattern",
        )
    cand = next((c for c in item.candidates if c.id == ch.pattern_id), None)
    if cand is None:
        return _refused(
            what,
            "excluded",
            f"{ch.pattern_id} is not a {cloud} candidate for this plan",
        )
    if cand.excluded:
        return _refused(what, "excluded", cand.excluded)
    return None


def _trial_refusal(
    constraints: Constraints,
    plan_now: Plan,
    trial: Plan,
    catalog: PatternCatalog,
    settings: PolicySettings | None,
    what: str,
) -> Refusal | None:
    """Why ``trial`` (``plan_now`` with the proposal) is refused: a policy rule it newly
    fails, or a ``requires`` it newly leaves unmet; ``None`` when it passes."""
    before = structural_failures(constraints, plan_now, catalog, settings)
    after = structural_failures(constraints, trial, catalog, settings)
    new_fail = {k: v for k, v in after.items() if k not in before}
    if new_fail:
        rule_id, detail = sorted(new_fail.items())[0]
        return _refused(what, "policy", f"policy {rule_id} would fail: {detail}")
    broken = _unmet_requires(trial, catalog) - _unmet_requires(plan_now, catalog)
    if broken:
        by_id = catalog.by_id()
        needs = "; ".join(
            f"{pid} needs one of {', '.join(by_id[pid].requires)}" for pid in sorted(broken)
        )
        return _refused(
            what,
            "requires",
            "leaves the requirement of " + ", ".join(sorted(broken)) + f" unmet ({needs})",
        )
    return None


def _agent_choice(current: Choice, ch: AgentChoice, pattern: Pattern) -> Choice:
    """The rules' choice for a capability replaced by the agent's pattern."""
    return Choice(
        capability=current.capability,
        pattern_id=ch.pattern_id,
        justification=f"{ch.pattern_id}: {pattern.summary}; chosen by the planner agent"
        + (f" ({ch.why})" if ch.why else "")
        + f"; the rules' choice was {current.pattern_id}",
        candidates=current.candidates,
    )


def guard_plan(
    constraints: Constraints,
    catalog: PatternCatalog,
    rules_plan: Plan,
    reply: dict[str, Any] | None,
    settings: PolicySettings | None = None,
    *,
    refusals: list[Refusal] | None = None,
) -> AgentPlan:
    """Check a planner agent's reply against the rules and merge what passes into the
    rules' plan (capability by capability, in the rules' order)."""
    out: list[Refusal] = list(refusals or [])
    if reply is None:
        return AgentPlan(plan=rules_plan, refusals=out)
    parsed = PlannerReply.model_validate(reply)
    by_id = catalog.by_id()
    rules_by_cap = {c.capability.value: c for c in rules_plan.choices}
    gap_caps = {g.capability.value: g for g in rules_plan.gaps}
    proposals = _proposals(parsed, rules_by_cap, gap_caps, out)
    plan_now = rules_plan
    accepted: dict[str, str] = {}
    for cap in [c.capability.value for c in rules_plan.choices] + list(gap_caps):
        ch = proposals.get(cap)
        if ch is None:
            if cap in rules_by_cap:
                out.append(
                    _refused(
                        f"{cap} -> (nothing)",
                        "missing_capability",
                        f"the reply chose nothing for {cap}; the rules' "
                        f"{rules_by_cap[cap].pattern_id} stands",
                    )
                )
            continue
        item = rules_by_cap.get(cap) or gap_caps[cap]
        refusal = _candidate_refusal(cap, ch, item, by_id, catalog, rules_plan.cloud.value)
        if refusal is not None:
            out.append(refusal)
            continue
        current = rules_by_cap.get(cap)
        if current is None:
            continue  # a gap's candidates are all excluded: handled above
        if current.pattern_id == ch.pattern_id:
            accepted[cap] = ch.pattern_id  # the model agrees with the rules
            continue
        trial = _with_choice(plan_now, _agent_choice(current, ch, by_id[ch.pattern_id]))
        what = f"{cap} -> {ch.pattern_id}"
        refusal = _trial_refusal(constraints, plan_now, trial, catalog, settings, what)
        if refusal is not None:
            out.append(refusal)
            continue
        plan_now = trial
        accepted[cap] = ch.pattern_id
    return AgentPlan(plan=plan_now, accepted=accepted, refusals=out, notes=parsed.notes)


def _finding_refusal(
    agent: str, f: AgentFinding, by_id: dict[str, Pattern], in_plan: set[str]
) -> Refusal | None:
    """Why a critic's finding is refused (it names patterns not in the catalogue, or
    not in the plan), or ``None``."""
    what = f"[{f.severity}] {f.detail[:80]}"
    unknown = [p for p in f.patterns if p not in by_id]
    if unknown:
        reason = "names patterns not in the catalogue: " + ", ".join(unknown)
        return Refusal(agent=agent, proposal=what, rule="not_in_catalogue", reason=reason)
    outside = [p for p in f.patterns if p not in in_plan]
    if outside:
        reason = "names patterns the plan does not use: " + ", ".join(outside)
        return Refusal(agent=agent, proposal=what, rule="not_in_plan", reason=reason)
    return None


def guard_findings(
    agent: str,
    plan: Plan,
    catalog: PatternCatalog,
    reply: dict[str, Any] | None,
    kind: str,
) -> tuple[list[Risk], list[Refusal], bool]:
    """A critic agent's findings the rules accept (as risks ``agent:<agent>:<n>``), the
    refused ones, and whether an accepted high finding asks to send the plan back."""
    if reply is None:
        return [], [], False
    parsed = CriticReply.model_validate(reply)
    by_id = catalog.by_id()
    in_plan = set(plan.pattern_ids())
    risks: list[Risk] = []
    refusals: list[Refusal] = []
    revise = False
    for n, f in enumerate(parsed.findings, 1):
        refusal = _finding_refusal(agent, f, by_id, in_plan)
        if refusal is not None:
            refusals.append(refusal)
            continue
        risks.append(
            Risk(
                id=f"agent:{agent}:{n}",
                kind=kind,  # type: ignore[arg-type]
                severity=f.severity,
                detail=f"model: {f.detail}",
                patterns=list(f.patterns),
            )
        )
        revise = revise or (f.revise and f.severity == "high")
    return risks, refusals, revise


def revision_for(
    constraints: Constraints,
    plan: Plan,
    reviews: list[TechReview],
    cost: CostEstimate,
    *,
    agent_asked: list[Risk] | None = None,
) -> Revision | None:
    """What the critics' findings ask of the planner, or ``None``: the estimate over the
    budget band's ceiling (cheaper patterns), and high findings that name patterns of the
    plan (replace them). ``agent_asked``: accepted model findings that asked to revise."""
    reasons: list[str] = []
    avoid: set[str] = set()
    cheaper = False
    band = constraints.budget_band
    if band is not None and cost.monthly_usd > BUDGET_BAND_CEILING_USD[band]:
        cheaper = True
        reasons.append(
            f"cost ${cost.monthly_usd:,.2f}/month is over the {band.value} band's "
            f"${BUDGET_BAND_CEILING_USD[band]:,.0f}"
        )
    in_plan = set(plan.pattern_ids())
    for review in reviews:
        for r in review.risks:
            if r.severity == "high" and r.patterns and not r.id.startswith("agent:"):
                named = [p for p in r.patterns if p in in_plan]
                if named:
                    avoid.update(named)
                    reasons.append(f"{r.id}: {r.detail}")
    for r in agent_asked or []:
        avoid.update(p for p in r.patterns if p in in_plan)
        reasons.append(f"{r.id}: {r.detail}")
    if not reasons:
        return None
    return Revision(reasons=reasons, prefer_cheaper=cheaper, avoid=sorted(avoid))
