"""The artifact store contract, and the local directory store.

``ArtifactStoreContract`` holds the tests every ``ArtifactStore`` must pass. Each backend
subclasses it with a ``store`` fixture and two hooks (``corrupt``, ``stored_count``):
here the local store, in ``tests/core/integration/test_artifacts_s3.py`` the S3 store against
a real SeaweedFS server.
"""

from __future__ import annotations

import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from keel.digest import canonical_json, digest_bytes, digest_json
from keel.settings import Settings
from store.artifacts import (
    ArtifactCorrupted,
    ArtifactNotFound,
    ArtifactStore,
    InvalidDigest,
    LocalArtifactStore,
    S3ArtifactStore,
    artifact_store_from_settings,
)

BAD_DIGESTS = [
    "",
    "blake3:",
    "blake3:" + "0" * 63,
    "blake3:" + "0" * 65,
    "blake3:" + "A" * 64,  # digests are lowercase hex
    "sha256:" + "0" * 64,
    "blake3:../../../../etc/passwd" + "0" * 36,
    "blake3:" + "0" * 62 + "/x",
    "../" + "0" * 64,
    "0" * 64,  # the prefix is part of the name
]

MISSING = digest_bytes(b"never stored")


class ArtifactStoreContract:
    """Behaviour shared by every artifact store backend."""

    def corrupt(self, store: Any, digest: str, data: bytes) -> None:
        """Replace the stored bytes of ``digest`` with ``data``, behind the store's back."""
        raise NotImplementedError

    def stored_count(self, store: Any) -> int:
        """How many objects the backend holds (temporary files included)."""
        raise NotImplementedError

    def test_bytes_round_trip(self, store: ArtifactStore) -> None:
        data = b"\x00\x01 shard output \xff" * 100
        digest = store.put_bytes(data)
        assert digest == digest_bytes(data)
        assert store.exists(digest)
        assert store.get_bytes(digest) == data

    def test_empty_and_large_blobs(self, store: ArtifactStore) -> None:
        large = os.urandom(3 * 1024 * 1024)
        for data in (b"", large):
            assert store.get_bytes(store.put_bytes(data)) == data

    def test_json_round_trip_is_canonical(self, store: ArtifactStore) -> None:
        value = {"b": [1, 2.5, None, True], "a": {"é": "ü"}}
        digest = store.put_json(value)
        assert (
            digest
            == digest_json(value)
            == digest_json({"a": {"é": "ü"}, "b": [1, 2.5, None, True]})
        )
        assert store.get_json(digest) == value
        assert store.get_bytes(digest) == canonical_json(value)

    def test_put_is_deduplicated(self, store: ArtifactStore) -> None:
        before = self.stored_count(store)
        first = store.put_bytes(b"same content")
        second = store.put_bytes(b"same content")
        assert first == second
        assert self.stored_count(store) == before + 1
        assert store.put_json({"x": 1}) == store.put_bytes(b'{"x":1}')
        assert self.stored_count(store) == before + 2

    def test_missing_artifact(self, store: ArtifactStore) -> None:
        assert not store.exists(MISSING)
        with pytest.raises(ArtifactNotFound, match="not found") as info:
            store.get_bytes(MISSING)
        assert info.value.digest == MISSING
        with pytest.raises(ArtifactNotFound):
            store.get_json(MISSING)

    def test_corruption_detected_on_read(self, store: ArtifactStore) -> None:
        digest = store.put_json({"weights": [1, 2, 3]})
        self.corrupt(store, digest, b'{"weights":[1,2,4]}')
        with pytest.raises(ArtifactCorrupted, match="corrupted") as info:
            store.get_bytes(digest)
        assert info.value.actual == digest_bytes(b'{"weights":[1,2,4]}')
        with pytest.raises(ArtifactCorrupted):
            store.get_json(digest)

    @pytest.mark.parametrize("bad", BAD_DIGESTS)
    def test_bad_digest_refused(self, store: ArtifactStore, bad: str) -> None:
        with pytest.raises(InvalidDigest):
            store.get_bytes(bad)
        with pytest.raises(InvalidDigest):
            store.exists(bad)
        with pytest.raises(ValueError):  # InvalidDigest is also a ValueError
            store.get_json(bad)

    def test_concurrent_puts_of_one_blob(self, store: ArtifactStore) -> None:
        data = os.urandom(256 * 1024)
        with ThreadPoolExecutor(4) as pool:
            digests = set(pool.map(lambda _: store.put_bytes(data), range(8)))
        assert digests == {digest_bytes(data)}
        assert store.get_bytes(digest_bytes(data)) == data

    def test_put_many_stores_each_in_order(self, store: ArtifactStore) -> None:
        known = store.put_bytes(b"already here")
        blobs = [f"blob {i}".encode() for i in range(40)] + [b"blob 3", b"already here", b""]
        digests = store.put_many(blobs)
        assert digests == [digest_bytes(b) for b in blobs]
        assert digests[-2] == known
        assert [store.get_bytes(d) for d in digests] == blobs
        assert self.stored_count(store) == 42  # 40 new, the known one, the empty one
        assert store.put_many([]) == []


class TestLocalArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalArtifactStore:
        return LocalArtifactStore(tmp_path / "artifacts")

    def corrupt(self, store: LocalArtifactStore, digest: str, data: bytes) -> None:
        path = store.path_for(digest)
        path.chmod(0o644)
        path.write_bytes(data)

    def stored_count(self, store: LocalArtifactStore) -> int:
        if not store.root.exists():
            return 0
        return sum(1 for p in store.root.rglob("*") if p.is_file())

    def test_sharded_read_only_layout(self, store: LocalArtifactStore) -> None:
        digest = store.put_bytes(b"layout")
        hexpart = digest.removeprefix("blake3:")
        path = store.root / hexpart[:2] / hexpart[2:4] / hexpart
        assert store.path_for(digest) == path
        assert path.read_bytes() == b"layout"
        # Artifacts are immutable: no write bit for anyone.
        assert stat.S_IMODE(path.stat().st_mode) == 0o444
        assert [p.name for p in path.parent.iterdir()] == [hexpart]  # no temp file left

    def test_existing_content_is_not_rewritten(self, store: LocalArtifactStore) -> None:
        digest = store.put_bytes(b"keep me")
        path = store.path_for(digest)
        before = path.stat()
        store.put_bytes(b"keep me")
        after = path.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    def test_truncated_file_is_repaired_by_put(self, store: LocalArtifactStore) -> None:
        digest = store.put_bytes(b"complete content")
        self.corrupt(store, digest, b"compl")
        with pytest.raises(ArtifactCorrupted):
            store.get_bytes(digest)
        assert store.put_bytes(b"complete content") == digest
        assert store.get_bytes(digest) == b"complete content"

    @pytest.mark.parametrize("syncfs", [True, False], ids=["syncfs", "fsync-each"])
    def test_put_many_leaves_read_only_blobs_and_no_temp_file(
        self, store: LocalArtifactStore, syncfs: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import store.artifacts as artifacts

        assert artifacts._SYNCFS is not None, "Linux's libc has syncfs"
        if not syncfs:
            monkeypatch.setattr(artifacts, "_SYNCFS", None)
        truncated = store.put_bytes(b"complete content")
        self.corrupt(store, truncated, b"compl")
        blobs = [os.urandom(100) for _ in range(300)] + [b"complete content"]
        digests = store.put_many(blobs)
        assert store.get_bytes(truncated) == b"complete content"  # repaired, as put_bytes does
        files = [p for p in store.root.rglob("*") if p.is_file()]
        assert sorted(p.name for p in files) == sorted({d.removeprefix("blake3:") for d in digests})
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o444 for p in files)

    def test_put_many_that_fails_leaves_nothing_half_written(
        self, store: LocalArtifactStore, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import store.artifacts as artifacts

        def no_space(fd: int) -> int:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(artifacts, "_SYNCFS", no_space)
        blobs = [f"never seen {i}".encode() for i in range(20)]
        with pytest.raises(OSError, match="No space"):
            store.put_many(blobs)
        # The sync before the renames failed: no blob at its name, no temp file left.
        assert not any(store.exists(digest_bytes(b)) for b in blobs)
        assert self.stored_count(store) == 0

    def test_path_for_refuses_bad_digest(self, store: LocalArtifactStore) -> None:
        with pytest.raises(InvalidDigest):
            store.path_for("blake3:../../x")


def test_store_from_settings_local(tmp_path: Path) -> None:
    store = artifact_store_from_settings(Settings(data_dir=tmp_path, artifact_backend="local"))
    assert isinstance(store, LocalArtifactStore)
    assert store.root == tmp_path / "artifacts"
    digest = store.put_json([1, 2])
    assert (tmp_path / "artifacts").is_dir()
    assert store.get_json(digest) == [1, 2]


def test_store_from_settings_s3_builds_without_connecting() -> None:
    store = artifact_store_from_settings(
        Settings(
            artifact_backend="s3",
            s3_bucket="team-artifacts",
            s3_endpoint_url="http://127.0.0.1:1",
            s3_region="eu-west-1",
            s3_access_key_id="AKIDEXAMPLE",
            s3_secret_access_key="not-a-real-secret",
        )
    )
    assert isinstance(store, S3ArtifactStore)
    assert (store.bucket, store.endpoint_url, store.region) == (
        "team-artifacts",
        "http://127.0.0.1:1",
        "eu-west-1",
    )
    assert store.key_for(MISSING) == "blake3/" + MISSING.removeprefix("blake3:")


async def test_grouped_puts_write_concurrent_puts_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Puts from many coroutines go in few ``put_many`` groups; each answers its own digest
    once its blob is stored; a failed group fails its puts, and the next group is written."""
    import asyncio

    from store.artifacts import GroupedPuts

    store = LocalArtifactStore(tmp_path / "artifacts")
    groups: list[int] = []
    real = store.put_many

    def counting(blobs: list[bytes]) -> list[str]:
        groups.append(len(blobs))
        if any(b == b"fail me" for b in blobs):
            raise OSError(28, "No space left on device")
        return real(blobs)

    monkeypatch.setattr(store, "put_many", counting)
    puts = GroupedPuts(store)
    blobs = [f"step {i}".encode() for i in range(200)]
    digests = await asyncio.gather(*(puts.put_bytes(b) for b in blobs))
    assert digests == [digest_bytes(b) for b in blobs]
    assert all(store.get_bytes(d) == b for d, b in zip(digests, blobs, strict=True))
    assert sum(groups) == 200 and len(groups) <= 3, groups  # the first alone, then the rest

    groups.clear()
    results = await asyncio.gather(
        puts.put_bytes(b"first"),
        puts.put_bytes(b"fail me"),
        puts.put_json({"after": 1}),
        return_exceptions=True,
    )
    # The three queued together, so they went as one group, and fail with it.
    assert groups == [3] and all(isinstance(r, OSError) for r in results), results
    assert await puts.put_json({"later": True}) == digest_json({"later": True})
