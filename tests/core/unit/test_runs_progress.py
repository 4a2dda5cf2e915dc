"""The one-line progress of ``GET /runs`` from each family's progress query result."""

from __future__ import annotations

from api.routes.runs import _progress_text


def test_progress_lines_of_each_family() -> None:
    assert _progress_text("rllm", "attempt:2") == "step attempt:2"
    assert _progress_text("mrp", {"phase": "map", "windows_done": 3, "windows_total": 8}) == (
        "map: 3/8 windows"
    )
    assert _progress_text("mrp", {"phase": "compile", "windows_total": 0}) == "compile"
    assert _progress_text("srl", {"done": 4, "task_count": 6}) == "4/6 tasks"
    # Before the first window read the tasks, the count is unknown.
    assert _progress_text("srl", {"done": 0, "task_count": None}) == "0/? tasks"
    # An answer of another shape (an older run's query) shows no progress.
    assert _progress_text("srl", "busy") is None
    assert _progress_text("rllm", {"step": "x"}) is None
