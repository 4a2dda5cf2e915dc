"""Validators (§21.1 node 10) run on a generated repository.

ruff, mypy, pytest and the smoke (``make smoke``: the sample pipeline and a prediction
through every serving entry point, S3 in moto) execute (or import) the repository's code,
so they run inside the nsjail sandbox (no network) with the repository as the jail's workspace. The other checks only read
files and run on the host in a temporary directory: an HCL parse and checkov on the
Terraform, actionlint on the workflows, hadolint on a Dockerfile, a CycloneDX SBOM of
``requirements.txt`` (checked, not made, here: :func:`add_sbom` puts it in the tree
before validation), a secret scan (detect-secrets) and the wiring check (the pieces
against each other: :mod:`keel.design.wiring`). Each result is a
:class:`~keel.design.validation.ValidatorResult`; a validator whose tool is missing, or
whose jail cannot start, is ``not_run`` with the reason, never ``passed``.

The package: :mod:`.jailed` (ruff, mypy, pytest, smoke in the jail), :mod:`.host` (HCL,
checkov, actionlint, hadolint), :mod:`.sbom`, :mod:`.secret_scan` and :mod:`.wiring`;
:func:`validate_repo` runs them all into one report.
"""

from __future__ import annotations

import asyncio
import json
import logging
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path

from temporalio import activity

from activities.design.codegen import check_paths
from activities.design.validators.host import run_actionlint, run_checkov, run_hadolint, run_hcl
from activities.design.validators.jailed import (
    JAIL_LIMITS,
    run_mypy,
    run_pytest,
    run_ruff,
    run_smoke,
)
from activities.design.validators.jailed import (
    _venv_bin as _venv_bin,  # activities/design/repair.py
)
from activities.design.validators.sbom import SBOM_PATH, add_sbom, check_sbom, make_sbom
from activities.design.validators.secret_scan import _write_tree, scan_secrets
from activities.design.validators.wiring import check_wiring
from activities.heartbeat import heartbeating
from keel.design.steps import VALIDATORS
from keel.design.validation import ValidationReport, ValidatorResult
from sandbox.models import SandboxConfig, default_config

log = logging.getLogger(__name__)

#: Seconds between heartbeats while one validator runs (a jailed mypy can take minutes).
HEARTBEAT_EVERY_S = 10.0


def _heartbeat(detail: str) -> None:
    if activity.in_activity():
        activity.heartbeat(detail)


def report_files(report: ValidationReport) -> dict[str, str]:
    """``reports/<validator>.json`` for each result: the validation report, kept beside the
    validated tree (never added to it, so the archive is the tree that was validated)."""
    return {
        f"reports/{r.name}.json": json.dumps(r.model_dump(mode="json"), indent=2, sort_keys=True)
        + "\n"
        for r in report.results
    }


