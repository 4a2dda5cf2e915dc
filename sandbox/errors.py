"""Errors raised by the sandbox.

The split matters to callers (Temporal activities): ``SandboxUnavailable`` means the
jail itself could not be built or started, so nothing ran and nothing will run
unjailed; ``SandboxError`` covers requests the jail refused (bad paths, a command that
cannot be executed inside it). A program that merely fails inside the jail is not an
error: it comes back as a ``SandboxResult`` with its exit code.
"""

from __future__ import annotations


class SandboxError(Exception):
    """A sandboxed run was refused or could not be carried out."""


class SandboxUnavailable(SandboxError):
    """nsjail is missing or cannot start a jail here; the work was not run at all."""
