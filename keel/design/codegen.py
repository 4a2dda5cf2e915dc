"""What a repository is generated from: the approved plan and everything decided about it.

Pure (the models only); the providers that turn it into files are in
``activities/design/codegen.py`` and its renderers (``app.py``, ``infra.py``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import Constraints
from keel.design.critics import CostEstimate
from keel.design.patterns import PatternCatalog
from keel.design.planner import Plan
from keel.design.policy import PolicyReport
from keel.design.reasons import ReasonCard

__all__ = ["CodeGenRequest"]


class CodeGenRequest(BaseModel):
    """Everything a provider needs to write the repository of one decision set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    project: str = Field(min_length=1, max_length=200)
    decision_set: str = Field(min_length=1, max_length=200)
    plan: Plan
    constraints: Constraints
    rationale_md: str = ""
    cost: CostEstimate
    policy: PolicyReport
    reason_cards: list[ReasonCard] = Field(default_factory=list)
    #: The catalogue, for the BOM lines in the Terraform; without it only pattern ids show.
    catalog: PatternCatalog | None = None
