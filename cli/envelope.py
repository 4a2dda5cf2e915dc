"""The one error model of every Keel CLI (``cli/toolkit.py`` reports it).

Apart from the toolkit because it needs pydantic, which a CLI that only prints its help
should not pay for: it is imported when a command fails.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class CliError(BaseModel):
    """One CLI failure, whatever the family.

    ``type`` is the family's error code (``refused``, ``RLLM_RETRY_EXHAUSTED``, ...),
    ``details`` the family's payload; ``lines`` are what stderr shows (one ``error:`` line
    each), ``hint`` a next step shown to people.
    """

    family: str
    type: str
    message: str
    exit_code: int
    details: Any = None
    lines: list[str] = []
    hint: str | None = None

    def envelope(self) -> dict[str, Any]:
        """``{"error": {...}}``: the envelope, with ``code`` kept beside ``type`` (the key
        ``mrp`` documented first)."""
        body = self.model_dump(mode="json", exclude={"lines", "hint"})
        body["code"] = self.type
        return {"error": body}
