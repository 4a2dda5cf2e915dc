"""Named references beside the artifact store: ``key digest -> artifact digest``.

The store is content-addressed, so finding "the answer we already got for this request"
needs a second, small map from a digest of the request (or a node's idempotency key) to
the digest of what was stored. MRP's LLM cache (``refs/mrp-llm``) and design codegen's
recorded answers (``refs/design-codegen``) each keep one under their own folder.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Protocol

from keel.digest import is_digest
from store.artifacts import ArtifactStore, LocalArtifactStore, S3ArtifactStore


class RefIndex(Protocol):
    """Where the ``key digest -> artifact digest`` references of one user live."""

    def get(self, request_digest: str) -> str | None:
        """The referenced digest, or None."""
        ...

    def put(self, request_digest: str, answer_digest: str) -> None:
        """Record (or overwrite) a reference."""
        ...


def _hex(digest: str) -> str:
    if not is_digest(digest):
        raise ValueError(f"not a blake3 digest: {digest!r}")
    return digest.removeprefix("blake3:")


class LocalRefIndex:
    """References as small files ``<root>/<hex[:2]>/<hex>`` holding the answer digest."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _path(self, request_digest: str) -> Path:
        h = _hex(request_digest)
        return self.root / h[:2] / h

    def get(self, request_digest: str) -> str | None:
        try:
            text = self._path(request_digest).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return None
        return text if is_digest(text) else None

    def put(self, request_digest: str, answer_digest: str) -> None:
        path = self._path(request_digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".ref.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(answer_digest + "\n")
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise


class S3RefIndex:
    """References as objects ``<refs_dir>/<hex>`` in the artifact bucket."""

    def __init__(self, store: S3ArtifactStore, refs_dir: str) -> None:
        self.store = store
        self.refs_dir = refs_dir

    def get(self, request_digest: str) -> str | None:
        data = self.store.get_named(f"{self.refs_dir}/{_hex(request_digest)}")
        if data is None:
            return None
        text = data.decode("ascii").strip()
        return text if is_digest(text) else None

    def put(self, request_digest: str, answer_digest: str) -> None:
        self.store.put_named(
            f"{self.refs_dir}/{_hex(request_digest)}", (answer_digest + "\n").encode("ascii")
        )


def ref_index_for(store: ArtifactStore, refs_dir: str) -> RefIndex:
    """The reference index under ``refs_dir`` that lives with ``store`` (a folder of the
    local store or a prefix of the S3 bucket); each user has its own ``refs_dir``."""
    if isinstance(store, LocalArtifactStore):
        return LocalRefIndex(store.root / refs_dir)
    if isinstance(store, S3ArtifactStore):
        return S3RefIndex(store, refs_dir)
    raise TypeError(f"no LLM cache index for {type(store).__name__}")
