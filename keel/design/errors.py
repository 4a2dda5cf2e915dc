"""Errors of the design domain.

Each error carries structured issues naming the offending field, so an activity can turn
it into a non-retryable ``ApplicationError`` with the same fields as details, and an
intake answer that does not fit the schema can be refused field by field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from keel.problems import where


class DesignIssue(BaseModel):
    """One problem, located by its dotted field path."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str
    message: str

    def render(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class DesignError(Exception):
    """Base class of every design-domain error."""

    def __init__(self, issues: list[DesignIssue], what: str) -> None:
        self.issues = issues
        lines = "\n  ".join(issue.render() for issue in issues)
        super().__init__(f"{what}:\n  {lines}")


class ConstraintError(DesignError, ValueError):
    """Constraints or intake answers that do not fit the Constraint Schema."""

    def __init__(self, issues: list[DesignIssue]) -> None:
        super().__init__(issues, "invalid constraints")


class PatternError(DesignError, ValueError):
    """The capability pattern catalogue is malformed or inconsistent."""

    def __init__(self, issues: list[DesignIssue]) -> None:
        super().__init__(issues, "invalid capability patterns")


class PriceTableError(DesignError, ValueError):
    """The price table is malformed."""

    def __init__(self, issues: list[DesignIssue]) -> None:
        super().__init__(issues, "invalid price table")


def issues_from_validation(exc: Exception, prefix: str = "") -> list[DesignIssue]:
    """Pydantic's errors as issues whose ``field`` is the dotted location."""
    if not isinstance(exc, ValidationError):
        return [DesignIssue(field=prefix, message=str(exc))]
    issues = []
    for err in exc.errors():
        loc = where(err["loc"])
        field = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
        issues.append(DesignIssue(field=field, message=err["msg"]))
    return issues
