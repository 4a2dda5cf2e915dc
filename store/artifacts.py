"""Content-addressed artifact store: local directory (default) or S3.

An artifact's name is its digest, ``blake3:<64 hex>`` (``keel.digest``), so a put of
content that is already stored is a no-op, a retried activity cannot write two
versions, and a read proves its content by hashing it again. Digests are validated
before they touch a path or an object key.

Layout:
- local: ``<root>/<hex[:2]>/<hex[2:4]>/<hex>``
- S3:    ``s3://<bucket>/blake3/<hex>``
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import io
import json
import logging
import os
import tempfile
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple, TypedDict, Unpack

import blake3

from keel.digest import DIGEST_PREFIX, canonical_json, digest_bytes, is_digest
from keel.settings import Settings

if TYPE_CHECKING:
    from botocore.exceptions import ClientError

log = logging.getLogger(__name__)


def _find_syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs(2)`` (Linux), or None. Looked up among the symbols this process
    already has (``CDLL(None)``): ``ctypes.util.find_library`` runs ``ldconfig``, about
    18 ms on every import of this module."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn  # type: ignore[no-any-return]


_SYNCFS = _find_syncfs()


#: Files up to this size go up in one PUT, larger ones in parts of (at least) this size.
MULTIPART_PART_BYTES = 64 * 1024 * 1024


class ArtifactError(Exception):
    """Base class of artifact store errors."""


class InvalidDigest(ArtifactError, ValueError):
    """The string given as a digest is not ``blake3:<64 lowercase hex>``."""


class ArtifactNotFound(ArtifactError, LookupError):
    """No artifact is stored under this digest."""

    def __init__(self, digest: str, where: str) -> None:
        super().__init__(f"artifact {digest} not found in {where}")
        self.digest = digest


class ArtifactCorrupted(ArtifactError):
    """The stored bytes do not hash to the digest they are stored under."""

    def __init__(self, digest: str, actual: str, where: str) -> None:
        super().__init__(
            f"artifact {digest} in {where} is corrupted: its content hashes to {actual}"
        )
        self.digest = digest
        self.actual = actual


def _file_digest(path: Path) -> str:
    """``digest_bytes`` of a file's content, read in blocks."""
    hasher = blake3.blake3()
    with Path(path).open("rb") as f:
        while block := f.read(1 << 20):
            hasher.update(block)
    return DIGEST_PREFIX + hasher.hexdigest()


class PackRef(NamedTuple):
    """Where one member's bytes lie inside a stored pack: the pack's digest, the member's
    byte offset in it and its length (``ArtifactStore.get_member``)."""

    pack: str
    offset: int
    length: int


