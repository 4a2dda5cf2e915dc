"""Writing a produce step's files to its sink: ``s3://`` destinations.

The producer always writes its files (data and audit log) under the run's local output
root (``<data dir>/mrp/output/<job_id>/<run_id>/``); for an ``s3://bucket/prefix/...``
destination the produce activity then uploads each file to ``prefix + <relative path>``
through the artifact store's S3 client (:func:`store.artifacts.s3_client_for_bucket`:
``KEEL_S3_ENDPOINT_URL``, region and credentials as the store takes them).

Idempotent: each object carries its BLAKE3 digest in its metadata (``keel-digest``); a file
whose object is already there with that digest and size is not written again (a retried
produce, or a run that produced the same bytes). Any other object at that key is replaced
(S3 replaces an object atomically, so a reader sees the old or the new file, never a
mix); each file is streamed from disk, in one PUT up to 64 MiB and as a multipart upload
above that, so an output of any size fits (one PUT stops at 5 GB). Data files go first and
the audit log last, so an audit log in the bucket means the files it names are there.

Nothing waits for the produce step to find a sink it cannot write: destinations the
runtime cannot write are refused by policy (rule MRP-P016), and the compile activity
checks an ``s3://`` sink with the job's credentials before any shard runs
(:func:`check_sink`: the bucket exists, and an object can be written under the
destination and deleted again). The upload checks the bucket again, for a bucket
removed while the job ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import blake3

from keel.digest import DIGEST_PREFIX
from keel.mrp.dsl import S3Location, parse_s3_destination
from keel.mrp.run import ProducedFileRecord
from keel.settings import Settings
from store.artifacts import S3ArtifactStore, s3_client_for_bucket

__all__ = ["DIGEST_METADATA", "SinkWriteError", "check_sink", "upload_to_s3"]

DIGEST_METADATA = "keel-digest"
RUN_METADATA = "keel-run-id"
AUDIT_SUFFIX = ".audit.jsonl"
#: The object :func:`check_sink` writes and deletes under a destination, per run.
PROBE_NAME = ".keel-write-check-{run_id}"
_READ_CHUNK = 1 << 20
# Client errors a retry cannot fix: the bucket or the right to write is missing.
_PERMANENT = frozenset(
    {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403"}
)


class SinkWriteError(Exception):
    """A sink file could not be written; ``retryable`` says whether a retry could help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        self.retryable = retryable
        super().__init__(message)


def _content_type(path: str) -> str:
    if path.endswith(".json"):
        return "application/json"
    if path.endswith(".jsonl"):
        return "application/x-ndjson"
    if path.endswith(".parquet"):
        return "application/vnd.apache.parquet"
    return "application/octet-stream"


def _file_digest(path: Path) -> str:
    hasher = blake3.blake3()
    with path.open("rb") as f:
        while block := f.read(_READ_CHUNK):
            hasher.update(block)
    return DIGEST_PREFIX + hasher.hexdigest()


@contextlib.contextmanager
def _write_errors(target: str) -> Iterator[None]:
    """What a failed request to the sink means, as :class:`SinkWriteError` naming
    ``target``: retryable unless S3 says the bucket or the right to write is missing
    (:data:`_PERMANENT`)."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except ClientError as e:
        code = str(e.response.get("Error", {}).get("Code", ""))
        raise SinkWriteError(
            f"cannot write {target}: {code or e}", retryable=code not in _PERMANENT
        ) from None
    except S3UploadFailedError as e:
        # upload_file wraps the client's error in its message: "... (NoSuchBucket) ..."
        permanent = any(f"({code})" in str(e) for code in _PERMANENT)
        raise SinkWriteError(f"cannot write {target}: {e}", retryable=not permanent) from None
    except BotoCoreError as e:
        raise SinkWriteError(f"cannot write {target}: {e}", retryable=True) from None


def _open_bucket(settings: Settings, location: S3Location) -> S3ArtifactStore:
    """The sink's bucket, checked to exist (a sink never creates one)."""
    client = s3_client_for_bucket(settings, location.bucket)
    # Some S3 servers make a bucket on the first PUT; a sink never does.
    with _write_errors(f"to bucket {location.bucket!r}"):
        exists = client.bucket_exists()
    if not exists:
        raise SinkWriteError(
            f"cannot write {location.uri_for('')}: NoSuchBucket (bucket "
            f"{location.bucket!r} does not exist; sinks never create buckets)",
            retryable=False,
        )
    return client


def check_sink(settings: Settings, destination: str, run_id: str) -> None:
    """Whether the job's credentials can write ``destination``, before any shard runs:
    the bucket exists, and an empty object (:data:`PROBE_NAME`) can be written under
    the destination's prefix and deleted again. Raises :class:`SinkWriteError`."""
    location: S3Location = parse_s3_destination(destination)
    client = _open_bucket(settings, location)
    key = location.key_for(PROBE_NAME.format(run_id=run_id))
    uri = location.uri_for(PROBE_NAME.format(run_id=run_id))
    with _write_errors(uri):
        client.put_object_at(key, b"", metadata={RUN_METADATA: run_id})
        client.delete_named(key)


def upload_to_s3(
    settings: Settings,
    destination: str,
    out_dir: Path,
    files: Sequence[ProducedFileRecord],
    run_id: str,
) -> list[ProducedFileRecord]:
    """Upload ``files`` (relative to ``out_dir``) under ``destination``; return the records
    with each file's ``uri``. Raises :class:`SinkWriteError`."""
    location: S3Location = parse_s3_destination(destination)
    client = _open_bucket(settings, location)
    ordered = sorted(files, key=lambda f: (f.path.endswith(AUDIT_SUFFIX), f.path))
    done: dict[str, ProducedFileRecord] = {}
    for f in ordered:
        key = location.key_for(f.path)
        uri = location.uri_for(f.path)
        local = out_dir / f.path
        if _file_digest(local) != f.digest:  # pragma: no cover - produce just checked it
            raise SinkWriteError(f"{f.path} changed on disk before its upload", retryable=True)
        with _write_errors(uri):
            head = client.head_named(key)
            there = head is not None and (
                head["metadata"].get(DIGEST_METADATA) == f.digest and head["size"] == f.size
            )
            if not there:
                client.upload_file_at(
                    key,
                    local,
                    content_type=_content_type(f.path),
                    metadata={DIGEST_METADATA: f.digest, RUN_METADATA: run_id},
                )
                check = client.head_named(key)
                if check is None or check["size"] != f.size:
                    raise SinkWriteError(
                        f"{uri}: the object is not there after writing it", retryable=True
                    )
        done[f.path] = f.model_copy(update={"uri": uri})
    return [done[f.path] for f in files]