class _Lanes:
    """The validators' three lanes over one tree, and what they found and took."""

    def __init__(
        self, files: dict[str, str], config: SandboxConfig, only: Collection[str] | None = None
    ) -> None:
        self.files = files
        self.config = config
        self.only = None if only is None else frozenset(only)
        self.done: dict[str, ValidatorResult] = {}
        self.timings: dict[str, float] = {}
        self.running: list[str] = []
        self.last = "start"  # the last beat, repeated while no validator runs (between two)

    def beat(self) -> str:
        """The heartbeat's details: the validators running now, else the last ones."""
        return ", ".join(self.running) or self.last

    async def timed(self, name: str, step: Callable[[], Awaitable[ValidatorResult]]) -> None:
        if self.only is not None and name not in self.only:
            self.done[name] = ValidatorResult(
                name=name, status="not_run", summary="not selected for this run"
            )
            return
        self.running.append(name)
        self.last = ", ".join(self.running)
        _heartbeat(self.last)
        started = time.monotonic()
        try:
            self.done[name] = await step()
        finally:
            self.running.remove(name)
        self.timings[name] = round(time.monotonic() - started, 3)

    async def jailed(self) -> None:
        files, config = self.files, self.config
        await self.timed("ruff", lambda: run_ruff(files, config))
        await self.timed("mypy", lambda: run_mypy(files, config))
        await self.timed("pytest", lambda: run_pytest(files, config))
        # After the repository's own tests, as its CI runs them.
        await self.timed("smoke", lambda: run_smoke(files, config))

    async def host_tools(self, root: Path) -> None:
        files = self.files
        await self.timed("checkov", lambda: run_checkov(files, root))
        await self.timed("actionlint", lambda: run_actionlint(files, root))
        await self.timed("hadolint", lambda: run_hadolint(files, root))

    async def host_checks(self) -> None:
        # In threads: the secret scan, the HCL parse and the SBOM's schema check are pure
        # Python and take seconds on a large tree; on the event loop they would stall the
        # worker's heartbeats. They run while the host tools' processes do: one after the
        # other they made the host lane the longest (batch_training: secrets 2.9 s, hcl
        # 0.7 s, checkov 6.5 s, sbom 2.4 s; 12.6 s for the whole report, the jailed lane
        # 7.9 s).
        files = self.files
        await self.timed("secrets", lambda: asyncio.to_thread(scan_secrets, files))
        await self.timed("hcl", lambda: asyncio.to_thread(run_hcl, files))
        await self.timed("sbom", lambda: asyncio.to_thread(check_sbom, files))
        await self.timed("wiring", lambda: asyncio.to_thread(check_wiring, files))

    async def run_all(self) -> None:
        with tempfile.TemporaryDirectory(prefix="keel-validate-") as tmp:
            root = Path(tmp)
            _write_tree(self.files, root)
            await asyncio.gather(self.jailed(), self.host_tools(root), self.host_checks())

    def results(self) -> list[ValidatorResult]:
        """Every validator's result in :data:`keel.design.steps.VALIDATORS`, with the seconds it took."""
        return [
            self.done[name].model_copy(
                update={"details": {**self.done[name].details, "seconds": self.timings.get(name)}}
            )
            for name in VALIDATORS
        ]


async def validate_repo(
    files: dict[str, str],
    *,
    sandbox_config: SandboxConfig | None = None,
    only: Collection[str] | None = None,
) -> ValidationReport:
    """Run every validator on ``files``, exactly as given: nothing is added to the tree
    here (see :func:`add_sbom`); the report's ``files`` hold ``reports/<validator>.json``,
    which travel beside the tree, not in it. ``only`` (``DesignOptions.validators``) names
    the validators to run; the others are reported ``not_run`` ("not selected for this run").

    Three lanes run side by side: the jailed tools (ruff, mypy, pytest, smoke, one after
    the other: each jail takes its share of memory), the host's tools (checkov, actionlint,
    hadolint) and the host's pure-Python checks (secrets, hcl, sbom, wiring, in threads). The report lists them in :data:`keel.design.steps.VALIDATORS`
    whatever order they finished in. Inside an activity it heartbeats with the running
    validators' names at each step and every :data:`HEARTBEAT_EVERY_S` seconds.
    """
    files = check_paths(files)
    lanes = _Lanes(files, sandbox_config or default_config(), only)
    await heartbeating(lanes.run_all(), every_s=HEARTBEAT_EVERY_S, details=lanes.beat)
    results = lanes.results()
    report = ValidationReport(results=results)
    log.info(
        "validated %d files: %s", len(files), ", ".join(f"{r.name}={r.status}" for r in results)
    )
    return report.model_copy(update={"files": report_files(report)})


__all__ = [
    "JAIL_LIMITS",
    "SBOM_PATH",
    "add_sbom",
    "check_sbom",
    "check_wiring",
    "make_sbom",
    "report_files",
    "run_hcl",
    "run_smoke",
    "scan_secrets",
    "validate_repo",
]
