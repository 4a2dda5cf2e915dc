"""Failures outside the ten ``.rllm`` classes, in the same payload shape.

``runllm`` and ``POST /rllm/runs`` report every failure as one
:class:`~keel.rllm.errors.RllmErrorPayload`. The app's own failures carry the ten
classes' codes (exit codes 10-19); what is left is either a usage error (exit 2: a bad
option, an unreadable input file) or an internal one (exit 1: Temporal does not answer,
a worker could not start, the model server kept failing after Temporal's retries, a run
was terminated). Those two get the codes below, documented in docs/rllm-errors.md
("Other failures"). :func:`keel.rllm.errors.error_from_payload` does not rebuild them:
they are not app errors.
"""

from __future__ import annotations

from typing import Any

from keel.rllm.errors import DOC_FILE, RllmErrorPayload

INTERNAL_ERROR_CODE = "RLLM_INTERNAL_ERROR"
INTERNAL_EXIT_CODE = 1
USAGE_ERROR_CODE = "RLLM_USAGE_ERROR"
USAGE_EXIT_CODE = 2

_DOC = f"{DOC_FILE}#other-failures"


class RunnerFailure(Exception):
    """A usage or internal failure with its payload and exit code."""

    def __init__(self, payload: RllmErrorPayload, exit_code: int) -> None:
        super().__init__(payload.message)
        self.payload = payload
        self.exit_code = exit_code


def internal_failure(
    message: str,
    *,
    error_type: str = "InternalError",
    details: dict[str, Any] | None = None,
    hint: str = "Read details (and the worker's log); set KEEL_DEBUG=1 for a traceback.",
) -> RunnerFailure:
    """An infrastructure failure (exit code 1)."""
    payload = RllmErrorPayload(
        error_code=INTERNAL_ERROR_CODE,
        error_type=error_type,
        message=message,
        details=details or {},
        recovery_hint=hint,
        doc_ref=_DOC,
    )
    return RunnerFailure(payload, INTERNAL_EXIT_CODE)


def usage_failure(
    message: str,
    *,
    details: dict[str, Any] | None = None,
    hint: str = "See 'runllm <command> --help' (docs/runllm-cli.md).",
) -> RunnerFailure:
    """A wrong command line (exit code 2)."""
    payload = RllmErrorPayload(
        error_code=USAGE_ERROR_CODE,
        error_type="UsageError",
        message=message,
        details=details or {},
        recovery_hint=hint,
        doc_ref=_DOC,
    )
    return RunnerFailure(payload, USAGE_EXIT_CODE)
