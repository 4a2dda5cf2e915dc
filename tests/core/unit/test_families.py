"""The families registry (keel/families.py, workers/families.py): each family once, the
names it repeats agree with its models, and the lists read from it."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowExecutionStatus

from cli import toolkit
from client import temporal
from keel import families
from keel.demo import DEMO_WORKFLOW_TYPE
from keel.design.steps import WORKFLOW_TYPE as DESIGN_TYPE
from keel.families import FamilySpec
from keel.gates import GATE_STATE_QUERY, GATE_WORKFLOW_TYPE
from keel.mrp.run import WORKFLOW_TYPE as MRP_TYPE
from keel.progress import RunProgress
from keel.rllm.run import WORKFLOW_TYPE as RLLM_TYPE
from keel.srl.steps import COLLECTION_TYPE, EPISODE_TYPE
from workers import families as worker_families
from workers.main import WORKFLOWS


def test_type_names_are_the_models_own() -> None:
    f = families.FAMILIES
    assert f["gate"].workflow_types == (GATE_WORKFLOW_TYPE,)
    assert f["gate"].progress_query == GATE_STATE_QUERY
    assert f["demo"].workflow_types == (DEMO_WORKFLOW_TYPE,)
    assert f["rllm"].workflow_types == (RLLM_TYPE,)
    assert f["mrp"].workflow_types == (MRP_TYPE,)
    assert f["srl"].workflow_types == (COLLECTION_TYPE,)
    assert f["srl"].children == (EPISODE_TYPE,)
    assert f["design"].workflow_types == (DESIGN_TYPE,)


def test_the_worker_registers_every_family_and_only_those() -> None:
    names = [w.name for w in worker_families.worker_families()]
    assert names == [f.name for f in families.families()]
    # Every top-level and child type of every family has a class on the worker.
    registered = {w.__temporal_workflow_definition.name for w in WORKFLOWS}  # type: ignore[attr-defined]
    declared = {t for f in families.families() for t in (*f.workflow_types, *f.children)}
    assert registered == declared


def test_runs_list_every_family_with_runs_design_included() -> None:
    assert [f.name for f in families.run_families()] == ["rllm", "mrp", "srl", "design"]
    assert set(families.reader_types()) == {
        GATE_WORKFLOW_TYPE,
        RLLM_TYPE,
        MRP_TYPE,
        COLLECTION_TYPE,
    }


def test_exit_codes_and_styles_come_from_the_registry() -> None:
    assert set(toolkit.EXIT_CODES) == {"keel", "gate", "rllm", "mrp", "srl", "design"}
    for name, table in families.exit_codes().items():
        assert toolkit.EXIT_CODES[name] == table
    assert toolkit.ERROR_STYLES["rllm"] == "payload"
    assert toolkit.ERROR_STYLES["keel"] == "envelope"


def test_a_type_is_one_familys_and_builtins_stay() -> None:
    with pytest.raises(ValueError, match="registered already"):
        families.register(FamilySpec("mrp", "x", ("Other",)))
    with pytest.raises(ValueError, match="family 'mrp'"):
        families.register(FamilySpec("other", "x", (MRP_TYPE,)))
    with pytest.raises(ValueError, match="built-in"):
        families.unregister("srl")
    with pytest.raises(ValueError, match=r"keel\.families first"):
        worker_families.register(worker_families.WorkerFamily("nowhere", ()))


def test_one_status_table_covers_every_temporal_status() -> None:
    assert set(temporal._STATUS) == set(WorkflowExecutionStatus)
    # A run that continued as new goes on under its id.
    assert temporal._STATUS[WorkflowExecutionStatus.CONTINUED_AS_NEW] == "running"


def test_progress_lines() -> None:
    assert RunProgress(phase="step attempt:2").line() == "step attempt:2"
    assert RunProgress(phase="map", done=3, total=8, unit="windows").line() == "map: 3/8 windows"
    assert RunProgress(phase="compile").line() == "compile"
    assert RunProgress(done=4, total=6, unit="tasks").line() == "4/6 tasks"
    # Before the first window read the tasks, the count is unknown.
    assert RunProgress(done=0, unit="tasks").line() == "0/? tasks"
    assert RunProgress().line() is None