class BlobReader(io.RawIOBase):
    """A read-only, seekable view of one stored artifact (``ArtifactStore.open_blob``).

    ``bytes_read`` counts the bytes it has handed out (for S3, the bytes its ranged GETs
    fetched), so a caller can see how much of the artifact a read touched."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.bytes_read = 0
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._pos + offset
        elif whence == io.SEEK_END:
            pos = self.size + offset
        else:
            raise ValueError(f"invalid whence {whence}")
        if pos < 0:
            raise ValueError(f"negative seek position {pos}")
        self._pos = pos
        return pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = min(len(view), self.size - self._pos)
        if n <= 0:
            return 0
        data = self._read_at(self._pos, n)
        view[: len(data)] = data
        self._pos += len(data)
        self.bytes_read += len(data)
        return len(data)

    def _read_at(self, offset: int, n: int) -> bytes:
        raise NotImplementedError


class _BytesBlob(BlobReader):
    def __init__(self, data: bytes) -> None:
        super().__init__(len(data))
        self._data = data

    def _read_at(self, offset: int, n: int) -> bytes:
        return self._data[offset : offset + n]


class _FileBlob(BlobReader):
    def __init__(self, path: Path) -> None:
        self._file = path.open("rb", buffering=0)
        super().__init__(os.fstat(self._file.fileno()).st_size)

    def _read_at(self, offset: int, n: int) -> bytes:
        return os.pread(self._file.fileno(), n, offset)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()


class _S3RangeBlob(BlobReader):
    """Each read is one ``GET`` with a ``Range`` header."""

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        super().__init__(size)
        self._client = client
        self._bucket = bucket
        self._key = key
        self.requests = 0

    def _read_at(self, offset: int, n: int) -> bytes:
        response = self._client.get_object(
            Bucket=self._bucket, Key=self._key, Range=f"bytes={offset}-{offset + n - 1}"
        )
        self.requests += 1
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data


def _hex_of(digest: str) -> str:
    """The hex part of a valid digest; refuses anything else (no path or key tricks)."""
    if not isinstance(digest, str) or not is_digest(digest):
        raise InvalidDigest(f"not a blake3 digest: {digest!r}")
    return digest.removeprefix(DIGEST_PREFIX)


class ArtifactStore(ABC):
    """Where Keel keeps immutable blobs, named by their BLAKE3 digest.

    Subclasses store and fetch raw bytes; this class names, validates and verifies.
    All methods are blocking: async callers run them in a thread.
    """

    @abstractmethod
    def _write(self, hexdigest: str, data: bytes) -> None:
        """Store ``data`` under ``hexdigest`` unless already there."""

    @abstractmethod
    def _read(self, hexdigest: str, digest: str) -> bytes:
        """The stored bytes; raises ``ArtifactNotFound``."""

    @abstractmethod
    def _exists(self, hexdigest: str) -> bool:
        """Whether something is stored under ``hexdigest``."""

    @abstractmethod
    def describe(self) -> str:
        """Where this store keeps its artifacts, for messages."""

    def put_bytes(self, data: bytes) -> str:
        """Store ``data``; returns its digest. Storing known content again does nothing."""
        data = bytes(data)
        digest = digest_bytes(data)
        self._write(_hex_of(digest), data)
        return digest

    def put_json(self, value: Any) -> str:
        """Store the canonical JSON form of ``value``; returns ``digest_json(value)``."""
        return self.put_bytes(canonical_json(value))

    def put_many(self, blobs: Sequence[bytes]) -> list[str]:
        """Store every blob of ``blobs``; their digests, in order. All are stored when this
        returns, as if each had been put with :meth:`put_bytes` (here: 8 at a time)."""
        if len(blobs) <= 1:
            return [self.put_bytes(b) for b in blobs]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=8) as pool:
            return list(pool.map(self.put_bytes, blobs))

    def get_bytes(self, digest: str) -> bytes:
        """The content stored under ``digest``, verified against it.

        Raises ``InvalidDigest``, ``ArtifactNotFound`` or ``ArtifactCorrupted``.
        """
        hexdigest = _hex_of(digest)
        data = self._read(hexdigest, digest)
        actual = digest_bytes(data)
        if actual != digest:
            raise ArtifactCorrupted(digest, actual, self.describe())
        return data

    def get_json(self, digest: str) -> Any:
        """The JSON value stored under ``digest`` (see ``get_bytes`` for errors)."""
        return json.loads(self.get_bytes(digest))

    def exists(self, digest: str) -> bool:
        """Whether an artifact is stored under ``digest`` (its content is not verified)."""
        return self._exists(_hex_of(digest))

    def put_file(self, path: Path) -> str:
        """Store the file at ``path``; returns its digest (what ``put_bytes`` of its bytes
        returns). Stores that can stream a file from disk do, without holding it."""
        return self.put_bytes(Path(path).read_bytes())

    def open_blob(self, digest: str) -> BlobReader:
        """A seekable reader over the artifact stored under ``digest``, for reading parts
        of a large artifact (a Parquet file's footer and row groups) without fetching all
        of it. Unlike ``get_bytes`` the content is not verified against its digest (that
        needs every byte); ``ArtifactNotFound`` when nothing is stored under it."""
        return _BytesBlob(self.get_bytes(digest))

    def get_range(self, digest: str, offset: int, length: int) -> bytes:
        """``length`` bytes from ``offset`` of the artifact under ``digest``, not verified
        (``get_member`` verifies a member); fewer when the artifact ends first."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range {offset}+{length} of {digest}")
        with self.open_blob(digest) as blob:
            blob.seek(offset)
            return _read_exactly(blob, length)

    def get_member(self, ref: PackRef, digest: str) -> bytes:
        """The member of a pack at ``ref``, verified against its own ``digest``: a slice
        that hashes to anything else raises ``ArtifactCorrupted``."""
        return verify_member(self.get_range(ref.pack, ref.offset, ref.length), digest, self)

    def get_members(self, members: Sequence[tuple[PackRef, str]], span_max: int) -> list[bytes]:
        """Members of one pack (each ``(ref, digest)``), each verified as by
        :meth:`get_member`: in one ranged read over them when it spans at most
        ``span_max`` bytes (consecutive members lie together), else one read each."""
        if len(members) == 1:
            return [self.get_member(*members[0])]
        lo = min(r.offset for r, _ in members)
        hi = max(r.offset + r.length for r, _ in members)
        if hi - lo > span_max:
            return [self.get_member(r, d) for r, d in members]
        span = self.get_range(members[0][0].pack, lo, hi - lo)
        return [
            verify_member(span[r.offset - lo : r.offset - lo + r.length], d, self)
            for r, d in members
        ]


