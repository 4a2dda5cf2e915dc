"""SRL datasets on disk: the datasets' config, ingest (check, normalise, ``_meta.json``)
and the parse checks (CPython's parser, ast-grep in the jail). Process (dedup, token
filter, split, stats reports) and tasks (processed records as a task file for ``srl
collect``) are ``activities.srl.splits``. See docs/srl-data.md.

The pure work (mappers, manifest check, dedup, split, report) is ``keel.srl.datasets``;
this module reads and writes files and runs ast-grep in the sandbox.

Layout under ``out``::

    raw/<dataset>/source/<published files, byte for byte>
    raw/<dataset>/normalized/<dataset>.jsonl   {instruction, pre, post, language, tags}
    raw/<dataset>/normalized/errors.jsonl      one line per malformed record
    raw/<dataset>/_meta.json
    processed/{python,javascript,java}/{train,dev,test}.jsonl
    reports/datasets/<dataset>.md, reports/datasets/all.md

A dataset whose published layout is not confirmed (``fields_confirmed: false`` in
``configs/srl/datasets.yaml``) is named as such at run time: a warning in the log, in
``IngestResult.warnings`` and in ``ProcessResult.unconfirmed`` and its reports.

There is no network here: ingest reads local files (``--from PATH``); without them it
raises :class:`DownloadImpossible` naming the URL and the credential's variable.
"""

from __future__ import annotations

import ast
import contextlib
import datetime as dt
import gc
import gzip
import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from keel.problems import located
from keel.srl.datasets import (
    MAPPERS,
    DatasetMeta,
    Manifest,
    ManifestEntry,
    NormaliseResult,
    NormalizedRecord,
    RecordError,
    Sha256,
    Spdx,
    check_manifest,
    normalise_lines,
    normalise_rows,
)
from keel.srl.errors import ManifestMismatch

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "srl" / "datasets.yaml"
DATASETS: tuple[str, ...] = tuple(MAPPERS)
# Extension ast-grep needs to pick the parser of a language it scans.
PARSE_EXTENSIONS: dict[str, str] = {
    "python": ".py",
    "javascript": ".js",
    "typescript": ".ts",
    "java": ".java",
}
# Files per jail run of the parse check: one nsjail start costs more than parsing a file.
PARSE_BATCH = 200


class DataError(Exception):
    """A dataset operation that cannot go on; the message says what to do."""


class DownloadImpossible(DataError):
    """No local files were given and this machine cannot download them."""


class ManifestRequired(DataError):
    """The published hashes are unknown and the user gave no manifest."""


class DatasetFileMissing(DataError):
    """A file the manifest lists is not under the ``--from`` folder."""


# ---- config --------------------------------------------------------------------------


class FileSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    sha256: Sha256 | None = None
    size: int | None = Field(None, ge=0)


