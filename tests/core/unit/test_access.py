"""Who reads a run or gate over the API (keel/access.py)."""

from __future__ import annotations

import pytest
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from client.temporal import (
    READERS_KEY,
    BadPageToken,
    decode_page_token,
    encode_page_token,
    with_readers,
)
from keel.access import (
    ACCESS_MEMO,
    RunAccess,
    access_for,
    may_read,
    reader_terms,
    readers_of,
    user_reader,
)

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


def test_readers_admit_the_callers_may_read_admits() -> None:
    """``KeelReaders`` and a caller's query terms meet exactly where may_read says yes."""
    names = ["alice", "bob", "carol", "dave", 'o"hara\\x', "bob-smith", "BOB", "♡", "user:bob"]
    accesses = [
        access_for("alice", [["bob"], ["carol", "bob"]]),
        access_for("carol", [[]]),
        access_for('o"hara\\x'),
        access_for("bob-smith", [["user:bob"]]),
    ]
    for access in accesses:
        readers = set(readers_of(access))
        for name in names:
            for roles in (REQ, APP, REQ | APP):
                terms = reader_terms(name, roles)
                assert terms is not None
                assert bool(readers & set(terms)) == may_read(access, name, roles), (access, name)
    assert reader_terms("root", ADMIN) is None  # admin: no filter at all
    # Names a visibility query could not take as they are never reach one.
    for name in names:
        value = user_reader(name)
        assert value.isascii() and '"' not in value and "\\" not in value and " " not in value
    assert readers_of(access_for("alice", [["bob", "alice"]])) == ["user:alice", "user:bob"]


def test_page_tokens_round_trip_and_garbage_is_refused() -> None:
    token = b'{"StartTime":"2026-11-27T11:00:00Z","RunID":"r1"}'
    assert decode_page_token(encode_page_token(token)) == token
    assert encode_page_token(None) is None and decode_page_token(None) is None
    assert decode_page_token("") is None
    for bad in ["!!!", "AAAA", "bm90IGpzb24", "WzEsIDJd", "a"]:
        with pytest.raises(BadPageToken):
            decode_page_token(bad)


def test_readers_follow_the_access_memo_into_the_start() -> None:
    base = TypedSearchAttributes([SearchAttributePair(SearchAttributeKey.for_keyword("K"), "v")])
    assert with_readers(base, None) is base
    assert with_readers(None, {"other": 1}) is None
    got = with_readers(base, {ACCESS_MEMO: access_for("alice", [["bob"]])})
    assert got is not None
    assert got.get(SearchAttributeKey.for_keyword("K")) == "v"
    assert got.get(READERS_KEY) == ["user:alice", "user:bob"]
    # A memo given as JSON (a dict) counts the same.
    again = with_readers(None, {ACCESS_MEMO: access_for("carol").model_dump()})
    assert again is not None and again.get(READERS_KEY) == ["user:carol"]
