"""Deterministic planner rules: constraints (and a rejection comment) to a Plan (§21.1 node 4).

For each capability, in :data:`~keel.design.patterns.MANDATORY_CAPABILITIES` order, the
planner first excludes patterns a hard constraint rules out (cloud, compliance, needed
workloads, latency SLO, availability, throughput, a pattern the reviewer asked to avoid, a
prerequisite not chosen earlier), then scores the rest on soft preferences (budget band,
deployment preference, stated stack and tooling, the reviewer's comment) and takes the
best, ties going to the cheaper then the earlier pattern. Every exclusion and every score
term is kept as a sentence, so the Reason Card can show why. A capability with nothing
left is a :class:`Gap`, never an exception: the policy engine turns it into a failure the
user can read.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import (
    BudgetBand,
    Cloud,
    Constraints,
    DeploymentPref,
    WorkloadType,
)
from keel.design.patterns import (
    MANDATORY_CAPABILITIES,
    Capability,
    Deployment,
    Pattern,
    PatternCatalog,
)

DEFAULT_CLOUD = Cloud.AWS
DEFAULT_WORKLOADS = (WorkloadType.BATCH,)


class RejectionFeedback(BaseModel):
    """What the planner understood from a reviewer's rejection comment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    comment: str
    prefer_cheaper: bool = False
    prefer_low_latency: bool = False
    prefer_deployment: Deployment | None = None
    avoid: list[str] = Field(default_factory=list, description="pattern ids to leave out")
    understood: list[str] = Field(default_factory=list)


class Revision(BaseModel):
    """The critics' findings that send a plan back to the planner once before the gate
    (issue 24 §4, the plan's auto-revision): cheaper patterns, and patterns to replace
    where an eligible alternative exists (a soft avoid: never a gap)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reasons: list[str] = Field(min_length=1)
    prefer_cheaper: bool = False
    avoid: list[str] = Field(default_factory=list, description="pattern ids to replace")


class Candidate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    summary: str
    score: float | None = None
    reasons: list[str] = Field(default_factory=list)
    excluded: str | None = None
    tradeoffs: list[str] = Field(default_factory=list)


class Choice(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    capability: Capability
    pattern_id: str
    justification: str
    candidates: list[Candidate]


class Gap(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    capability: Capability
    detail: str
    candidates: list[Candidate]


class Plan(BaseModel):
    """The ``plan`` state key: one chosen pattern per capability, or a gap."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cloud: Cloud
    regions: list[str]
    workloads: list[WorkloadType]
    choices: list[Choice]
    gaps: list[Gap] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    feedback: RejectionFeedback | None = None
    catalog_version: str

    def pattern_ids(self) -> list[str]:
        return [c.pattern_id for c in self.choices]

    def capabilities(self) -> list[Capability]:
        return [c.capability for c in self.choices]

    def choice_for(self, capability: Capability) -> Choice | None:
        return next((c for c in self.choices if c.capability == capability), None)


_CHEAPER = re.compile(
    r"\b(expensive|cost(ly|s)?|cheap(er)?|pric(e|ey|y)|budget|spend|too much money)\b"
)
_FASTER = re.compile(r"\b(latency|slow(er)?|fast(er)?|quick(er)?|p95|p99|response time)\b")
_SERVERLESS = re.compile(r"\b(serverless|lambda|scale to zero)\b")
_CONTAINERS = re.compile(r"\b(containers?|kubernetes|k8s|eks|ecs|docker|fargate)\b")
_MANAGED = re.compile(r"\b(managed|less ops|fewer moving parts|simpler|no ops)\b")
_DEPLOYMENT_WORD = re.compile(
    r"serverless|lambda|containers?|kubernetes|k8s|eks|ecs|docker|fargate|managed"
)
_AVOID = re.compile(
    r"\b(?:avoid|no|not|without|drop|remove|replace|instead of|rather than)\s+"
    r"(?:the\s+|using\s+|any\s+)?([a-z0-9][a-z0-9:-]*)"
)