def _read_exactly(blob: BinaryIO | io.RawIOBase, length: int) -> bytes:
    out = bytearray()
    while len(out) < length:
        chunk = blob.read(length - len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def verify_member(data: bytes, digest: str, store: ArtifactStore) -> bytes:
    """``data`` when it hashes to ``digest``; else ``ArtifactCorrupted``."""
    actual = digest_bytes(data)
    if actual != digest:
        raise ArtifactCorrupted(digest, actual, store.describe())
    return data


def _writer_of(data: bytes) -> Callable[[BinaryIO], object]:
    return lambda f: f.write(data)


class LocalArtifactStore(ArtifactStore):
    """Artifacts as read-only files under ``root``, sharded two levels deep by digest."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def describe(self) -> str:
        return f"local store {self.root}"

    def path_for(self, digest: str) -> Path:
        """The file an artifact lives in (whether or not it exists)."""
        return self._path(_hex_of(digest))

    def _path(self, hexdigest: str) -> Path:
        return self.root / hexdigest[:2] / hexdigest[2:4] / hexdigest

    def _write(self, hexdigest: str, data: bytes) -> None:
        self._write_blob(hexdigest, len(data), _writer_of(data))

    def _write_blob(self, hexdigest: str, size: int, fill: Callable[[BinaryIO], object]) -> None:
        """Store the ``size`` bytes that ``fill`` writes under ``hexdigest``: into a
        temporary file, synced, made read-only and renamed into place, then the directory
        synced. A blob already there with that size is left alone."""
        staged = self._stage(hexdigest, size, fill, sync=True)
        if staged is None:
            return
        tmp, path = staged
        try:
            # Readers see either no file or the whole file, never a partial one.
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self._fsync_dir(path.parent)

    def _stage(
        self, hexdigest: str, size: int, fill: Callable[[BinaryIO], object], *, sync: bool
    ) -> tuple[str, Path] | None:
        """A read-only temporary file beside ``hexdigest``'s place holding what ``fill``
        writes (synced with ``sync``), and that place; None when a blob of that size is
        there already (same name and size: the same content, the name is its hash)."""
        path = self._path(hexdigest)
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size == size:
                return None
            log.warning("rewriting artifact %s: stored size differs", path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{hexdigest[:8]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o444)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        return tmp, path

    def put_many(self, blobs: Sequence[bytes]) -> list[str]:
        """Store every blob of ``blobs``: each into a temporary file beside its place,
        then one sync of the store's file system for all their bytes, the renames into
        place, and one more sync for the renames. Two syncs for the batch instead of two
        fsyncs a blob (a compile stores one input per shard: at 100,000 shards those
        fsyncs were most of it). As with :meth:`put_bytes`, a blob is never seen at its
        name before its bytes are on disk, and all are durable when this returns. Where
        ``syncfs`` is missing, each file and directory is synced instead."""
        digests = [digest_bytes(b) for b in blobs]
        pending: list[tuple[str, Path]] = []
        try:
            unique = {_hex_of(d): bytes(b) for d, b in zip(digests, blobs, strict=True)}
            for hexdigest, data in unique.items():
                staged = self._stage(hexdigest, len(data), _writer_of(data), sync=not _SYNCFS)
                if staged is not None:
                    pending.append(staged)
            if not pending:
                return digests
            self._sync()
            directories = {path.parent for _, path in pending}
            while pending:
                tmp, path = pending[-1]
                os.replace(tmp, path)
                pending.pop()
            self._sync(directories)
        except BaseException:
            for tmp, _ in pending:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
            raise
        return digests

    def _sync(self, directories: set[Path] | None = None) -> None:
        """The store's file system synced (``syncfs``), or else ``directories``."""
        if _SYNCFS:
            fd = os.open(self.root, os.O_RDONLY)
            try:
                if _SYNCFS(fd) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, os.strerror(err), str(self.root))
            finally:
                os.close(fd)
            return
        for directory in directories or ():
            self._fsync_dir(directory)

    @staticmethod
    def _fsync_dir(directory: Path) -> None:
        # The rename is durable only once the directory entry is on disk.
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _read(self, hexdigest: str, digest: str) -> bytes:
        try:
            return self._path(hexdigest).read_bytes()
        except FileNotFoundError:
            raise ArtifactNotFound(digest, self.describe()) from None

    def _exists(self, hexdigest: str) -> bool:
        return self._path(hexdigest).is_file()

    def put_file(self, path: Path) -> str:
        """Copy the file in (streamed, never held whole), as ``_write`` writes bytes."""
        source = Path(path)
        digest = _file_digest(source)
        hexdigest = _hex_of(digest)

        def copy(out: BinaryIO) -> None:
            with source.open("rb") as src:
                while block := src.read(1 << 20):
                    out.write(block)

        self._write_blob(hexdigest, source.stat().st_size, copy)
        return digest

    def open_blob(self, digest: str) -> BlobReader:
        """The artifact's file, opened for positioned reads."""
        try:
            return _FileBlob(self.path_for(digest))
        except FileNotFoundError:
            raise ArtifactNotFound(digest, self.describe()) from None


