"""Cost estimates at compile time and budget accounting at run time.

The estimate has two dimensions:

- **units**: each operator's ``cost_weight`` times its invocations (one per shard for the
  map operator, one for each other step);
- **usd**: ``units * caps.usd_per_unit`` plus, for operators that declare an
  :class:`~keel.mrp.registry.LlmEstimate`, ``items * calls_per_item * tokens_per_call / 1000
  * usd_per_1k_tokens``.

At run time a :class:`BudgetTracker` adds up what was really spent and trips the kill switch
(:class:`~keel.mrp.errors.BudgetExceeded`) once either dimension passes its kill limit:
``kill_ratio`` (default 1.2) times the estimate, and never more than the job's own budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal

from pydantic import BaseModel, ConfigDict, Field

from keel.mrp.errors import BudgetExceeded
from keel.mrp.normalize import decimal_context, decimal_sum, quantize, to_decimal
from keel.mrp.registry import OperatorSpec

AMOUNT_PLACES = 6  # amounts are stored with six decimal places, so their text is fixed
DEFAULT_KILL_RATIO = Decimal("1.2")
ROLE_ORDER = ("map", "reduce", "evaluate", "produce")


class CostLine(BaseModel):
    """The estimate of one step."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: str
    operator_ref: str
    invocations: int = Field(ge=0)
    items: int = Field(ge=0)
    units: Decimal
    llm_tokens: Decimal
    llm_usd: Decimal


class CostEstimate(BaseModel):
    """The compile-time estimate: one line per step and the totals."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lines: list[CostLine]
    units: Decimal
    llm_usd: Decimal
    usd: Decimal


def _amount(value: Decimal) -> Decimal:
    return quantize(value, AMOUNT_PLACES)


def step_workload(role: str, shard_count: int, item_count: int) -> tuple[int, int]:
    """``(invocations, items)`` of a step: map runs per shard over every item; the reducer
    sees one item per shard output; evaluate and produce see the one reduced output."""
    if role == "map":
        return shard_count, item_count
    if role == "reduce":
        return 1, shard_count
    return 1, 1


def estimate_cost(
    specs: Mapping[str, OperatorSpec],
    shard_count: int,
    item_count: int,
    usd_per_unit: Decimal = Decimal(0),
) -> CostEstimate:
    """Estimate a job from its resolved operators (``role -> spec``) and its shape."""
    ctx = decimal_context()
    lines: list[CostLine] = []
    for role in sorted(specs, key=lambda r: (ROLE_ORDER.index(r) if r in ROLE_ORDER else 99, r)):
        spec = specs[role]
        invocations, items = step_workload(role, shard_count, item_count)
        units = ctx.multiply(Decimal(invocations), spec.cost_weight)
        tokens = Decimal(0)
        llm_usd = Decimal(0)
        if spec.llm is not None:
            calls = ctx.multiply(Decimal(items), spec.llm.calls_per_item)
            tokens = ctx.multiply(calls, Decimal(spec.llm.tokens_per_call))
            llm_usd = ctx.multiply(ctx.divide(tokens, Decimal(1000)), spec.llm.usd_per_1k_tokens)
        lines.append(
            CostLine(
                role=role,
                operator_ref=spec.ref,
                invocations=invocations,
                items=items,
                units=_amount(units),
                llm_tokens=quantize(tokens, 0),
                llm_usd=_amount(llm_usd),
            )
        )
    units_total = decimal_sum(line.units for line in lines)
    llm_total = decimal_sum(line.llm_usd for line in lines)
    usd = ctx.add(ctx.multiply(units_total, to_decimal(usd_per_unit)), llm_total)
    return CostEstimate(
        lines=lines, units=_amount(units_total), llm_usd=_amount(llm_total), usd=_amount(usd)
    )


class BudgetLimits(BaseModel):
    """Kill limits of a run, per dimension."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    units: Decimal = Field(ge=0)
    usd: Decimal = Field(ge=0)
    kill_ratio: Decimal = Field(ge=1)


