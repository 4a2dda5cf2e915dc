"""store/design.py on SQLite (and PostgreSQL when configured): a persist lands once per
key, a new run bumps the version, a stale writer loses, and the next iteration reads
back what was written."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy.orm import Session, sessionmaker

from keel.design.constraints import parse_constraints
from keel.design.critics import estimate_cost
from keel.design.steps import AgentRun, ApprovalRecord, DesignEvent, PersistInput
from store import design as design_store
from tests.design.unit.design_data import golden_cases, prices


def persist_input(key: str, **kw: object) -> PersistInput:
    fields: dict[str, object] = {
        "key": key,
        "project": "acme",
        "owner": "alice",
        "decision_set": "ds1",
        "status": "completed",
        "constraints": parse_constraints(golden_cases()["batch_training"]["constraints"]),
        "plan": {"choices": [{"capability": "serve", "pattern_id": "serve:x"}]},
        "summary_md": "# ds1",
        "cost": estimate_cost([], prices()),
        "file_digests": {"README.md": "blake3:" + "a" * 64},
        "agent_runs": [AgentRun(key=f"{key}/planner", agent="planner")],
        "approvals": [ApprovalRecord(gate="plan-r1", actor="bob", status="approved")],
        "events": [
            DesignEvent(key="0000-coverage-update", type="coverage-update", payload={"score": 1.0}),
            DesignEvent(key="0001-plan-ready", type="plan-ready"),
        ],
    }
    fields.update(kw)
    return PersistInput.model_validate(fields)


def test_persist_is_idempotent_by_key(sm: sessionmaker[Session]) -> None:
    inp = persist_input("k1")
    assert design_store.persist(sm, inp, archive_digest="blake3:" + "b" * 64) == (1, 3)
    # A retried activity: same key, nothing written twice.
    assert design_store.persist(sm, inp, archive_digest="blake3:" + "b" * 64) == (1, 0)
    counts = design_store.count_rows(sm, "acme", "ds1")
    assert counts == {
        "artifacts": 2,
        "agent_runs": 1,
        "approvals": 1,
        "cost_estimates": 1,
        "events": 3,
    }
    events = design_store.list_events(sm, "acme", "ds1")
    assert [e["type"] for e in events] == ["coverage-update", "plan-ready", "run-complete"]
    assert [e["seq"] for e in events] == [0, 1, 2]
    assert events[-1]["payload"]["version"] == 1
    # The retried activity reads back the run-complete event the first write made.
    again = design_store.stored_event(sm, "acme", "ds1", "0002-run-complete")
    assert again is not None and again.payload == events[-1]["payload"]


def test_new_run_bumps_version_and_stale_writer_loses(sm: sessionmaker[Session]) -> None:
    design_store.persist(sm, persist_input("k1"), archive_digest=None)
    version, _ = design_store.persist(
        sm, persist_input("k2", status="rejected"), archive_digest=None
    )
    assert version == 2
    row = design_store.decision_set(sm, "acme", "ds1")
    assert row is not None and row["version"] == 2 and row["status"] == "rejected"
    # A writer that read version 1 before k2 landed: refused, the row unchanged.
    with pytest.raises(design_store.VersionConflict), sm.begin() as s:
        design_store.bump_version(
            s, "acme", "ds1", 1, {"status": "completed", "updated_at": datetime.now(UTC)}
        )
    row = design_store.decision_set(sm, "acme", "ds1")
    assert row is not None and row["version"] == 2 and row["status"] == "rejected"


def test_load_previous_round_trip(sm: sessionmaker[Session]) -> None:
    assert design_store.load_previous(sm, "acme", "ds1") is None
    inp = persist_input("k1")
    design_store.persist(sm, inp, archive_digest="blake3:" + "c" * 64)
    prev = design_store.load_previous(sm, "acme", "ds1")
    assert prev is not None
    assert prev.constraints == inp.constraints
    assert prev.plan == inp.plan
    assert prev.cost == inp.cost
    # Files only: the archive is not part of the repository the diff compares.
    assert prev.file_digests == inp.file_digests


def test_projects_belong_to_their_owner(sm: sessionmaker[Session]) -> None:
    assert design_store.create_project(sm, "p1", owner="alice", name="Pipelines")
    assert not design_store.create_project(sm, "p1", owner="alice")
    with pytest.raises(design_store.NotYours):
        design_store.create_project(sm, "p1", owner="bob")
    assert [p["id"] for p in design_store.projects_of(sm, "alice")] == ["p1"]
    assert design_store.projects_of(sm, "bob") == []
    row = design_store.project_row(sm, "p1")
    assert row is not None and row["name"] == "Pipelines" and row["owner_id"] == "alice"


def test_submitted_decision_set_is_version_0_until_persist(sm: sessionmaker[Session]) -> None:
    design_store.create_project(sm, "acme", owner="alice")
    design_store.submit_decision_set(sm, "acme", "ds1")
    with pytest.raises(design_store.DecisionSetExists):
        design_store.submit_decision_set(sm, "acme", "ds1")
    assert design_store.projects_with(sm, "ds1") == ["acme"]
    [row] = design_store.decision_sets_of(sm, "acme")
    assert (row["version"], row["status"]) == (0, design_store.SUBMITTED)
    # Nothing to iterate from yet; the pipeline's persist makes it version 1.
    assert design_store.load_previous(sm, "acme", "ds1") is None
    version, _ = design_store.persist(sm, persist_input("k1"), archive_digest=None)
    assert version == 1
    assert design_store.load_previous(sm, "acme", "ds1") is not None