_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchBucket"})


def _client_error() -> type[ClientError]:
    from botocore.exceptions import ClientError

    return ClientError


def _error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class S3Options(TypedDict, total=False):
    """How an S3 client connects: endpoint, region and credentials (None: boto3's usual
    chain), SDK retries (default 3) and timeouts (connect 5 s, read 60 s)."""

    endpoint_url: str | None
    region: str | None
    access_key_id: str | None
    secret_access_key: str | None
    max_attempts: int
    connect_timeout_s: float
    read_timeout_s: float


def make_s3_client(**options: Unpack[S3Options]) -> Any:
    """A boto3 S3 client as the S3 store uses it (credentials left as None come from
    boto3's usual chain)."""
    # boto3 takes ~0.5 s to import; only S3 users pay for it.
    import boto3
    from botocore.config import Config

    endpoint_url = options.get("endpoint_url")
    config = Config(
        # A few quick SDK retries absorb connection blips; anything longer is the
        # calling activity's retry policy's business (Temporal owns retries).
        retries={"max_attempts": options.get("max_attempts", 3), "mode": "standard"},
        connect_timeout=options.get("connect_timeout_s", 5.0),
        read_timeout=options.get("read_timeout_s", 60.0),
        # S3-compatible servers on a plain host:port cannot do virtual-host buckets.
        s3={"addressing_style": "path" if endpoint_url else "auto"},
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url or None,
        region_name=options.get("region") or None,
        aws_access_key_id=options.get("access_key_id") or None,
        aws_secret_access_key=options.get("secret_access_key") or None,
        config=config,
    )


def _s3_connection(settings: Settings) -> S3Options:
    """The artifact store's S3 endpoint, region and credentials (``KEEL_S3_*``; empty
    credentials use boto3's usual chain): every S3 client Keel makes takes these."""
    return {
        "endpoint_url": settings.s3_endpoint_url or None,
        "region": settings.s3_region or None,
        "access_key_id": settings.s3_access_key_id.get_secret_value() or None,
        "secret_access_key": settings.s3_secret_access_key.get_secret_value() or None,
    }


def s3_client_from_settings(settings: Settings) -> Any:
    """A boto3 S3 client with the artifact store's S3 settings: what MRP ``s3://``
    inputs, which may span buckets, are listed and read with."""
    return make_s3_client(**_s3_connection(settings))


