"""Where a job's ``inputs.files`` come from: the base folder a run may read, and the walk
that lists the files a job's patterns match and stores their bytes."""

from __future__ import annotations

import os
from pathlib import Path

from keel.mrp.errors import InputsRefused
from keel.mrp.normalize import FileRef, glob_regex
from store.artifacts import ArtifactStore

__all__ = ["input_root", "resolve_files"]


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


def resolve_files(
    patterns: list[str], base_dir: Path, store: ArtifactStore, *, max_items: int | None = None
) -> tuple[list[FileRef], dict[str, str]]:
    """List files under ``base_dir`` matching ``patterns`` (the compiler's glob rules), store
    their bytes, and return their refs and ``{path: digest}``.

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
    refs: list[FileRef] = []
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
            if max_items is not None and len(refs) >= max_items:
                raise InputsRefused(
                    f"inputs.files match more than {max_items} files, the most the shard "
                    "cap allows (MRP-P005); listing stopped there"
                )
            data = real.read_bytes()
            digest = store.put_bytes(data)
            refs.append(FileRef(path=rel, digest=digest, size_bytes=len(data)))
    refs.sort(key=lambda r: r.path)
    return refs, {r.path: r.digest for r in refs}
