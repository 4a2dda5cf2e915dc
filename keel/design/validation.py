"""Results of the validators run on a generated repository (§21.1 node 10).

Pure models: ``activities/design/validators.py`` runs the tools and fills these in. A
validator that could not run (tool missing, jail unavailable, nothing to check) is
``not_run`` with the reason in ``summary``; ``not_run`` is never read as passed, so a
report holding one is not :attr:`ValidationReport.complete`, and a caller that needs
every check must look at that, not only at :attr:`ValidationReport.passed`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from keel.digest import digest_bytes, digest_json

ValidatorStatus = Literal["passed", "failed", "not_run"]


class ValidatorResult(BaseModel):
    """One validator's verdict on the repository, written to ``/reports/<name>.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_-]*$")
    status: ValidatorStatus
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


class ValidationReport(BaseModel):
    """Every validator's result, in the order they ran.

    ``passed`` and ``not_run`` are derived from ``results`` whenever a report is built or
    parsed (a value passed in is ignored), so they can never disagree with the results.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    results: list[ValidatorResult]
    #: No validator failed. ``not_run`` ones neither count as passed nor as failed: see
    #: ``not_run`` and :attr:`complete`.
    passed: bool = False
    #: Names of the validators that could not run; each is unchecked, not passed.
    not_run: list[str] = Field(default_factory=list)
    #: ``reports/<validator>.json`` for each result: the report, stored beside the
    #: validated tree (never added to it: the archive is exactly the tree validated).
    files: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _derive(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("results"), list):
            results = [
                r if isinstance(r, ValidatorResult) else ValidatorResult.model_validate(r)
                for r in data["results"]
            ]
            data = {
                **data,
                "results": results,
                "passed": not any(r.status == "failed" for r in results),
                "not_run": [r.name for r in results if r.status == "not_run"],
            }
        return data

    @property
    def complete(self) -> bool:
        """Every validator ran and none failed."""
        return self.passed and not self.not_run

    @property
    def failed(self) -> list[str]:
        """Names of the validators that failed (each one makes the run ``validation_failed``)."""
        return [r.name for r in self.results if r.status == "failed"]

    def result(self, name: str) -> ValidatorResult | None:
        return next((r for r in self.results if r.name == name), None)

    def status_of(self, name: str) -> ValidatorStatus | None:
        r = self.result(name)
        return None if r is None else r.status


def tree_digest(files: Mapping[str, str | bytes]) -> str:
    """The digest of a repository tree: every path with the digest of its bytes.

    The same for the ``{path: text}`` map the validators ran on and for the archive's
    ``{name: bytes}``, so "the validated tree is the archived tree" is one comparison.
    """
    return digest_json(
        {
            path: digest_bytes(body.encode() if isinstance(body, str) else body)
            for path, body in sorted(files.items())
        }
    )


__all__ = ["ValidationReport", "ValidatorResult", "ValidatorStatus", "tree_digest"]