class DatasetSpec(BaseModel):
    """One dataset of ``configs/srl/datasets.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    url: str
    version: str
    license: Spdx
    format: Literal["jsonl", "parquet"]
    credential_env: str | None = None
    default_language: str | None = None
    fields_confirmed: bool = False
    # The public material the field mapping was checked against (or, for an unconfirmed
    # layout, what was read and why it is not enough): docs/srl-data.md lists them.
    layout_sources: list[str] = Field(default_factory=list)
    hashes_note: str = ""
    files: list[FileSpec]

    @model_validator(mode="after")
    def _confirmed_by_something(self) -> DatasetSpec:
        if self.fields_confirmed and not self.layout_sources:
            raise ValueError("fields_confirmed needs the layout_sources that confirm them")
        return self

    def layout_warning(self, dataset: str) -> str | None:
        """The run-time warning of a dataset whose layout is not confirmed, else None."""
        if self.fields_confirmed:
            return None
        return (
            f"{dataset}: published layout NOT confirmed; its field mapping is inferred "
            "(docs/srl-data.md), check the normalised records before trusting them"
        )

    def published_manifest(self, dataset: str) -> Manifest | None:
        """The manifest from the published hashes, ``None`` while any is unknown."""
        if any(f.sha256 is None or f.size is None for f in self.files):
            return None
        return Manifest(
            dataset=dataset,
            version=self.version,
            files=[ManifestEntry(name=f.name, sha256=f.sha256, size=f.size) for f in self.files],  # type: ignore[arg-type]
        )


class DatasetsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    datasets: dict[str, DatasetSpec]

    def spec(self, dataset: str) -> DatasetSpec:
        if dataset not in self.datasets:
            raise DataError(f"unknown dataset {dataset!r}; known: {', '.join(self.datasets)}")
        return self.datasets[dataset]


def load_config(path: Path | None = None) -> DatasetsConfig:
    """``configs/srl/datasets.yaml`` (or ``path``), validated; every dataset needs a mapper."""
    raw = yaml.safe_load((path or DEFAULT_CONFIG).read_text(encoding="utf-8"))
    config = DatasetsConfig.model_validate(raw)
    unknown = sorted(set(config.datasets) - set(MAPPERS))
    if unknown:
        raise DataError(f"datasets without a mapper: {', '.join(unknown)}")
    return config


def load_manifest(path: Path) -> Manifest:
    """A user's manifest (YAML or JSON): ``{dataset, version, files: [{name, sha256, size}]}``."""
    return Manifest.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))


# ---- ingest --------------------------------------------------------------------------


