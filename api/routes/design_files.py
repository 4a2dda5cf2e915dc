"""What the console reads of a design project besides ``api.routes.design``: a project's
decision sets, the generated repository's files, one file's text, a file's unified diff
against the previous decision set, and the repository archive (a signed link, and the
download it names).

Access is that of the design routes: a project's decision sets are read by its owner and
``admin``; to anyone else the project or decision set is a 404, as if absent. The files
come from the project's git history (``store.design.repository_view``: the decision set's
commit, without the ``plan.md`` the commit adds), which holds exactly what the download
holds (the generated files, the validators' output and ``reports/``); the diffs are git's
between two decision sets' trees (``store.design.repository_diff``). What each route does
is a use case of ``client/design_files.py``, the one ``design download`` calls too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Literal

from anyio import to_thread
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from api.deps import ArtifactsDep, CallerDep, ClientDep, SessionsDep
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.design import SeenDep, owns_project
from api.routes.design_errors import refusals
from api.routes.design_models import DownloadLink
from client import design as design_client
from client import design_cases as cases
from client import design_files as files
from keel import signed_urls
from keel.settings import Settings
from store import design as design_store
from store.artifacts import ArtifactStore

router = APIRouter(prefix="/design", tags=["design"], responses=ERROR_RESPONSES)

#: How long a download link stays valid.
DOWNLOAD_TTL_S = 15 * 60


class DecisionSetSummary(BaseModel):
    id: str
    parent_id: str | None
    version: int
    status: str
    created_at: datetime
    updated_at: datetime | None = None


class DecisionSetList(BaseModel):
    project_id: str
    decision_sets: list[DecisionSetSummary]


class FileEntry(BaseModel):
    path: str
    size_bytes: int


class FileList(BaseModel):
    decision_set_id: str
    previous_decision_set: str | None
    files: list[FileEntry]


class FileText(BaseModel):
    path: str
    size_bytes: int
    text: str


class FileChange(BaseModel):
    path: str
    status: Literal["added", "removed", "modified"]


class DiffList(BaseModel):
    decision_set_id: str
    previous_decision_set: str | None
    previous_has_files: bool
    changes: list[FileChange]


class FileDiff(BaseModel):
    path: str
    previous_decision_set: str | None
    status: Literal["added", "removed", "modified", "unchanged"]
    diff: str


@router.get("/projects/{project}/decision-sets", response_model=DecisionSetList)
async def list_decision_sets(
    project: str, sessions: SessionsDep, caller: CallerDep, client: ClientDep
) -> DecisionSetList:
    """The project's decision sets, newest first; another owner's project is a 404. A set
    not yet persisted shows its run's status (``running``, ``failed``, ...), not
    ``submitted`` (``client.design.true_statuses``)."""
    if not await to_thread.run_sync(owns_project, sessions, caller, project):
        raise ApiError(404, "not_found", f"no project {project!r}")
    rows = await to_thread.run_sync(cases.decision_sets, sessions, project)
    rows = await design_client.true_statuses(client, sessions, project, rows)
    return DecisionSetList(
        project_id=project, decision_sets=[DecisionSetSummary.model_validate(r) for r in rows]
    )


@dataclass(frozen=True)
class Repo:
    """The path's decision set (one the caller may read) and where its repository is."""

    project: str
    ds: str
    sessions: sessionmaker[Session]
    artifacts: ArtifactStore
    repos: Path


async def repo(request: Request, it: SeenDep, artifacts: ArtifactsDep) -> Repo:
    repos: Path = request.app.state.settings.design_repos_dir
    return Repo(it.project, it.ds, it.sessions, artifacts, repos)


RepoDep = Annotated[Repo, Depends(repo)]


async def _view(r: Repo) -> design_store.RepositoryView:
    with refusals(r.project, r.ds):
        return await to_thread.run_sync(
            files.repository, r.sessions, r.artifacts, r.repos, r.project, r.ds
        )


async def _diff(r: Repo) -> design_store.RepositoryDiff:
    with refusals(r.project, r.ds):
        return await to_thread.run_sync(
            files.repository_diff, r.sessions, r.artifacts, r.repos, r.project, r.ds
        )


@router.get("/decision-sets/{decision_set_id}/files", response_model=FileList)
async def list_files(decision_set_id: str, r: RepoDep) -> FileList:
    """The generated repository's files (as the archive holds them), by path; 404 when
    the decision set has no repository."""
    view = await _view(r)
    listed = await to_thread.run_sync(view.files)
    parent = await to_thread.run_sync(files.parent_of, r.sessions, r.project, r.ds)
    return FileList(
        decision_set_id=r.ds,
        previous_decision_set=parent,
        files=[FileEntry(path=p, size_bytes=n) for p, n in listed.items()],
    )


