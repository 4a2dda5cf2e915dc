"""Errors of the MRP compiler, registry and budget (policy's own, ``PolicyViolation``, is
beside its report in :mod:`keel.mrp.policy`).

Every error is a plain exception with structured fields, so the compile activity can turn
it into a non-retryable ``ApplicationError`` carrying the same fields as details, and the
CLI can print one line per issue.
"""

from __future__ import annotations

from decimal import Decimal

from pydantic import BaseModel, ConfigDict

from keel.problems import located


class MrpError(Exception):
    """Base class of every MRP error."""


class DslIssue(BaseModel):
    """One problem in a job file, located by its dotted key path and 1-based line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    line: int | None = None
    message: str

    def render(self, source: str = "") -> str:
        """``source:line: path: message``, leaving out the parts that are unknown."""
        path = f"{self.path}: " if self.path else ""
        return located(f"{path}{self.message}", source, self.line)


class DslError(MrpError, ValueError):
    """The job file is not valid YAML or not a valid DSL document."""

    def __init__(self, issues: list[DslIssue], source: str = "") -> None:
        self.issues = issues
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [issue.render(self.source) for issue in self.issues]
        return "invalid MRP job:\n  " + "\n  ".join(lines)


class InputsRefused(MrpError, PermissionError):
    """``inputs.files`` cannot be resolved safely: no root to resolve them under, a root
    outside the configured ones, a link out of the root, or more files than the caps allow.
    """


class RegistryError(MrpError, LookupError):
    """An operator reference cannot be resolved, or the registry itself is inconsistent."""


class BudgetExceeded(MrpError):
    """The running job spent more than its kill limit in one dimension (units or USD)."""

    def __init__(self, dimension: str, spent: Decimal, limit: Decimal) -> None:
        self.dimension = dimension
        self.spent = spent
        self.limit = limit
        super().__init__(f"budget exceeded: spent {spent} {dimension}, kill limit is {limit}")
