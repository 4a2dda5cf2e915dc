"""The ``smoke`` validator's verdict from a jailed run, and what ``design show`` and the
API show of it (issue 38 §2), on recorded jail results: no jail here (the real runs are
in ``tests/design/integration/test_smoke.py``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from activities.design.validators.jailed import SMOKE_REPORT, run_smoke, smoke_result
from cli.design_text import _view_text
from client.design_view import smoke_view, stored_smoke
from keel.design.validation import ValidationReport, ValidatorResult
from sandbox.models import SandboxConfig, SandboxResult
from store.artifacts import LocalArtifactStore


def _report(**changes: Any) -> dict[str, Any]:
    steps = [
        {"name": n, "ok": True, "detail": "ok", "seconds": 0.1}
        for n in ("storage", "ingest", "pipeline", "fastapi", "lambda", "drift")
    ]
    report: dict[str, Any] = {
        "passed": True,
        "failed_step": None,
        "seconds": 9.5,
        "run_date": "2026-01-31",
        "entry_points": ["fastapi", "lambda"],
        "steps": steps,
        "metrics": {"auc": 0.95, "accuracy": 0.9},
        "predictions": [
            {
                "entry_point": "fastapi",
                "route": "POST /predict",
                "input": {"features": {"x": 1.0}},
                "output": {"score": 0.25, "model": "v1"},
            },
            {
                "entry_point": "lambda",
                "route": "POST /predict",
                "input": {"version": "2.0", "body": "x" * 5000},
                "output": {"statusCode": 200, "body": '{"score": 0.25, "model": "v1"}'},
            },
        ],
        "answer": {
            "question": "How?",
            "answer": "From the checkpoint [runbook].",
            "model": "m1",
            "passages": [{"doc_id": "runbook", "text": "Restart.", "score": 0.5}],
        },
        "drift": {
            "version": "v1",
            "rows": 120,
            "psi": {"x": 0.01},
            "max_psi": 0.01,
            "threshold": 0.2,
            "drifted": [],
        },
    }
    report.update(changes)
    return report


def _ran(report: dict[str, Any] | None, exit_code: int = 0) -> SandboxResult:
    files = {} if report is None else {SMOKE_REPORT: json.dumps(report).encode()}
    return SandboxResult(exit_code=exit_code, stdout="{}", files=files)


def test_a_passing_report_passes_and_is_kept() -> None:
    result = smoke_result(_ran(_report()))
    assert result.status == "passed"
    assert result.summary.startswith("smoke: 6 steps passed in 9.5 s; served through fastapi")
    assert "auc 0.95" in result.summary and "drift over 120 served rows: none" in result.summary
    assert result.details["report"] == _report()


def test_a_failed_step_fails_naming_the_step_and_its_file() -> None:
    report = _report(passed=False, failed_step="lambda")
    report["steps"][4] = {
        "name": "lambda",
        "ok": False,
        "detail": "RuntimeError: boom",
        "seconds": 0.1,
        "file": "services/serve/handler.py",
        "line": 42,
    }
    result = smoke_result(_ran(report, exit_code=1))
    assert result.status == "failed"
    assert result.summary == "smoke step lambda failed: RuntimeError: boom"
    assert result.details["findings"] == [
        {
            "message": "smoke step lambda failed: RuntimeError: boom",
            "file": "services/serve/handler.py",
            "line": 42,
        }
    ]


def test_never_passed_without_a_report_or_against_the_exit_status() -> None:
    # Exit 0 but no report: the smoke did not do its job.
    none = smoke_result(_ran(None))
    assert none.status == "failed" and f"no {SMOKE_REPORT}" in none.summary
    # A crash before the report: the exit status and the last line.
    crashed = smoke_result(
        SandboxResult(exit_code=1, stderr="ModuleNotFoundError: No module named 'x'")
    )
    assert crashed.status == "failed" and "No module named 'x'" in crashed.summary
    # A report that says passed from a run that exited 1.
    odd = smoke_result(_ran(_report(), exit_code=1))
    assert odd.status == "failed" and "passed=True" in odd.summary
    # A report with no steps is no pass.
    empty = smoke_result(_ran(_report(steps=[])))
    assert empty.status == "failed"
    # A run stopped by the sandbox says which limit.
    stopped = smoke_result(SandboxResult(exit_code=None, timed_out=True, limit="wall"))
    assert stopped.status == "failed" and "wall-clock limit" in stopped.summary


def test_not_run_when_it_cannot_run() -> None:
    missing = asyncio.run(run_smoke({"a.py": "x = 1\n"}, SandboxConfig()))
    assert missing.status == "not_run" and "no services/smoke.py" in missing.summary
    no_jail = SandboxConfig.model_validate({"nsjail_path": "/nonexistent/nsjail"})
    jail = asyncio.run(run_smoke({"services/smoke.py": "x = 1\n"}, no_jail))
    assert jail.status == "not_run" and "nsjail not found" in jail.summary


def test_design_show_prints_metrics_a_prediction_per_entry_point_and_drift() -> None:
    result = smoke_result(_ran(_report()))
    other = ValidatorResult(name="ruff", status="passed", summary="clean")
    dumped = ValidationReport(results=[other, result]).model_dump(mode="json")
    smoke = smoke_view(dumped)
    assert smoke is not None
    assert smoke["status"] == "passed" and smoke["metrics"] == {"auc": 0.95, "accuracy": 0.9}
    assert [p["entry_point"] for p in smoke["predictions"]] == ["fastapi", "lambda"]
    # A long input is cut for the view (the whole report stays in reports/smoke.json).
    assert isinstance(smoke["predictions"][1]["input"], str)
    assert smoke["predictions"][1]["input"].endswith("...")
    assert smoke["drift"]["drifted"] == [] and smoke["drift"]["rows"] == 120
    view = {
        "project": "p",
        "decision_set": "ds1",
        "status": "completed",
        "version": 1,
        "previous": None,
        "plan": None,
        "cost": None,
        "policy": None,
        "validation": {"ruff": "passed", "smoke": "passed"},
        "smoke": smoke,
        "archive_digest": None,
    }
    text = _view_text(view)
    assert "  smoke: passed: smoke: 6 steps passed" in text
    assert "    metrics: accuracy 0.9, auc 0.95" in text
    assert (
        '    fastapi POST /predict: {"features": {"x": 1.0}} -> {"model": "v1", "score": 0.25}'
        in text
    )
    assert "    lambda POST /predict: " in text
    assert "    answer (m1, passages runbook): From the checkpoint [runbook]." in text
    assert "    drift: 120 served rows, max PSI 0.01 (threshold 0.2), drifted: none" in text
    assert smoke_view(ValidationReport(results=[other]).model_dump(mode="json")) is None


def test_stored_smoke_reads_the_report_the_validation_event_names(
    monkeypatch: Any, tmp_path: Path
) -> None:
    import client.design_view as view

    artifacts = LocalArtifactStore(tmp_path)
    dumped = ValidationReport(results=[smoke_result(_ran(_report()))]).model_dump(mode="json")
    digest = artifacts.put_json(dumped)
    missing = LocalArtifactStore(tmp_path / "other").put_json({"results": []})

    class Stored:
        def __init__(self, digest: str | None) -> None:
            self.last = {} if digest is None else {"validation": {"report": digest}}

    for named, expected in ((digest, "passed"), (missing, None), (None, None)):
        monkeypatch.setattr(view, "stored_view", lambda sm, p, d, named=named: Stored(named))
        got = stored_smoke(None, artifacts, "p", "ds1")  # type: ignore[arg-type]
        assert (got or {}).get("status") == expected
