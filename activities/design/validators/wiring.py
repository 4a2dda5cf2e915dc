"""The wiring check as a validator: :mod:`keel.design.wiring`'s findings as one result."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keel.design.validation import ValidatorResult
from keel.design.wiring import RULES as WIRING_RULES
from keel.design.wiring import check_wiring as wiring_findings


def check_wiring(files: Mapping[str, str]) -> ValidatorResult:
    """The pieces checked against each other (:mod:`keel.design.wiring`): commands and
    module inputs against the variables declared, Lambda handlers and packages, images
    against the CI that pushes them, environment variables against the runtimes that run
    the code, alarms against what emits their metrics, job scripts against the tree. Each
    finding names its rule, the file and what is wrong."""
    if not any(p.endswith(".tf") for p in files):
        return ValidatorResult(name="wiring", status="not_run", summary="no Terraform files")
    findings = wiring_findings(files)
    details: dict[str, Any] = {
        "rules": list(WIRING_RULES),
        "findings": [f.as_dict() for f in findings[:200]],
    }
    if findings:
        counts = {r: n for r in WIRING_RULES if (n := sum(f.rule == r for f in findings))}
        return ValidatorResult(
            name="wiring",
            status="failed",
            summary=f"{len(findings)} wiring finding(s): "
            + ", ".join(f"{r} {n}" for r, n in counts.items()),
            details=details,
        )
    return ValidatorResult(
        name="wiring",
        status="passed",
        summary=f"the pieces fit: {', '.join(WIRING_RULES)} checked",
        details=details,
    )
