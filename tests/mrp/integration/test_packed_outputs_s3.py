"""Pack members on the S3 artifact store (a real SeaweedFS S3 server, loopback only):
each member is one ranged GET of its pack, checked against the member's own digest."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from store.artifacts import S3ArtifactStore
from tests.core.unit.test_artifact_members import MemberContract
from tests.support.seaweed import SeaweedS3, seaweed_s3

pytestmark = pytest.mark.s3


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with seaweed_s3(tmp_path_factory.mktemp("seaweed")) as server:
        yield server


class TestS3Members(MemberContract):
    @pytest.fixture
    def store(self, s3_server: SeaweedS3) -> S3ArtifactStore:
        return S3ArtifactStore(
            f"keel-test-{uuid.uuid4().hex[:16]}",
            endpoint_url=s3_server.endpoint_url,
            region=s3_server.region,
            access_key_id=s3_server.access_key_id,
            secret_access_key=s3_server.secret_access_key,
        )

    def corrupt(self, store: S3ArtifactStore, digest: str, data: bytes) -> None:
        store._client.put_object(Bucket=store.bucket, Key=store.key_for(digest), Body=data)