def interpret_comment(comment: str, catalog: PatternCatalog) -> RejectionFeedback:
    """Read a rejection comment into planner preferences, by keyword only.

    Keyword rules rather than a model keep the planner replayable and the reading
    explainable: ``understood`` lists each rule that fired.
    """
    text = comment.lower()
    names: dict[str, str] = {}
    for p in catalog.patterns:
        names[p.id] = p.id
        names.setdefault(p.id.split(":", 1)[1], p.id)
    # A negated pattern or deployment ("avoid lambda-serverless", "no containers") must
    # not also count as a wish for what it names, so preferences read the rest; "not
    # cheap enough" keeps its meaning because "cheap" names neither.
    avoided = _AVOID.findall(text)

    def _drop(m: re.Match[str]) -> str:
        word = m.group(1)
        return " " if word in names or _DEPLOYMENT_WORD.fullmatch(word) else m.group(0)

    wishes = _AVOID.sub(_drop, text)
    understood: list[str] = []
    cheaper = bool(_CHEAPER.search(wishes))
    if cheaper:
        understood.append("cost: prefer cheaper patterns")
    faster = bool(_FASTER.search(wishes))
    if faster:
        understood.append("latency: prefer lower p95 latency")
    deployment: Deployment | None = None
    if _SERVERLESS.search(wishes):
        deployment = Deployment.SERVERLESS
    elif _CONTAINERS.search(wishes):
        deployment = Deployment.CONTAINERS
    elif _MANAGED.search(wishes):
        deployment = Deployment.MANAGED
    if deployment is not None:
        understood.append(f"deployment: prefer {deployment.value}")
    avoid = sorted({names[m] for m in avoided if m in names})
    for pid in avoid:
        understood.append(f"avoid: {pid}")
    return RejectionFeedback(
        comment=comment,
        prefer_cheaper=cheaper,
        prefer_low_latency=faster,
        prefer_deployment=deployment,
        avoid=avoid,
        understood=understood,
    )


def _needed_workloads(capability: Capability, workloads: set[WorkloadType]) -> set[WorkloadType]:
    """Workloads a pattern of ``capability`` must support for the plan to work."""
    if capability in (Capability.INGEST, Capability.TRANSFORM):
        return {WorkloadType.STREAMING} & workloads
    if capability == Capability.FEATURE:
        return {WorkloadType.STREAMING, WorkloadType.ONLINE} & workloads
    if capability == Capability.SERVE:
        return {WorkloadType.ONLINE} if WorkloadType.ONLINE in workloads else {WorkloadType.BATCH}
    return set()


def _exclusion(
    p: Pattern,
    c: Constraints,
    workloads: set[WorkloadType],
    chosen: set[str],
    feedback: RejectionFeedback | None,
) -> str | None:
    missing_compliance = [x.value for x in c.compliance if x not in p.compliance]
    if missing_compliance:
        return f"not eligible for {', '.join(missing_compliance)}"
    needed = _needed_workloads(p.capability, workloads) - set(p.workloads)
    if needed:
        return f"does not support {', '.join(sorted(w.value for w in needed))} workloads"
    on_request_path = p.capability in (Capability.SERVE, Capability.FEATURE, Capability.STORE)
    online = WorkloadType.ONLINE in workloads
    if (
        online
        and on_request_path
        and c.sla_latency_ms is not None
        and p.p95_latency_ms is not None
        and p.p95_latency_ms > c.sla_latency_ms
    ):
        return f"p95 {p.p95_latency_ms} ms exceeds the {c.sla_latency_ms} ms SLO"
    if (
        online
        and p.capability == Capability.SERVE
        and c.sla_latency_ms is not None
        and p.p95_latency_ms is None
    ):
        return "no latency guarantee for the online SLO"
    if (
        p.capability == Capability.SERVE
        and c.availability_target is not None
        and p.availability < c.availability_target
    ):
        return f"availability {p.availability}% below the {c.availability_target}% target"
    tp = c.throughput
    if tp is not None and p.max_rps is not None:
        if p.capability == Capability.SERVE and (tp.requests_per_s or 0) > p.max_rps:
            return f"max {p.max_rps:g} req/s below the {tp.requests_per_s:g} req/s asked"
        if p.capability == Capability.INGEST and (tp.events_per_s or 0) > p.max_rps:
            return f"max {p.max_rps:g} events/s below the {tp.events_per_s:g} events/s asked"
    if feedback is not None and p.id in feedback.avoid:
        return "the reviewer asked to avoid it"
    if p.requires and not set(p.requires) & chosen:
        return f"needs one of {', '.join(p.requires)}, not chosen"
    return None


