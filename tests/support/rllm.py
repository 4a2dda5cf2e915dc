"""Inputs the ``.rllm`` tests share."""

from __future__ import annotations

from pathlib import Path

from store.files import bundle_files

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def summary_body(**kw: object) -> dict[str, object]:
    """A ``POST /rllm/runs`` body for examples/summary.rllm, with ``kw`` on top."""
    return {
        "path": "summary.rllm",
        "files": bundle_files(EXAMPLES / "summary.rllm"),
        "input": {"text": "Temporal keeps workflows durable. Workers run them."},
        **kw,
    }
