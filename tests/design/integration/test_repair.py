"""Repair rounds (issue 38 §5) on a real dev server: a scripted codegen model first writes
a broken handler; the validators fail on it, ``design.repair`` hands the findings to the
model, whose fix makes the validators pass and the run complete with one repair round
recorded. With ``repair_rounds=0`` the same broken handler ends the run
``validation_failed``, the report naming the handler's file."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from temporalio.client import Client

from activities.design.repair import add_missing_packages, findings_of, ruff_fix
from client.design import start_design
from keel.design.steps import DesignInput, DesignResult, Finding
from keel.settings import Settings
from store import design as design_store
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from tests.design.unit.design_data import golden_cases
from tests.support.design_repo import MODEL_FILES
from tests.support.scripted_openai import ScriptedOpenAIServer, ScriptedReply, write_models_config
from workers.main import build_worker

HANDLER = "app/score.py"
#: The handler with a syntax error (an unclosed call): ruff, mypy and pytest fail on it.
BROKEN = {
    **MODEL_FILES,
    HANDLER: MODEL_FILES[HANDLER].replace("len(values)", "len(values"),
}


def _input(**kw: object) -> DesignInput:
    return DesignInput(
        project=f"p-{uuid.uuid4().hex[:8]}",
        decision_set="ds1",
        requester="alice",
        intake=golden_cases()["batch_training"]["constraints"],
        require_approval=False,
        codegen="litellm",
        codegen_model="local",
        **kw,  # type: ignore[arg-type]
    )


async def test_a_broken_handler_is_repaired_by_the_model_and_the_set_completes(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    replies = [
        ScriptedReply(content=json.dumps({"files": BROKEN})),
        ScriptedReply(content=json.dumps({"files": {HANDLER: MODEL_FILES[HANDLER]}})),
    ]
    inp = _input()
    with ScriptedOpenAIServer(replies) as llm:
        settings.models_config = write_models_config(tmp_path / "models.yaml", llm.base_url)
        async with build_worker(client, settings):
            handle = await start_design(client, inp, task_queue=settings.task_queue)
            result: DesignResult = await handle.result()
        # The repair call saw the findings and the broken handler.
        assert len(llm.chat_requests) == 2
        repair_ask = json.dumps(llm.chat_requests[1].json)
        assert HANDLER in repair_ask and "len(values\\\\n" in repair_ask

    assert result.status == "completed", result.validation
    assert [r.round for r in result.repairs] == [1]
    (round1,) = result.repairs
    assert "pytest" in round1.failed
    assert round1.files_changed == [HANDLER]
    assert any(o.finding.file == HANDLER and o.fixed_by == "model" for o in round1.outcomes), (
        round1.outcomes
    )
    assert "failed" not in round1.validation.values()
    # The shipped tree is the repaired one.
    artifacts = artifact_store_from_settings(settings)
    assert artifacts.get_json(round1.files_digest)[HANDLER] == MODEL_FILES[HANDLER]
    # The round is in history, the events and the Change Summary.
    sm = get_sessionmaker(settings.resolved_database_url)
    events = design_store.list_events(sm, inp.project, "ds1")
    kinds = [e["type"] for e in events]
    assert kinds.count("repair") == 1 and kinds.count("validation") == 2
    repair = next(e["payload"] for e in events if e["type"] == "repair")
    assert repair["files_changed"] == [HANDLER]
    row = design_store.decision_set(sm, inp.project, "ds1")
    assert row is not None and "Repair round 1" in row["summary_md"]
    # What the reader sees is the last validation: the repaired tree's, passing.
    assert design_store.failing_validators(sm, inp.project, "ds1") == []
    summaries = []
    async for e in handle.fetch_history_events():
        attrs = e.activity_task_scheduled_event_attributes
        if attrs.activity_type.name:
            summaries.append(attrs.activity_type.name)
    assert summaries.count("design.repair") == 1
    assert summaries.count("design.validate") == 2


async def test_with_repairs_disabled_the_broken_handler_ends_the_set_failed(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    inp = _input(repair_rounds=0)
    with ScriptedOpenAIServer([ScriptedReply(content=json.dumps({"files": BROKEN}))]) as llm:
        settings.models_config = write_models_config(tmp_path / "models.yaml", llm.base_url)
        async with build_worker(client, settings):
            handle = await start_design(client, inp, task_queue=settings.task_queue)
            result: DesignResult = await handle.result()
        assert len(llm.chat_requests) == 1  # no repair asked

    assert result.status == "validation_failed"
    assert result.repairs == []
    assert {"ruff", "pytest"} <= {n for n, s in result.validation.items() if s == "failed"}
    # Every finding, each naming the file: the handler's syntax error among them.
    assert {f.validator for f in result.findings if f.file == HANDLER} >= {"ruff"}, result.findings
    assert result.validation_digest is not None
    report = artifact_store_from_settings(settings).get_json(result.validation_digest)
    assert findings_of(report, BROKEN) == result.findings
    sm = get_sessionmaker(settings.resolved_database_url)
    row = design_store.decision_set(sm, inp.project, "ds1")
    assert row is not None and f"- ruff {HANDLER}:" in row["summary_md"]


async def test_when_the_rounds_run_out_the_set_ends_failed_with_every_finding(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """The model's "fix" is as broken as the handler was: one round (repair_rounds=1),
    the validators still fail, the run ends validation_failed naming the handler."""
    broken_again = {HANDLER: BROKEN[HANDLER] + "\n# still broken\n"}
    replies = [
        ScriptedReply(content=json.dumps({"files": BROKEN})),
        ScriptedReply(content=json.dumps({"files": broken_again})),
    ]
    inp = _input(repair_rounds=1)
    with ScriptedOpenAIServer(replies) as llm:
        settings.models_config = write_models_config(tmp_path / "models.yaml", llm.base_url)
        async with build_worker(client, settings):
            handle = await start_design(client, inp, task_queue=settings.task_queue)
            result: DesignResult = await handle.result()
        assert len(llm.chat_requests) == 2

    assert result.status == "validation_failed"
    (round1,) = result.repairs
    assert round1.files_changed == [HANDLER]
    assert "failed" in round1.validation.values()
    assert any(f.file == HANDLER for f in result.findings), result.findings
    sm = get_sessionmaker(settings.resolved_database_url)
    kinds = [e["type"] for e in design_store.list_events(sm, inp.project, "ds1")]
    assert kinds.count("repair") == 1 and kinds.count("validation-findings") == 1


async def test_ruff_fix_is_the_rule_for_ruffs_fixable_findings() -> None:
    """An unused import: ruff --fix removes it and reports nothing more there."""
    files = {"app/x.py": "import os\n\n\ndef f() -> int:\n    return 1\n"}
    fixed, remaining = await ruff_fix(files)
    assert "import os" not in fixed["app/x.py"]
    assert remaining == set()


def test_a_missing_package_init_is_the_rule_for_no_module_named() -> None:
    """pytest's "No module named 'app.handlers'" where app/handlers/ has code but no
    __init__.py: the rule adds the empty package files; another finding is left alone."""
    files = {"app/__init__.py": "", "app/handlers/score.py": "X = 1\n", "t.py": ""}
    found = [
        Finding(validator="pytest", message="ModuleNotFoundError: No module named 'app.handlers'"),
        Finding(validator="pytest", message="E   assert 1 == 2"),
    ]
    fixed, which = add_missing_packages(files, found)
    assert fixed == {**files, "app/handlers/__init__.py": ""}
    assert which == [0]


def test_findings_of_a_failed_pytest_name_the_missing_module() -> None:
    report = {
        "results": [
            {
                "name": "pytest",
                "status": "failed",
                "summary": "pytest: exit 2: 1 error in 0.05s",
                "details": {
                    "output": "ERROR collecting tests/test_h.py\n"
                    "E   ModuleNotFoundError: No module named 'app.handlers'\n"
                    "1 error in 0.05s"
                },
            },
            {"name": "ruff", "status": "passed", "summary": "clean", "details": {}},
        ]
    }
    files = {"tests/test_h.py": "", "app/handlers/score.py": ""}
    found = findings_of(report, files)
    assert [(f.validator, f.file) for f in found] == [
        ("pytest", "tests/test_h.py"),
        ("pytest", None),
    ]
    fixed, which = add_missing_packages(files, found)
    assert "app/handlers/__init__.py" in fixed and which == [1]
