"""The design family's use cases on a decision set's generated repository, for
``cli/design.py`` and ``api/routes/design_files.py`` alike: its archive (the download and
the signed link), its files and their text, and its diff against the previous set's. They
read the read model (``store.design``) and raise a :mod:`client.design_refusals` reason
when they will not."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sqlalchemy.orm import Session, sessionmaker

from client.design_refusals import (
    FileTooLarge,
    NoArchive,
    NoRepository,
    NoSuchArchive,
    NoSuchFile,
    NotText,
)
from store import design as design_store

if TYPE_CHECKING:
    from store.artifacts import ArtifactStore

#: Larger files are listed but their text is not served (the console is no editor).
MAX_TEXT_BYTES = 512 * 1024


@dataclass(frozen=True)
class Archive:
    """A decision set's repository archive and how its tree fared in the validators."""

    digest: str
    size_bytes: int | None
    failed_validators: list[str]

    @property
    def validation(self) -> Literal["passed", "failed"]:
        return "failed" if self.failed_validators else "passed"


def archive_of(sm: sessionmaker[Session], project: str, ds: str) -> Archive:
    """The decision set's archive (from the read model).

    Raises:
        NoArchive: it has no repository (none such, not finished, or planned with
            generate=false).
    """
    stored = design_store.stored_view(sm, project, ds)
    archive = stored.archive
    if archive is None:
        raise NoArchive(project, ds)
    return Archive(archive["digest"], archive["size_bytes"], stored.failed_validators or [])


def archive_bytes(
    sm: sessionmaker[Session], artifacts: ArtifactStore, digest: str
) -> tuple[bytes, Archive]:
    """The archive ``digest`` (of any decision set that has it) and its validation.

    Raises:
        NoSuchArchive: ``digest`` is no decision set's archive, or the store lost it.
    """
    from store.artifacts import ArtifactNotFound

    # Only archives are handed out; the check keeps it so if a signing key leaks.
    if not design_store.is_archive(sm, digest):
        raise NoSuchArchive(digest)
    try:
        data = artifacts.get_bytes(digest)
    except ArtifactNotFound:
        raise NoSuchArchive(digest) from None
    failed = design_store.archive_failing_validators(sm, digest)
    return data, Archive(digest, len(data), failed)


def repository(
    sm: sessionmaker[Session], artifacts: ArtifactStore, repos: Path, project: str, ds: str
) -> design_store.RepositoryView:
    """The decision set's generated repository (``store.design.repository_view``).

    Raises:
        NoRepository: it has none.
    """
    view = design_store.repository_view(sm, artifacts, repos, project, ds)
    if view is None:
        raise NoRepository(ds)
    return view


def repository_diff(
    sm: sessionmaker[Session], artifacts: ArtifactStore, repos: Path, project: str, ds: str
) -> design_store.RepositoryDiff:
    """The decision set's repository against its previous one's.

    Raises:
        NoRepository: it has none.
    """
    found = design_store.repository_diff(sm, artifacts, repos, project, ds)
    if found is None:
        raise NoRepository(ds)
    return found


def parent_of(sm: sessionmaker[Session], project: str, ds: str) -> str | None:
    row = design_store.decision_set(sm, project, ds)
    return row["parent_id"] if row is not None else None


def _checked_size(path: str, size: int | None) -> None:
    if size is not None and size > MAX_TEXT_BYTES:
        raise FileTooLarge(path, size)


def file_text(view: design_store.RepositoryView, path: str) -> tuple[int, str]:
    """One file's size and text.

    Raises:
        NoSuchFile, FileTooLarge (over ``MAX_TEXT_BYTES``), NotText (not UTF-8).
    """
    size = view.files().get(path)
    if size is None:
        raise NoSuchFile(view.decision_set, path)
    _checked_size(path, size)
    data = view.read(path)
    if data is None:
        raise NoSuchFile(view.decision_set, path)
    _checked_size(path, len(data))
    try:
        return len(data), data.decode("utf-8")
    except UnicodeDecodeError:
        raise NotText(path) from None


def file_diff(
    diff: design_store.RepositoryDiff, ds: str, path: str
) -> tuple[Literal["added", "removed", "modified", "unchanged"], str]:
    """One file's status and unified diff against the previous repository.

    Raises:
        NoSuchFile (in neither), FileTooLarge (either side).
    """
    before, now = diff.sizes(path)
    if before is None and now is None:
        raise NoSuchFile(ds, path, or_before=True)
    _checked_size(path, before)
    _checked_size(path, now)
    found = diff.file_diff(path)
    if found is None:
        raise NoSuchFile(ds, path, or_before=True)
    return found
