"""The security and compliance critic (issue 24 §4): the plan read against the data's
classification, the stated compliance regimes and the organisation's policy.

Rules, pure: the same plan always gets the same findings. Each is a
:class:`~keel.design.critics.Risk` of kind ``compliance`` or ``security``; a high one that
names a pattern is one the planner can replace, so it may send the plan back once
(``keel.design.agents.revision_for``).
"""

from __future__ import annotations

from keel.design.constraints import Compliance, Constraints, DataClassification, WorkloadType
from keel.design.critics import Risk, TechReview
from keel.design.patterns import Pattern, PatternCatalog
from keel.design.planner import Plan
from keel.design.policy import PolicySettings

#: Data classes that need encryption with customer keys and audit logging in every service.
SENSITIVE = (DataClassification.CONFIDENTIAL, DataClassification.RESTRICTED)


def _compliance(id: str, detail: str, patterns: list[str] | None = None) -> Risk:
    """A high compliance finding."""
    return Risk(id=id, kind="compliance", severity="high", detail=detail, patterns=patterns or [])


def _eligibility_risks(
    constraints: Constraints, regimes: list[Compliance], chosen: list[Pattern]
) -> list[Risk]:
    """Each chosen pattern not eligible for a regime stated or required."""
    risks: list[Risk] = []
    for regime in regimes:
        why = "stated" if regime in constraints.compliance else "required by the organisation"
        for p in chosen:
            if regime not in p.compliance:
                risks.append(
                    _compliance(
                        f"compliance:{regime.value}:{p.id}",
                        f"{p.id} is not eligible for {regime.value} ({why})",
                        [p.id],
                    )
                )
    return risks


def _placement_risks(plan: Plan, regimes: list[Compliance], s: PolicySettings) -> list[Risk]:
    """Regions outside the EU under GDPR, and regions or a cloud the organisation does
    not allow."""
    risks: list[Risk] = []
    if Compliance.GDPR in regimes:
        outside = [r for r in plan.regions if not r.startswith("eu-")]
        if outside:
            risks.append(
                _compliance(
                    "compliance:gdpr:residency",
                    "GDPR data stored outside the EU: " + ", ".join(outside),
                )
            )
    if s.allowed_regions is not None:
        outside = [r for r in plan.regions if r not in s.allowed_regions]
        if outside:
            risks.append(
                _compliance(
                    "compliance:region_not_allowed",
                    "regions the organisation does not allow: " + ", ".join(outside),
                )
            )
    if s.allowed_clouds is not None and plan.cloud not in s.allowed_clouds:
        risks.append(
            _compliance(
                "compliance:cloud_not_allowed",
                f"{plan.cloud.value} is not a cloud the organisation allows",
            )
        )
    return risks


def _classification_risks(constraints: Constraints, plan: Plan) -> list[Risk]:
    """No classification stated, sensitive data with no regime, or served online."""
    risks: list[Risk] = []
    cls = constraints.data_classification
    if cls is None:
        risks.append(
            Risk(
                id="security:unclassified",
                kind="security",
                severity="medium",
                detail="no data classification stated: encryption and access reviews "
                "cannot be sized",
            )
        )
    elif cls in SENSITIVE and not constraints.compliance:
        risks.append(
            Risk(
                id="security:sensitive_no_regime",
                kind="security",
                severity="medium",
                detail=f"{cls.value} data with no compliance regime named: say which "
                "(gdpr, hipaa, pci_dss, soc2) so eligibility can be checked",
            )
        )
    if cls in SENSITIVE and WorkloadType.ONLINE in plan.workloads:
        risks.append(
            Risk(
                id="security:online_sensitive",
                kind="security",
                severity="low",
                detail=f"an online endpoint serves {cls.value} data: authenticate callers "
                "and log every request",
            )
        )
    return risks


def review_security(
    constraints: Constraints,
    plan: Plan,
    catalog: PatternCatalog,
    settings: PolicySettings | None = None,
) -> TechReview:
    """The plan's security and compliance findings, in a fixed order."""
    s = settings or PolicySettings()
    by_id = catalog.by_id()
    chosen = [by_id[pid] for pid in plan.pattern_ids() if pid in by_id]
    regimes = sorted({*constraints.compliance, *s.required_compliance})
    return TechReview(
        risks=[
            *_eligibility_risks(constraints, regimes, chosen),
            *_placement_risks(plan, regimes, s),
            *_classification_risks(constraints, plan),
        ]
    )