def kill_limits(
    estimate: CostEstimate,
    *,
    budget_units: Decimal | None,
    budget_usd: Decimal | None,
    kill_ratio: Decimal = DEFAULT_KILL_RATIO,
) -> BudgetLimits:
    """``kill_ratio * estimate`` per dimension, capped by the job's budget where it has one.

    The ratio leaves room for estimates that are a little low; the budget is what the job's
    owner agreed to spend, so the kill switch never waits past it.
    """
    ctx = decimal_context()

    def limit(estimated: Decimal, budget: Decimal | None) -> Decimal:
        scaled = ctx.multiply(estimated, kill_ratio)
        return _amount(scaled if budget is None else min(scaled, budget))

    return BudgetLimits(
        units=limit(estimate.units, budget_units),
        usd=limit(estimate.usd, budget_usd),
        kill_ratio=kill_ratio,
    )


class BudgetState(BaseModel):
    """Everything a tracker knows, small enough for workflow state and continue-as-new."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limits: BudgetLimits
    spent_units: Decimal = Decimal(0)
    spent_usd: Decimal = Decimal(0)
    charges: int = 0
    tripped: str | None = Field(
        default=None, description="The dimension that passed its limit, once one has."
    )


class BudgetTracker:
    """Pure accounting of a run's spend against its :class:`BudgetLimits`.

    The workflow charges each finished shard (units from the operator's weight, USD from
    the LLM call records). Charges go through the fixed Decimal context, and the workflow
    applies them in history order, so a replay reaches the same totals and the same trip.
    Once tripped, the tracker stays tripped and every further charge raises as well.
    """

    def __init__(self, limits: BudgetLimits, state: BudgetState | None = None) -> None:
        if state is not None and state.limits != limits:
            raise ValueError("state belongs to different limits")
        self._state = state or BudgetState(limits=limits)

    @classmethod
    def from_state(cls, state: BudgetState) -> BudgetTracker:
        """Resume from a saved :meth:`state`."""
        return cls(state.limits, state)

    @property
    def limits(self) -> BudgetLimits:
        """The kill limits."""
        return self._state.limits

    def state(self) -> BudgetState:
        """A snapshot to save."""
        return self._state

    @property
    def spent_units(self) -> Decimal:
        """Units charged so far."""
        return self._state.spent_units

    @property
    def spent_usd(self) -> Decimal:
        """USD charged so far."""
        return self._state.spent_usd

    @property
    def tripped(self) -> bool:
        """Whether the kill switch has fired."""
        return self._state.tripped is not None

    def remaining(self) -> tuple[Decimal, Decimal]:
        """``(units, usd)`` left before the kill limits (never negative)."""
        ctx = decimal_context()
        s = self._state
        return (
            max(Decimal(0), ctx.subtract(s.limits.units, s.spent_units)),
            max(Decimal(0), ctx.subtract(s.limits.usd, s.spent_usd)),
        )

    def would_exceed(self, units: Decimal | int | str = 0, usd: Decimal | int | str = 0) -> bool:
        """Whether charging this much would trip the kill switch (nothing is recorded)."""
        ctx = decimal_context()
        s = self._state
        return (
            s.tripped is not None
            or ctx.add(s.spent_units, to_decimal(units)) > s.limits.units
            or ctx.add(s.spent_usd, to_decimal(usd)) > s.limits.usd
        )

    def charge(self, units: Decimal | int | str = 0, usd: Decimal | int | str = 0) -> BudgetState:
        """Record spend; raise :class:`BudgetExceeded` if a dimension is over its limit.

        The charge is recorded before raising: the money is spent either way, and the
        state should say so.
        """
        u, d = to_decimal(units), to_decimal(usd)
        if u < 0 or d < 0:
            raise ValueError("charges must not be negative")
        ctx = decimal_context()
        s = self._state
        spent_units = ctx.add(s.spent_units, u)
        spent_usd = ctx.add(s.spent_usd, d)
        tripped = s.tripped
        if tripped is None:
            if spent_units > s.limits.units:
                tripped = "units"
            elif spent_usd > s.limits.usd:
                tripped = "usd"
        self._state = BudgetState(
            limits=s.limits,
            spent_units=spent_units,
            spent_usd=spent_usd,
            charges=s.charges + 1,
            tripped=tripped,
        )
        if tripped == "units":
            raise BudgetExceeded("units", spent_units, s.limits.units)
        if tripped == "usd":
            raise BudgetExceeded("usd", spent_usd, s.limits.usd)
        return self._state
