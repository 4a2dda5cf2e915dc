"""Run a task's tests (keel.srl.checks) in the jail on the file after an action.

One jail run per step: the jail's Python (sandbox.python_block, the existing sandbox
limits) executes each test's source in a fresh namespace with ``SOURCE`` (the file's
text) and ``FILE`` (its name) bound, and reports which ones ran to the end. A test that
raises, ``SystemExit`` included, fails; a run the jail stops (a timeout, the memory
limit, output past its cap) or whose report is malformed fails every test. A jail that
cannot start raises ``SandboxUnavailable`` (the activity is retried).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from keel.srl.checks import TaskTest
from keel.srl.rewards import passed_fraction
from sandbox import SandboxConfig, SandboxLimits, run_python_block_async

#: Runs inside the jail with ``source``, ``file`` and ``tests`` bound ([name, code] pairs).
_DRIVER = """\
results = []
for name, code in tests:
    scope = {"__name__": "__keel_test__", "SOURCE": source, "FILE": file}
    try:
        exec(compile(code, "test:" + name, "exec"), scope)
    except BaseException as exc:
        results.append([name, False, (type(exc).__name__ + ": " + str(exc))[:300]])
    else:
        results.append([name, True, None])
"""


async def run_task_tests(
    tests: Sequence[TaskTest],
    text: str,
    file: str,
    *,
    limits: SandboxLimits | None = None,
    config: SandboxConfig | None = None,
) -> tuple[float | None, dict[str, Any]]:
    """The fraction of ``tests`` that pass on ``text`` (``None`` without tests) and what
    the run reported: ``{"tests": [{"name", "passed", "error"}], "tests_error"}``."""
    if not tests:
        return None, {}
    result = await run_python_block_async(
        _DRIVER,
        inputs={"source": text, "file": file, "tests": [[t.name, t.source] for t in tests]},
        outputs=["results"],
        limits=limits,
        config=config,
    )
    names = [t.name for t in tests]
    rows: list[dict[str, Any]] = []
    error: str | None = None
    reported = result.outputs.get("results") if result.ok else None
    if (
        isinstance(reported, list)
        and len(reported) == len(names)
        and all(
            isinstance(r, list) and len(r) == 3 and r[0] == n and isinstance(r[1], bool)
            for r, n in zip(reported, names, strict=True)
        )
    ):
        rows = [
            {"name": n, "passed": r[1], "error": r[2] if isinstance(r[2], str) else None}
            for r, n in zip(reported, names, strict=True)
        ]
    else:
        # The jail stopped the run, or its report (written inside the jail) is not ours.
        if result.error is not None:
            error = f"{result.error.type}: {result.error.message}"[:500]
        else:
            error = "the tests' report is malformed"
        rows = [{"name": n, "passed": False, "error": None} for n in names]
    passed = sum(1 for r in rows if r["passed"])
    return passed_fraction(passed, len(rows)), {"tests": rows, "tests_error": error}