class S3ArtifactStore(ArtifactStore):
    """Artifacts as objects ``blake3/<hex>`` in one S3 (or S3-compatible) bucket.

    The bucket is created on the first write if it does not exist. Credentials left as
    None come from boto3's usual chain (environment, profile, instance role).
    """

    KEY_PREFIX = "blake3/"

    def __init__(self, bucket: str, **options: Unpack[S3Options]) -> None:
        self.bucket = bucket
        self.region = options.get("region")
        self.endpoint_url = options.get("endpoint_url") or None
        self._client: Any = make_s3_client(**options)
        self._bucket_ready = False
        self._bucket_lock = threading.Lock()

    def describe(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}{where}"

    def key_for(self, digest: str) -> str:
        """The object key an artifact lives under."""
        return self.KEY_PREFIX + _hex_of(digest)

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (done once per store object)."""
        if self._bucket_ready:
            return
        with self._bucket_lock:
            if self._bucket_ready:
                return
            try:
                self._client.head_bucket(Bucket=self.bucket)
            except _client_error() as e:
                if _error_code(e) not in _NOT_FOUND_CODES:
                    raise
                self._create_bucket()
            self._bucket_ready = True

    def get_named(self, key: str) -> bytes | None:
        """A small named object (a reference, not an artifact) at ``key``, or None."""
        return self._get_object(key)

    def _get_object(self, key: str, byte_range: str | None = None) -> bytes | None:
        """The object at ``key`` read whole (or its ``bytes=a-b`` range), or None where
        there is none."""
        extra = {"Range": byte_range} if byte_range is not None else {}
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=key, **extra)
        except _client_error() as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                return None
            raise
        body = response["Body"]
        try:
            data: bytes = body.read()
        finally:
            body.close()
        return data

    def put_named(self, key: str, data: bytes) -> None:
        """Write (or overwrite) the small named object at ``key``."""
        self.ensure_bucket()
        self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="text/plain")

    def bucket_exists(self) -> bool:
        """Whether the bucket is there (HEAD bucket; nothing is created)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except _client_error() as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                return False
            raise
        return True

    def head_named(self, key: str) -> dict[str, Any] | None:
        """``{"size": int, "metadata": {...}}`` of the object at ``key``, or None."""
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=key)
        except _client_error() as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                return None
            raise
        return {
            "size": int(response.get("ContentLength", 0)),
            "metadata": dict(response.get("Metadata") or {}),
        }

    def put_object_at(
        self,
        key: str,
        data: bytes,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
    ) -> None:
        """Write the object at ``key`` in one PUT (S3 replaces an object atomically), in a
        bucket that must already exist (sinks never create buckets)."""
        self._client.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ContentType=content_type,
            Metadata=dict(metadata or {}),
        )

    def delete_named(self, key: str) -> None:
        """Delete the object at ``key`` (nothing happens when it is not there)."""
        self._client.delete_object(Bucket=self.bucket, Key=key)

    def upload_file_at(
        self,
        key: str,
        path: Path,
        *,
        content_type: str = "application/octet-stream",
        metadata: dict[str, str] | None = None,
        part_bytes: int = MULTIPART_PART_BYTES,
    ) -> None:
        """Stream the file at ``path`` to ``key``, in a bucket that must already exist: one
        PUT up to ``part_bytes``, a multipart upload above it (S3 takes at most 5 GB in one
        PUT and 10,000 parts; the part size grows with the file so any size fits). The
        object appears whole when the upload completes, never in part."""
        from boto3.s3.transfer import TransferConfig

        size = path.stat().st_size
        part = max(part_bytes, -(-size // 10_000))
        self._client.upload_file(
            str(path),
            self.bucket,
            key,
            ExtraArgs={"ContentType": content_type, "Metadata": dict(metadata or {})},
            Config=TransferConfig(
                multipart_threshold=part_bytes, multipart_chunksize=part, use_threads=False
            ),
        )

    def _create_bucket(self) -> None:
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        # us-east-1 is the one region that refuses an explicit LocationConstraint.
        if self.region and self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            self._client.create_bucket(**kwargs)
            log.info("created artifact bucket %s", self.describe())
        except _client_error() as e:
            # Another process created it between our head and create.
            if _error_code(e) not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise

    def _write(self, hexdigest: str, data: bytes) -> None:
        self.ensure_bucket()
        if self._exists(hexdigest):
            return
        self._client.put_object(
            Bucket=self.bucket,
            Key=self.KEY_PREFIX + hexdigest,
            Body=data,
            ContentType="application/octet-stream",
        )

    def _read(self, hexdigest: str, digest: str) -> bytes:
        data = self._get_object(self.KEY_PREFIX + hexdigest)
        if data is None:
            raise ArtifactNotFound(digest, self.describe())
        return data

    def _exists(self, hexdigest: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=self.KEY_PREFIX + hexdigest)
        except _client_error() as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                return False
            raise
        return True

    def put_file(self, path: Path) -> str:
        """Upload the file (streamed: one PUT, or multipart above ``MULTIPART_PART_BYTES``)
        under its digest, unless it is already stored."""
        digest = _file_digest(Path(path))
        hexdigest = _hex_of(digest)
        self.ensure_bucket()
        if not self._exists(hexdigest):
            self.upload_file_at(self.KEY_PREFIX + hexdigest, Path(path))
        return digest

    def open_blob(self, digest: str) -> BlobReader:
        """A reader whose reads are ranged GETs of the artifact's object (one HEAD first,
        for its size)."""
        key = self.key_for(digest)
        try:
            response = self._client.head_object(Bucket=self.bucket, Key=key)
        except _client_error() as e:
            if _error_code(e) in _NOT_FOUND_CODES:
                raise ArtifactNotFound(digest, self.describe()) from None
            raise
        return _S3RangeBlob(self._client, self.bucket, key, int(response["ContentLength"]))

    def get_range(self, digest: str, offset: int, length: int) -> bytes:
        """One ranged ``GET`` (no HEAD first)."""
        if offset < 0 or length < 0:
            raise ValueError(f"bad range {offset}+{length} of {digest}")
        if length == 0:
            return b""
        data = self._get_object(self.key_for(digest), f"bytes={offset}-{offset + length - 1}")
        if data is None:
            raise ArtifactNotFound(digest, self.describe())
        return data


class GroupedPuts:
    """Puts from many coroutines of one event loop, written together: a put waits while
    the puts before it are written, then goes with every put that queued meanwhile in one
    :meth:`ArtifactStore.put_many` (on the local store: two file-system syncs for the
    group instead of two fsyncs a blob). A put returns once its blob is durable, as
    :meth:`ArtifactStore.put_bytes` does. SRL steps write three small artifacts each
    (prompt, edited text, diff) from up to a window of episodes at once."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self._queue: list[tuple[bytes, asyncio.Future[str]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def put_bytes(self, data: bytes) -> str:
        loop = asyncio.get_running_loop()
        if self._writer is not None and self._writer.get_loop() is not loop:
            # Another event loop's (a worker built again in the same process): its puts
            # went with it.
            self._queue, self._writer = [], None
        fut: asyncio.Future[str] = loop.create_future()
        self._queue.append((bytes(data), fut))
        if self._writer is None or self._writer.done():
            self._writer = loop.create_task(self._write())
        return await asyncio.shield(fut)

    async def put_json(self, value: Any) -> str:
        return await self.put_bytes(canonical_json(value))

    async def _write(self) -> None:
        while self._queue:
            group, self._queue = self._queue, []
            try:
                digests = await asyncio.to_thread(self.store.put_many, [d for d, _ in group])
            except BaseException as e:
                for _, fut in group:
                    if not fut.done():
                        fut.set_exception(
                            e if isinstance(e, Exception) else RuntimeError("put cancelled")
                        )
                if not isinstance(e, Exception):
                    raise
                continue
            for (_, fut), digest in zip(group, digests, strict=True):
                if not fut.done():
                    fut.set_result(digest)


def artifact_store_from_settings(settings: Settings) -> ArtifactStore:
    """The artifact store ``settings`` ask for (``KEEL_ARTIFACT_BACKEND``: local or s3)."""
    if settings.artifact_backend == "s3":
        return s3_client_for_bucket(settings, settings.s3_bucket)
    return LocalArtifactStore(settings.artifacts_dir)


def s3_client_for_bucket(settings: Settings, bucket: str) -> S3ArtifactStore:
    """An S3 store on ``bucket`` with the artifact store's connection: the store itself,
    and MRP's ``s3://`` sinks."""
    return S3ArtifactStore(bucket, **_s3_connection(settings))
