"""Pack members (issue 40 §2): many small outputs stored as one object, each read back
alone with one range read and checked against its own digest.

``MemberContract`` holds what every store must do; the local store runs it here, the S3
store on a real S3 server in ``tests/mrp/integration/test_packed_outputs_s3.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from keel.digest import canonical_json, digest_bytes, pack_members
from store.artifacts import (
    ArtifactCorrupted,
    ArtifactNotFound,
    ArtifactStore,
    LocalArtifactStore,
    PackRef,
)

MEMBERS = [canonical_json({"shard": i, "words": "x" * i}) for i in range(5)]


def test_pack_members_joins_distinct_members_and_places_each() -> None:
    members = [MEMBERS[0], MEMBERS[1], MEMBERS[0], MEMBERS[2]]
    pack, spans = pack_members(members)
    assert pack == b"\n".join([MEMBERS[0], MEMBERS[1], MEMBERS[2]])
    # A repeated member is stored once: both places point at it.
    assert spans[0] == spans[2]
    for data, (offset, length) in zip(members, spans, strict=True):
        assert pack[offset : offset + length] == data
    one, places = pack_members([MEMBERS[3], MEMBERS[3]])
    assert one == MEMBERS[3] and places == [(0, len(MEMBERS[3]))] * 2


class MemberContract:
    def corrupt(self, store: Any, digest: str, data: bytes) -> None:
        raise NotImplementedError

    def test_each_member_reads_back_verified(self, store: ArtifactStore) -> None:
        pack, spans = pack_members(MEMBERS)
        pack_digest = store.put_bytes(pack)
        for data, (offset, length) in zip(MEMBERS, spans, strict=True):
            ref = PackRef(pack_digest, offset, length)
            assert store.get_member(ref, digest_bytes(data)) == data
        assert store.get_range(pack_digest, 0, len(pack)) == pack
        assert store.get_range(pack_digest, spans[1][0], 0) == b""

    def test_a_slice_that_is_not_the_member_is_an_error(self, store: ArtifactStore) -> None:
        pack, spans = pack_members(MEMBERS)
        pack_digest = store.put_bytes(pack)
        offset, length = spans[2]
        # The right place, another member's digest; a place off by one byte.
        with pytest.raises(ArtifactCorrupted):
            store.get_member(PackRef(pack_digest, offset, length), digest_bytes(MEMBERS[1]))
        with pytest.raises(ArtifactCorrupted):
            store.get_member(PackRef(pack_digest, offset + 1, length), digest_bytes(MEMBERS[2]))

    def test_a_pack_changed_behind_the_store_fails_the_read(self, store: ArtifactStore) -> None:
        pack, spans = pack_members(MEMBERS)
        pack_digest = store.put_bytes(pack)
        self.corrupt(store, pack_digest, pack.replace(b'"shard":3', b'"shard":9'))
        offset, length = spans[3]
        with pytest.raises(ArtifactCorrupted):
            store.get_member(PackRef(pack_digest, offset, length), digest_bytes(MEMBERS[3]))
        # The other members are intact and still read.
        offset, length = spans[1]
        assert store.get_member(PackRef(pack_digest, offset, length), digest_bytes(MEMBERS[1]))

    def test_a_missing_pack_is_not_found(self, store: ArtifactStore) -> None:
        missing = digest_bytes(b"never stored pack")
        with pytest.raises(ArtifactNotFound):
            store.get_member(PackRef(missing, 0, 4), digest_bytes(b"abcd"))


class TestLocalMembers(MemberContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalArtifactStore:
        return LocalArtifactStore(tmp_path / "artifacts")

    def corrupt(self, store: LocalArtifactStore, digest: str, data: bytes) -> None:
        path = store.path_for(digest)
        path.chmod(0o644)
        path.write_bytes(data)
