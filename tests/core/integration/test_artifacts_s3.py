"""The artifact store contract against ``S3ArtifactStore`` on a real SeaweedFS S3 server.

One server per module (started from ``.venv/bin/weed``, loopback only, stopped by PID);
a fresh bucket per test, which the store creates itself on first write.
"""

from __future__ import annotations

import ipaddress
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from keel.digest import digest_bytes
from keel.settings import Settings
from store.artifacts import ArtifactNotFound, S3ArtifactStore, artifact_store_from_settings
from tests.core.unit.test_artifacts import ArtifactStoreContract
from tests.support.seaweed import SeaweedS3, seaweed_s3

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


def make_store(server: SeaweedS3, bucket: str, **kw: Any) -> S3ArtifactStore:
    fields: dict[str, Any] = {
        "endpoint_url": server.endpoint_url,
        "region": server.region,
        "access_key_id": server.access_key_id,
        "secret_access_key": server.secret_access_key,
    }
    fields.update(kw)
    return S3ArtifactStore(bucket, **fields)


def new_bucket() -> str:
    return f"keel-test-{uuid.uuid4().hex[:16]}"


class TestS3ArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def store(self, s3_server: SeaweedS3) -> S3ArtifactStore:
        return make_store(s3_server, new_bucket())

    def corrupt(self, store: S3ArtifactStore, digest: str, data: bytes) -> None:
        store._client.put_object(Bucket=store.bucket, Key=store.key_for(digest), Body=data)

    def stored_count(self, store: S3ArtifactStore) -> int:
        try:
            listing = store._client.list_objects_v2(Bucket=store.bucket)
        except ClientError as e:
            if e.response["Error"]["Code"] == "NoSuchBucket":
                return 0
            raise
        return int(listing.get("KeyCount", 0))

    def test_object_layout_and_bucket_creation(
        self, store: S3ArtifactStore, s3_server: SeaweedS3
    ) -> None:
        client: Any = s3_server.client()
        assert store.bucket not in {b["Name"] for b in client.list_buckets()["Buckets"]}
        digest = store.put_bytes(b"layout")
        assert store.bucket in {b["Name"] for b in client.list_buckets()["Buckets"]}
        hexpart = digest.removeprefix("blake3:")
        obj = client.get_object(Bucket=store.bucket, Key=f"blake3/{hexpart}")
        assert obj["Body"].read() == b"layout"

    def test_existing_object_is_not_uploaded_again(self, store: S3ArtifactStore) -> None:
        digest = store.put_bytes(b"once")
        key = store.key_for(digest)
        first = store._client.head_object(Bucket=store.bucket, Key=key)
        store.put_bytes(b"once")
        again = store._client.head_object(Bucket=store.bucket, Key=key)
        assert again["LastModified"] == first["LastModified"]
        assert again["ETag"] == first["ETag"]

    def test_two_stores_share_a_bucket(self, s3_server: SeaweedS3) -> None:
        bucket = new_bucket()
        writer, reader = make_store(s3_server, bucket), make_store(s3_server, bucket)
        digest = writer.put_json({"shard": 7})
        assert reader.exists(digest)
        assert reader.get_json(digest) == {"shard": 7}

    def test_missing_bucket_reads_as_not_found(self, s3_server: SeaweedS3) -> None:
        store = make_store(s3_server, new_bucket())
        assert not store.exists(digest_bytes(b"x"))
        with pytest.raises(ArtifactNotFound):
            store.get_bytes(digest_bytes(b"x"))

    def test_wrong_credentials_are_an_error_not_a_miss(self, s3_server: SeaweedS3) -> None:
        good = make_store(s3_server, new_bucket())
        digest = good.put_bytes(b"private")
        bad = make_store(
            s3_server,
            good.bucket,
            access_key_id="nobody",
            secret_access_key="wrong",
            max_attempts=1,
        )
        with pytest.raises(ClientError) as info:
            bad.get_bytes(digest)
        assert info.value.response["Error"]["Code"] in ("InvalidAccessKeyId", "AccessDenied")


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd) if fd.is_symlink() else ""
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != "0A" or inode not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = local.split(":")
            assert len(hexaddr) == width
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order.
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(words)), int(hexport, 16)))
    return found


def test_server_listens_on_loopback_only(s3_server: SeaweedS3) -> None:
    addresses = listening_addresses(s3_server.pid)
    port = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    assert ("127.0.0.1", port) in addresses
    assert {addr for addr, _ in addresses} == {"127.0.0.1"}


def test_store_from_settings_against_server(s3_server: SeaweedS3, tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        artifact_backend="s3",
        s3_endpoint_url=s3_server.endpoint_url,
        s3_bucket=new_bucket(),
        s3_region=s3_server.region,
        s3_access_key_id=s3_server.access_key_id,
        s3_secret_access_key=s3_server.secret_access_key,
    )
    store = artifact_store_from_settings(settings)
    assert isinstance(store, S3ArtifactStore)
    digest = store.put_json({"from": "settings"})
    assert store.get_json(digest) == {"from": "settings"}
    assert not (tmp_path / "artifacts").exists()
