"""Where a job's ``inputs.files`` come from: the base folder a run may read, the walk that
lists the files a job's patterns match, ``s3://`` prefixes (read with the artifact store's
S3 settings, inside ``caps.allowed_input_prefixes``), and storing their bytes, whole or as
record slices (``activities/mrp/records.py``)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.mrp.records import ScanProgress, scan_record_file
from keel.mrp.dsl import S3_URI_RE, InputsSpec
from keel.mrp.errors import InputsRefused
from keel.mrp.normalize import FileRef, glob_regex, pattern_regex
from keel.mrp.policy import Caps
from keel.mrp.records import MalformedRecord, RecordSlice
from keel.settings import Settings
from store.artifacts import ArtifactStore, s3_client_from_settings

__all__ = [
    "ResolvedInputs",
    "input_root",
    "list_files",
    "list_s3",
    "resolve_files",
    "resolve_inputs",
]


def input_root(base_dir: str, roots: list[Path]) -> Path:
    """The folder ``inputs.files`` resolve under, resolved (links too); ``InputsRefused``
    when there is none or it is not allowed.

    An empty or relative ``base_dir`` would mean the worker's own working directory, which
    holds its checkout, ``.venv`` and secrets: a job must name its folder. With
    ``KEEL_MRP_JOB_ROOTS`` set on the worker, the folder must lie inside one of them, so a
    run started around the API (``temporal workflow start``) is held to the same roots.
    """
    if not base_dir:
        raise InputsRefused(
            "inputs.files names files but the run has no base_dir: a job that reads files "
            "must say where they are (POST /mrp/jobs: base_dir inside KEEL_MRP_JOB_ROOTS, "
            "or a job file by path)"
        )
    raw = Path(base_dir)
    if not raw.is_absolute():
        raise InputsRefused(f"base_dir {base_dir!r} must be an absolute path")
    base = raw.resolve()
    if not base.is_dir():
        raise InputsRefused(f"base_dir {base_dir!r} is not a folder")
    resolved_roots = [r.resolve() for r in roots]
    if resolved_roots and not any(base == r or base.is_relative_to(r) for r in resolved_roots):
        raise InputsRefused(f"base_dir {base_dir!r} is outside KEEL_MRP_JOB_ROOTS")
    return base


def _literal_dirs(pattern: str) -> tuple[str, ...]:
    """The folders a pattern names before its first glob segment (where a walk can stay)."""
    parts = pattern.split("/")[:-1]
    out: list[str] = []
    for part in parts:
        if any(c in part for c in "*?["):
            break
        out.append(part)
    return tuple(out)


def list_files(
    patterns: list[str], base_dir: Path, *, max_items: int | None = None
) -> list[tuple[str, Path]]:
    """``(relative path, real path)`` of every file under ``base_dir`` matching
    ``patterns`` (the compiler's glob rules), sorted by path.

    The walk never leaves ``base_dir``: patterns with ``..`` or absolute ones are refused,
    linked folders are not entered, and a matching file that is a link out of ``base_dir``
    refuses the job. It stops at the ``max_items + 1``-th match (``InputsRefused``), so a
    glob over a huge tree costs what the cap allows, not the tree's size.
    """
    for p in patterns:
        parts = p.split("/")
        if p.startswith("/") or "\\" in p or ".." in parts:
            raise InputsRefused(f"inputs.files pattern {p!r} must stay inside base_dir")
    regexes = [glob_regex(p) for p in patterns]
    prefixes = [_literal_dirs(p) for p in patterns]
    base = base_dir.resolve()
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath).relative_to(base).parts
        # Enter only folders some pattern can reach: ``data/*.txt`` never walks ``.venv``.
        dirnames[:] = sorted(
            d
            for d in dirnames
            if any((*here, d)[: len(pre)] == pre[: len(here) + 1] for pre in prefixes)
        )
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(base).as_posix()
            if not any(rx.match(rel) for rx in regexes):
                continue
            real = full.resolve()
            if not real.is_relative_to(base):
                raise InputsRefused(f"inputs.files: {rel!r} is a link out of base_dir")
            if not real.is_file():
                continue
            if max_items is not None and len(found) >= max_items:
                raise _too_many(max_items)
            found.append((rel, real))
    found.sort()
    return found


def _too_many(max_items: int) -> InputsRefused:
    return InputsRefused(
        f"inputs.files match more than {max_items} files, the most the shard "
        "cap allows (MRP-P005); listing stopped there"
    )


def resolve_files(
    patterns: list[str], base_dir: Path, store: ArtifactStore, *, max_items: int | None = None
) -> tuple[list[FileRef], dict[str, str]]:
    """List files under ``base_dir`` matching ``patterns`` (:func:`list_files`), store
    their bytes, and return their refs and ``{path: digest}``."""
    refs: list[FileRef] = []
    for rel, real in list_files(patterns, base_dir, max_items=max_items):
        data = real.read_bytes()
        digest = store.put_bytes(data)
        refs.append(FileRef(path=rel, digest=digest, size_bytes=len(data)))
    return refs, {r.path: r.digest for r in refs}


# -- S3 --------------------------------------------------------------------------------------


def list_s3(
    patterns: list[str], client: Any, *, max_items: int | None = None
) -> list[tuple[str, int]]:
    """``(s3://bucket/key, size)`` of every object matching the ``s3://`` ``patterns``
    (a trailing ``/`` means everything under that prefix; ``*``, ``**``, ``?`` and classes
    as for relative paths), sorted. Keys ending in ``/`` (folder markers) are not files."""
    found: dict[str, int] = {}
    for pattern in patterns:
        m = S3_URI_RE.match(pattern)
        if m is None:
            raise InputsRefused(f"inputs.files: {pattern!r} is not an s3://bucket/prefix URI")
        bucket, key = m.group("bucket"), m.group("key")
        literal = key
        for i, c in enumerate(key):
            if c in "*?[":
                literal = key[:i]
                break
        rx = pattern_regex(pattern)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=literal)
        for page in pages:
            for obj in page.get("Contents", []):
                uri = f"s3://{bucket}/{obj['Key']}"
                if obj["Key"].endswith("/") or not rx.match(uri):
                    continue
                if uri not in found and max_items is not None and len(found) >= max_items:
                    raise _too_many(max_items)
                found[uri] = int(obj["Size"])
    return sorted(found.items())


def _download(client: Any, uri: str, into: Path) -> Path:
    m = S3_URI_RE.match(uri)
    assert m is not None
    target = into / f"{len(list(into.iterdir()))}.bin"
    with target.open("wb") as f:
        client.download_fileobj(m.group("bucket"), m.group("key"), f)
    return target


# -- Everything an input names ---------------------------------------------------------------


@dataclass
class ResolvedInputs:
    """What the compile activity hands the compiler for ``inputs.files``: the files (with
    digests), ``{path: digest}``, the record slices (``inputs.format`` only) and every
    malformed record the scan found."""

    files: list[FileRef]
    file_digests: dict[str, str]
    slices: list[RecordSlice] | None = None
    malformed: list[MalformedRecord] = field(default_factory=list)


def resolve_inputs(
    inputs: InputsSpec,
    *,
    base_dir: str,
    settings: Settings,
    caps: Caps,
    store: ArtifactStore,
    base_path: Path | None = None,
    progress: ScanProgress | None = None,
) -> ResolvedInputs:
    """List, hash and store every file ``inputs.files`` names: relative patterns under
    ``base_dir`` (``input_root``; or ``base_path`` as given, for the CLI), ``s3://``
    patterns with the artifact store's S3 settings, after checking them against
    ``caps.allowed_input_prefixes`` (nothing outside them is listed). Without a format
    each file is stored whole; with one, each is scanned into record slices, and the
    scan stops with ``InputsRefused`` at the slice that passes ``caps.max_shards``.
    ``progress`` (its ``max_shards`` is set here) counts the scan as it goes."""
    patterns = list(inputs.files or [])
    local = [p for p in patterns if "://" not in p]
    remote = [p for p in patterns if "://" in p]
    refused = [p for p in remote if not caps.input_allowed(p)]
    if refused:
        allowed = ", ".join(caps.allowed_input_prefixes) or "none"
        raise InputsRefused(
            f"MRP-P015 input source not allowed: input {refused[0]!r} is outside the allowed "
            f"input prefixes ({allowed})"
        )
    max_items = caps.max_shards * inputs.items_per_shard
    sources: list[tuple[str, Path | None]] = []
    if local:
        base = base_path if base_path is not None else input_root(base_dir, settings.mrp_job_roots)
        sources += list(list_files(local, base, max_items=max_items))
    client: Any = None
    if remote:
        client = s3_client_from_settings(settings)
        sources += [(uri, None) for uri, _ in list_s3(remote, client, max_items=max_items)]
    if len(sources) > max_items:
        raise _too_many(max_items)
    out = ResolvedInputs(files=[], file_digests={}, slices=[] if inputs.format else None)
    progress = progress if progress is not None else ScanProgress()
    progress.max_shards = caps.max_shards
    with tempfile.TemporaryDirectory(prefix="keel-mrp-inputs-") as tmp:
        for path, real in sorted(sources, key=lambda s: s[0]):
            where = real if real is not None else _download(client, path, Path(tmp))
            try:
                if inputs.format is None:
                    data = where.read_bytes()
                    ref = FileRef(path=path, digest=store.put_bytes(data), size_bytes=len(data))
                else:
                    ref, slices, malformed = scan_record_file(path, where, inputs, store, progress)
                    assert out.slices is not None
                    out.slices += slices
                    out.malformed += malformed
            finally:
                if real is None:
                    where.unlink(missing_ok=True)
            out.files.append(ref)
            out.file_digests[ref.path] = ref.digest
    return out
