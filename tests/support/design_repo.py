"""A codegen model's answer for design tests that run ``codegen="litellm"`` against the
scripted OpenAI server: a small repository, clean for the validators that can run, so a
run with it completes quickly (tests/design/faults, tests/core/faults)."""

from __future__ import annotations

#: The model's repository: small, and clean for the validators that can run.
MODEL_FILES = {
    "README.md": "# Scripted repository\n",
    "app/__init__.py": '"""A scripted service."""\n',
    "app/score.py": (
        '"""Scoring."""\n\n\ndef score(values: list[float]) -> float:\n'
        '    """The mean of ``values``."""\n    return sum(values) / len(values)\n'
    ),
    # mypy needs a target and pytest a test: a run whose tree fails a validator ends
    # validation_failed.
    "pyproject.toml": (
        '[tool.mypy]\nstrict = true\nfiles = ["app", "tests"]\n\n'
        '[tool.pytest.ini_options]\ntestpaths = ["tests"]\npythonpath = ["."]\n'
    ),
    "tests/__init__.py": "",
    "tests/test_score.py": (
        "from app.score import score\n\n\ndef test_mean() -> None:\n"
        "    assert score([1.0, 3.0]) == 2.0\n"
    ),
}