@router.get("/decision-sets/{decision_set_id}/files/{path:path}", response_model=FileText)
async def read_file(decision_set_id: str, path: str, r: RepoDep) -> FileText:
    """One file's text; 404 for a path the repository does not hold."""
    view = await _view(r)
    with refusals(r.project, r.ds):
        size, text = await to_thread.run_sync(files.file_text, view, path)
    return FileText(path=path, size_bytes=size, text=text)


@router.get("/decision-sets/{decision_set_id}/diff", response_model=DiffList)
async def list_changes(decision_set_id: str, r: RepoDep) -> DiffList:
    """The files added, removed or modified against the previous decision set's
    repository (every file is added when the previous one was planned only), from the
    project's git history."""
    diff = await _diff(r)
    changes = await to_thread.run_sync(diff.changes)
    return DiffList(
        decision_set_id=r.ds,
        previous_decision_set=diff.previous,
        previous_has_files=diff.previous_has_files,
        changes=[FileChange(path=p, status=s) for p, s in changes.items()],
    )


@router.get("/decision-sets/{decision_set_id}/diff/{path:path}", response_model=FileDiff)
async def file_diff(decision_set_id: str, path: str, r: RepoDep) -> FileDiff:
    """One file's unified diff against the previous decision set's repository."""
    diff = await _diff(r)
    with refusals(r.project, r.ds):
        status, text = await to_thread.run_sync(files.file_diff, diff, r.ds, path)
    return FileDiff(path=path, previous_decision_set=diff.previous, status=status, diff=text)


# --- the archive -------------------------------------------------------------------------


def _download_key(settings: Settings) -> bytes:
    # The webhook secret is the API's one configured secret (check_secrets refuses its
    # default outside dev); a purpose label keeps link signatures apart from webhook ones.
    return signed_urls.derive_key(settings.webhook_secret.get_secret_value())


def _artifact_path(digest: str) -> str:
    return f"/design/artifacts/{digest}"


@router.get("/decision-sets/{decision_set_id}/download", response_model=DownloadLink)
async def download_link(decision_set_id: str, request: Request, it: SeenDep) -> DownloadLink:
    """A signed URL of the repository archive, valid ``DOWNLOAD_TTL_S`` seconds; 404 when
    the decision set has no archive (planned with ``generate=false``)."""
    with refusals(it.project, it.ds):
        archive = await to_thread.run_sync(files.archive_of, it.sessions, it.project, it.ds)
    expires = int(time.time()) + DOWNLOAD_TTL_S
    path = signed_urls.signed_path(
        _download_key(request.app.state.settings), _artifact_path(archive.digest), expires
    )
    return DownloadLink(
        url=str(request.base_url).rstrip("/") + path,
        expires_at=datetime.fromtimestamp(expires, UTC),
        digest=archive.digest,
        size_bytes=archive.size_bytes,
        validation=archive.validation,
        failed_validators=archive.failed_validators,
    )


@router.get(
    "/artifacts/{digest}",
    response_class=Response,
    responses={200: {"content": {"application/zip": {}}, "description": "the archive"}},
)
async def signed_download(
    digest: str,
    request: Request,
    sessions: SessionsDep,
    artifacts: ArtifactsDep,
    expires: int | None = None,
    sig: str | None = None,
) -> Response:
    """The archive a signed URL names; no bearer token. A missing, expired or tampered
    signature is 403."""
    key = _download_key(request.app.state.settings)
    if (
        expires is None
        or sig is None
        or not signed_urls.verify(key, _artifact_path(digest), expires, sig, now=time.time())
    ):
        raise ApiError(403, "forbidden", "the download link is invalid or expired")
    with refusals():
        data, archive = await to_thread.run_sync(files.archive_bytes, sessions, artifacts, digest)
    failing = archive.validation == "failed"
    name = digest.split(":", 1)[-1][:12] + ("-validation-failed" if failing else "")
    headers = {
        "Content-Disposition": f'attachment; filename="design-{name}.zip"',
        # The archive stays downloadable when its tree failed a validator, marked so.
        "X-Keel-Validation": archive.validation,
    }
    if failing:
        headers["X-Keel-Failed-Validators"] = ",".join(archive.failed_validators)
    return Response(data, media_type="application/zip", headers=headers)
