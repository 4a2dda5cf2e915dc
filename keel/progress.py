"""A running run's progress as lists show it, kept by the workflow in its own memo.

``GET /runs`` (and the console on it) used to ask each running run a Temporal Query for
its progress: one round trip through a worker per row, and up to its timeout when no
worker answered. Instead, each family whose :class:`keel.families.FamilySpec` says
``progress="memo"`` upserts :class:`RunProgress` under :data:`PROGRESS_MEMO` at its step
boundaries (an MRP window, an SRL episode, an ``.rllm`` step), and a list reads it from
the visibility row its one visibility query already returned.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

#: The memo key of a run's :class:`RunProgress`.
PROGRESS_MEMO = "keel_progress"


class RunProgress(BaseModel):
    """Where a running run is: a phase, and a count of done units out of a total."""

    phase: str | None = Field(default=None, description="The step or phase (``map``)")
    done: int | None = Field(default=None, ge=0, description="Units done (None: no count)")
    total: int | None = Field(default=None, ge=0, description="Units in all (None: unknown)")
    unit: str | None = Field(default=None, description="What is counted (``windows``)")

    def line(self) -> str | None:
        """One line for a list: ``map: 3/8 windows``, ``4/? tasks``, ``step load``."""
        count = None
        if self.unit is not None and self.done is not None:
            total = "?" if self.total is None else str(self.total)
            count = f"{self.done}/{total} {self.unit}"
        parts = [p for p in (self.phase, count) if p]
        return ": ".join(parts) or None