class FileRecordError(BaseModel):
    """A malformed record with the published file it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: str
    error: RecordError

    def render(self) -> str:
        e = self.error
        return located(f"{e.field}: {e.message}", self.file, e.line)


class IngestResult(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: str
    meta: DatasetMeta
    files: list[ManifestEntry]
    normalized: str
    num_records: int
    malformed: list[FileRecordError]
    fields_confirmed: bool
    manifest_source: Literal["published", "user"]
    warnings: list[str] = Field(default_factory=list)


def download_impossible(dataset: str, spec: DatasetSpec) -> DownloadImpossible:
    cred = (
        f"; the download needs a token in ${spec.credential_env} (never stored by keel)"
        if spec.credential_env
        else ""
    )
    return DownloadImpossible(
        f"{dataset}: downloading is impossible here (no network). Fetch {spec.url} "
        f"elsewhere{cred}, then pass --from PATH (the folder holding "
        f"{', '.join(f.name for f in spec.files)})"
    )


def _decode(dataset: str, name: str, fmt: str, data: bytes) -> NormaliseResult:
    if name.endswith(".gz"):  # AgentPack's shards: gzipped JSONL
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise DataError(f"{name}: not a readable gzip file: {exc}") from None
    if fmt == "parquet":
        import io

        import pyarrow.parquet as pq

        try:
            rows: list[dict[str, Any]] = pq.read_table(io.BytesIO(data)).to_pylist()
        except Exception as exc:  # pyarrow raises several types for a corrupt file
            raise DataError(f"{name}: not a readable parquet file: {exc}") from None
        return normalise_rows(dataset, rows)
    text = data.decode("utf-8", errors="replace")
    return normalise_lines(dataset, text.splitlines())


def _bundle_sha256(entries: Sequence[ManifestEntry]) -> str:
    """One digest for a dataset of several files: sha256 of ``sha256  name`` lines
    (sha256sum's format), sorted by name; a single file's own sha256."""
    if len(entries) == 1:
        return entries[0].sha256
    lines = "".join(f"{e.sha256}  {e.name}\n" for e in sorted(entries, key=lambda e: e.name))
    return hashlib.sha256(lines.encode()).hexdigest()


def _jsonl(records: Sequence[BaseModel]) -> bytes:
    return b"".join(r.model_dump_json().encode() + b"\n" for r in records)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the data from other readers
    os.replace(tmp, path)


def _manifest_for(
    dataset: str, spec: DatasetSpec, manifest_path: Path | None
) -> tuple[Manifest, Literal["published", "user"]]:
    """The manifest to check the files against: the user's file, else the published one."""
    if manifest_path is not None:
        manifest = load_manifest(manifest_path)
        if manifest.dataset != dataset:
            raise DataError(f"{manifest_path}: a manifest of {manifest.dataset!r}, not {dataset!r}")
        return manifest, "user"
    published = spec.published_manifest(dataset)
    if published is None:
        raise ManifestRequired(
            f"{dataset}: the published sha256/size of its files are unknown "
            f"({spec.hashes_note.strip() or 'see configs/srl/datasets.yaml'}); "
            "give --manifest FILE with the hashes of the files you downloaded"
        )
    return published, "published"


def _checked_files(manifest: Manifest, source_dir: Path) -> list[tuple[ManifestEntry, bytes]]:
    """Every file of the manifest read and checked (size, sha256) before any is used."""
    checked: list[tuple[ManifestEntry, bytes]] = []
    for entry in manifest.files:
        path = source_dir / entry.name
        if not path.is_file():
            raise DatasetFileMissing(f"{entry.name}: not found under {source_dir}")
        data = path.read_bytes()
        checked.append((check_manifest(manifest, entry.name, data), data))
    return checked


def _swap_in(
    out: Path,
    dataset: str,
    checked: Sequence[tuple[ManifestEntry, bytes]],
    records: Sequence[NormalizedRecord],
    malformed: Sequence[FileRecordError],
    meta: DatasetMeta,
) -> Path:
    """Write ``raw/<dataset>/`` under ``out`` and return it. Built beside the old copy
    and swapped in, so a re-ingest never mixes two versions' files and a crash leaves the
    previous ingest whole."""
    root = out / "raw" / dataset
    (out / "raw").mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out / "raw", prefix=f".{dataset}."))
    staging.chmod(0o755)
    try:
        for entry, data in checked:
            _write_atomic(staging / "source" / entry.name, data)
        _write_atomic(staging / "normalized" / f"{dataset}.jsonl", _jsonl(records))
        _write_atomic(
            staging / "normalized" / "errors.jsonl",
            b"".join(e.model_dump_json().encode() + b"\n" for e in malformed),
        )
        # Validated on the way out and again on the way in (read_meta), as the plan asks.
        _write_atomic(staging / "_meta.json", meta.model_dump_json(indent=2).encode() + b"\n")
        if root.exists():
            old = root.with_name(f".{dataset}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(root, old)
            os.replace(staging, root)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def ingest_dataset(
    dataset: str,
    source_dir: Path | None,
    out: Path,
    *,
    manifest_path: Path | None = None,
    config: DatasetsConfig | None = None,
    now: dt.datetime | None = None,
) -> IngestResult:
    """Check the published files under ``source_dir`` against the manifest, normalise
    them and write ``raw/<dataset>/`` under ``out``.

    Every file is checked before anything is written, so a size or sha256 mismatch
    (:class:`ManifestMismatch`, naming the file) leaves ``out`` as it was. Malformed
    records are written to ``errors.jsonl`` and returned, each with file and line.
    """
    cfg = config or load_config()
    spec = cfg.spec(dataset)
    if source_dir is None:
        raise download_impossible(dataset, spec)
    manifest, manifest_source = _manifest_for(dataset, spec, manifest_path)
    checked = _checked_files(manifest, source_dir)
    records: list[NormalizedRecord] = []
    malformed: list[FileRecordError] = []
    for entry, data in checked:
        result = _decode(dataset, entry.name, spec.format, data)
        records.extend(result.records)
        malformed.extend(FileRecordError(file=entry.name, error=e) for e in result.errors)

    entries = [entry for entry, _ in checked]
    meta = DatasetMeta(
        source=spec.source,
        version=manifest.version,
        license=spec.license,
        downloaded_at=now or dt.datetime.now(dt.UTC),
        sha256=_bundle_sha256(entries),
        num_records=len(records),
    )
    root = _swap_in(out, dataset, checked, records, malformed, meta)
    warning = spec.layout_warning(dataset)
    if warning:
        log.warning(warning)
    return IngestResult(
        dataset=dataset,
        meta=meta,
        files=entries,
        normalized=str(root / "normalized" / f"{dataset}.jsonl"),
        num_records=len(records),
        malformed=malformed,
        fields_confirmed=spec.fields_confirmed,
        manifest_source=manifest_source,
        warnings=[warning] if warning else [],
    )


def read_meta(out: Path, dataset: str) -> DatasetMeta:
    return DatasetMeta.model_validate_json((out / "raw" / dataset / "_meta.json").read_bytes())


def read_normalized(out: Path, dataset: str) -> list[NormalizedRecord]:
    path = out / "raw" / dataset / "normalized" / f"{dataset}.jsonl"
    return [
        NormalizedRecord.model_validate_json(line)
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


# ---- parse checks --------------------------------------------------------------------


# CPython before 3.13 keeps ``ast.parse``'s recursion count in interpreter-wide state
# (cpython gh-106905): a parse interrupted by another raises SystemError "AST constructor
# recursion depth mismatch". The interruption is Python code running inside the parse: a
# finalizer the garbage collector calls, which may parse itself or let another thread
# run. A worker parses on its event loop and in its activity threads, so Keel's parses
# go one at a time, with the collector paused (the parse itself runs no Python code).
# Reentrant: tests/conftest.py wraps ``ast.parse`` itself in :func:`uninterrupted`.
_PARSE_LOCK = threading.RLock()


@contextlib.contextmanager
def uninterrupted() -> Iterator[None]:
    """One parse at a time in this process, with the garbage collector paused."""
    with _PARSE_LOCK:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if collecting:
                gc.enable()


def python_syntax_error(text: str) -> str | None:
    """What CPython's parser (parsing only, nothing runs) says is wrong with ``text``, or
    None: it catches what ast-grep's ERROR rule cannot see (tree-sitter's MISSING nodes)."""
    try:
        with uninterrupted():
            ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        return f"{type(e).__name__}: {e}"
    return None


def python_parses(text: str) -> bool:
    return python_syntax_error(text) is None


async def astgrep_parses(texts: Mapping[str, str], language: str) -> dict[str, bool]:
    """``{key: parses}`` for texts of one language by ast-grep's parser in the jail
    (no ERROR node), :data:`PARSE_BATCH` files per jail run."""
    from sandbox import check_parses_async

    ext = PARSE_EXTENSIONS[language]
    keys = list(texts)
    ok: dict[str, bool] = {}
    for start in range(0, len(keys), PARSE_BATCH):
        batch = keys[start : start + PARSE_BATCH]
        files = {f"f{i}{ext}": texts[k] for i, k in enumerate(batch)}
        check = await check_parses_async(files, language)
        if not check.ok:
            raise DataError(f"the parse check itself failed: {check.error}")
        for i, key in enumerate(batch):
            ok[key] = not check.errors.get(f"f{i}{ext}")
    return ok


async def parses_in_jail(texts: Mapping[str, str], language: str) -> dict[str, bool]:
    """:func:`astgrep_parses`, and for Python ``ast.parse`` as well."""
    ok = await astgrep_parses(texts, language)
    if language == "python":
        for key, text in texts.items():
            ok[key] = ok[key] and python_parses(text)
    return ok


__all__ = [
    "DATASETS",
    "DataError",
    "DatasetFileMissing",
    "DatasetSpec",
    "DatasetsConfig",
    "DownloadImpossible",
    "FileRecordError",
    "IngestResult",
    "ManifestMismatch",
    "ManifestRequired",
    "astgrep_parses",
    "ingest_dataset",
    "load_config",
    "load_manifest",
    "parses_in_jail",
    "python_parses",
    "python_syntax_error",
    "read_meta",
    "read_normalized",
    "uninterrupted",
]