def _score(
    p: Pattern, c: Constraints, workloads: set[WorkloadType], feedback: RejectionFeedback | None
) -> tuple[float, list[str]]:
    score = 0.0
    reasons: list[str] = []
    band = c.budget_band
    if band == BudgetBand.LOW:
        score -= 3 * p.cost_tier
        reasons.append(f"low budget band: -{3 * p.cost_tier} for cost tier {p.cost_tier}")
    elif band == BudgetBand.MEDIUM:
        score -= p.cost_tier
        reasons.append(f"medium budget band: -{p.cost_tier} for cost tier {p.cost_tier}")
    elif band in (BudgetBand.HIGH, BudgetBand.ENTERPRISE) and p.deployment == Deployment.MANAGED:
        score += 1
        reasons.append(f"{band.value} budget band: +1 for a managed service")
    if c.deployment_pref is not None:
        wanted = (
            Deployment.SERVERLESS
            if c.deployment_pref == DeploymentPref.SERVERLESS
            else Deployment.CONTAINERS
        )
        if p.deployment == wanted:
            score += 2
            reasons.append(f"+2 matches deployment preference {wanted.value}")
    stated = set(c.storage_prefs) | set(c.observability_prefs) | set(c.existing_stack)
    if c.team_constraints is not None:
        stated |= {s.lower() for s in (*c.team_constraints.languages, *c.team_constraints.skills)}
    # Worth more than a budget-tier step: reusing what the team already runs saves more
    # than list prices show.
    for tag in sorted(stated & set(p.tags)):
        score += 3
        reasons.append(f"+3 matches stated preference {tag!r}")
    if workloads and workloads <= set(p.workloads):
        score += 1
        reasons.append("+1 covers every stated workload")
    if feedback is not None:
        if feedback.prefer_cheaper:
            score -= 5 * p.cost_tier
            reasons.append(f"reviewer asked for cheaper: -{5 * p.cost_tier}")
        if feedback.prefer_low_latency and p.p95_latency_ms is not None:
            penalty = round(p.p95_latency_ms / 50, 2)
            score -= penalty
            reasons.append(f"reviewer asked for lower latency: -{penalty:g}")
        if feedback.prefer_deployment is not None and p.deployment == feedback.prefer_deployment:
            score += 4
            reasons.append(f"reviewer asked for {feedback.prefer_deployment.value}: +4")
    return round(score, 4), reasons


def _stated_or_assumed(
    constraints: Constraints,
) -> tuple[Cloud, set[WorkloadType], list[str]]:
    """The cloud and workloads to plan for, and the assumptions made where the
    constraints leave them (or the regions) unstated."""
    assumptions: list[str] = []
    cloud = constraints.cloud
    if cloud is None:
        cloud = DEFAULT_CLOUD
        assumptions.append(f"cloud not stated: assumed {cloud.value}")
    workload_list = list(constraints.workload_types)
    if not workload_list:
        workload_list = list(DEFAULT_WORKLOADS)
        assumptions.append("workloads not stated: assumed batch")
    if not constraints.regions:
        assumptions.append("regions not stated: the plan is region-agnostic until answered")
    return cloud, set(workload_list), assumptions


def _feedback(
    catalog: PatternCatalog, rejection_comment: str | None, revision: Revision | None
) -> RejectionFeedback | None:
    """The reviewer's comment as feedback, asking for cheaper patterns too when the
    critics' ``revision`` does."""
    feedback = interpret_comment(rejection_comment, catalog) if rejection_comment else None
    if revision is not None and revision.prefer_cheaper:
        base = feedback or RejectionFeedback(comment="")
        feedback = base.model_copy(
            update={
                "prefer_cheaper": True,
                "understood": [*base.understood, "critics: prefer cheaper patterns"],
            }
        )
    return feedback


_Ranked = tuple[float, int, int, Pattern]


