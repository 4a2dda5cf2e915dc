"""Who reads a run or gate over the API (keel/access.py)."""

from __future__ import annotations

from keel.access import RunAccess, access_for, may_read

REQ = frozenset({"requester"})
APP = frozenset({"approver"})
ADMIN = frozenset({"admin"})


def test_owner_named_approvers_and_admin_read() -> None:
    access = access_for("alice", [["bob"], ["carol", "bob"]])
    assert access == RunAccess(owner="alice", approvers=["bob", "carol"], any_approver=False)
    assert may_read(access, "alice", REQ)
    assert may_read(access, "bob", APP) and may_read(access, "carol", APP)
    assert may_read(access, "root", ADMIN)
    assert not may_read(access, "dave", APP)
    assert not may_read(access, "erin", REQ)


def test_a_gate_naming_no_approvers_is_read_by_any_approver() -> None:
    access = access_for("alice", [[]])
    assert access.any_approver
    assert may_read(access, "dave", APP)
    assert not may_read(access, "erin", REQ)


def test_a_run_without_an_owner_is_read_by_admin_only() -> None:
    assert may_read(None, "root", ADMIN)
    assert not may_read(None, "alice", REQ | APP)