def _candidates(
    patterns: list[Pattern],
    constraints: Constraints,
    workloads: set[WorkloadType],
    chosen: set[str],
    feedback: RejectionFeedback | None,
) -> tuple[list[Candidate], list[_Ranked]]:
    """Every pattern of a capability as a candidate (excluded with why, or scored), and
    the eligible ones as (score, cost tier, catalogue index, pattern)."""
    candidates: list[Candidate] = []
    ranked: list[_Ranked] = []
    for index, p in enumerate(patterns):
        tradeoffs = [*(f"+ {x}" for x in p.pros), *(f"- {x}" for x in p.cons)]
        why_not = _exclusion(p, constraints, workloads, chosen, feedback)
        if why_not is not None:
            candidates.append(
                Candidate(id=p.id, summary=p.summary, excluded=why_not, tradeoffs=tradeoffs)
            )
            continue
        score, reasons = _score(p, constraints, workloads, feedback)
        candidates.append(
            Candidate(id=p.id, summary=p.summary, score=score, reasons=reasons, tradeoffs=tradeoffs)
        )
        ranked.append((score, p.cost_tier, index, p))
    return candidates, ranked


def _without_replaced(
    candidates: list[Candidate], ranked: list[_Ranked], replace: set[str]
) -> tuple[list[Candidate], list[_Ranked]]:
    """The critics asked to replace the patterns in ``replace``: where an eligible
    alternative exists, they are excluded (and unranked); else all stay."""
    kept = [t for t in ranked if t[3].id not in replace]
    if not (kept and len(kept) < len(ranked)):
        return candidates, ranked
    gone = {t[3].id for t in ranked} - {t[3].id for t in kept}
    candidates = [
        c.model_copy(update={"excluded": "a critic asked to replace it", "score": None})
        if c.id in gone
        else c
        for c in candidates
    ]
    return candidates, kept


def _best_choice(
    capability: Capability, candidates: list[Candidate], ranked: list[_Ranked]
) -> Choice:
    """The best ranked pattern (highest score, then cheapest, then catalogue order) as
    the capability's choice, with its justification."""
    ranked.sort(key=lambda t: (-t[0], t[1], t[2]))
    best_score, _, _, best = ranked[0]
    best_reasons = next(c.reasons for c in candidates if c.id == best.id)
    others = len(ranked) - 1
    justification = (
        f"{best.id}: {best.summary}; score {best_score:g} "
        f"({'; '.join(best_reasons) or 'no preference applied'})"
        f", best of {others + 1} eligible"
        + (f", {len(candidates) - len(ranked)} excluded" if len(candidates) > len(ranked) else "")
    )
    return Choice(
        capability=capability,
        pattern_id=best.id,
        justification=justification,
        candidates=candidates,
    )


def plan(
    constraints: Constraints,
    catalog: PatternCatalog,
    rejection_comment: str | None = None,
    revision: Revision | None = None,
) -> Plan:
    """Compose one pattern per mandatory capability under ``constraints``.

    Never raises for valid constraints: unknown cloud or workloads become stated
    assumptions, and a capability no pattern fits becomes a gap. A ``revision`` (the
    critics' findings) prefers cheaper patterns if it says so and replaces the patterns
    it names where another eligible one exists.
    """
    cloud, workloads, assumptions = _stated_or_assumed(constraints)
    feedback = _feedback(catalog, rejection_comment, revision)
    replace = set(revision.avoid) if revision is not None else set()
    choices: list[Choice] = []
    gaps: list[Gap] = []
    chosen: set[str] = set()
    for capability in MANDATORY_CAPABILITIES:
        candidates, ranked = _candidates(
            catalog.for_capability(capability, cloud), constraints, workloads, chosen, feedback
        )
        if not ranked:
            detail = (
                f"no {cloud.value} pattern for {capability.value} fits the constraints"
                if candidates
                else f"the catalogue has no {cloud.value} pattern for {capability.value}"
            )
            gaps.append(Gap(capability=capability, detail=detail, candidates=candidates))
            continue
        candidates, ranked = _without_replaced(candidates, ranked, replace)
        choice = _best_choice(capability, candidates, ranked)
        chosen.add(choice.pattern_id)
        choices.append(choice)
    return Plan(
        cloud=cloud,
        regions=list(constraints.regions),
        workloads=sorted(workloads),
        choices=choices,
        gaps=gaps,
        assumptions=assumptions,
        feedback=feedback,
        catalog_version=catalog.version,
    )
