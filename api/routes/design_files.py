"""What the console reads of a design project besides ``api.routes.design``: a project's
decision sets, the generated repository's files, one file's text, and a file's unified
diff against the previous decision set.

Access is that of the design routes: a project's decision sets are read by its owner and
``admin``; to anyone else the project or decision set is a 404, as if absent. The files
come from the project's git history (``store.design.repository_view``: the decision set's
commit, without the ``plan.md`` the commit adds), which holds exactly what the download
holds (the generated files, the validators' output and ``reports/``); the diffs are git's
between two decision sets' trees (``store.design.repository_diff``).
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from anyio import to_thread
from fastapi import APIRouter, Request
from pydantic import BaseModel

from api.deps import ArtifactsDep, CallerDep, ClientDep, SessionsDep
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.design import owns_project, project_of
from client import design as design_client
from store import design as design_store
from store.artifacts import ArtifactStore

router = APIRouter(prefix="/design", tags=["design"], responses=ERROR_RESPONSES)

#: Larger files are listed but their text is not served (the console is no editor).
MAX_TEXT_BYTES = 512 * 1024


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
    rows = await to_thread.run_sync(design_store.decision_sets_of, sessions, project)
    rows = await design_client.true_statuses(client, sessions, project, rows)
    return DecisionSetList(
        project_id=project, decision_sets=[DecisionSetSummary.model_validate(r) for r in rows]
    )


async def _repository(
    request: Request, client: Any, sessions: Any, artifacts: ArtifactStore, caller: Any, ds: str
) -> tuple[str, design_store.RepositoryView]:
    project = await project_of(client, sessions, caller, ds)
    repos: Path = request.app.state.settings.design_repos_dir
    view = await to_thread.run_sync(
        design_store.repository_view, sessions, artifacts, repos, project, ds
    )
    if view is None:
        raise ApiError(404, "not_found", f"decision set {ds!r} has no repository")
    return project, view


def _parent(sessions: Any, project: str, ds: str) -> str | None:
    row = design_store.decision_set(sessions, project, ds)
    return row["parent_id"] if row is not None else None


def _checked_size(path: str, size: int | None) -> None:
    if size is not None and size > MAX_TEXT_BYTES:
        raise ApiError(413, "too_large", f"{path!r} is {size} bytes; download the archive")


def _text(path: str, data: bytes) -> str:
    _checked_size(path, len(data))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(415, "not_text", f"{path!r} is not UTF-8 text") from None


@router.get("/decision-sets/{decision_set_id}/files", response_model=FileList)
async def list_files(
    decision_set_id: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileList:
    """The generated repository's files (as the archive holds them), by path; 404 when
    the decision set has no repository."""
    project, view = await _repository(request, client, sessions, artifacts, caller, decision_set_id)
    files = await to_thread.run_sync(view.files)
    parent = await to_thread.run_sync(_parent, sessions, project, decision_set_id)
    return FileList(
        decision_set_id=decision_set_id,
        previous_decision_set=parent,
        files=[FileEntry(path=p, size_bytes=n) for p, n in files.items()],
    )


@router.get("/decision-sets/{decision_set_id}/files/{path:path}", response_model=FileText)
async def read_file(
    decision_set_id: str,
    path: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileText:
    """One file's text; 404 for a path the repository does not hold."""
    _, view = await _repository(request, client, sessions, artifacts, caller, decision_set_id)
    size = (await to_thread.run_sync(view.files)).get(path)
    if size is None:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r}")
    _checked_size(path, size)
    data = await to_thread.run_sync(view.read, path)
    if data is None:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r}")
    return FileText(path=path, size_bytes=len(data), text=_text(path, data))


async def _diff(
    request: Request, client: Any, sessions: Any, artifacts: ArtifactStore, caller: Any, ds: str
) -> design_store.RepositoryDiff:
    """The decision set's repository against its previous one's (the same project, which
    the caller may read); 404 without a repository."""
    project = await project_of(client, sessions, caller, ds)
    repos: Path = request.app.state.settings.design_repos_dir
    found = await to_thread.run_sync(
        lambda: design_store.repository_diff(sessions, artifacts, repos, project, ds)
    )
    if found is None:
        raise ApiError(404, "not_found", f"decision set {ds!r} has no repository")
    return found


@router.get("/decision-sets/{decision_set_id}/diff", response_model=DiffList)
async def list_changes(
    decision_set_id: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> DiffList:
    """The files added, removed or modified against the previous decision set's
    repository (every file is added when the previous one was planned only), from the
    project's git history."""
    diff = await _diff(request, client, sessions, artifacts, caller, decision_set_id)
    changes = await to_thread.run_sync(diff.changes)
    return DiffList(
        decision_set_id=decision_set_id,
        previous_decision_set=diff.previous,
        previous_has_files=diff.previous_has_files,
        changes=[FileChange(path=p, status=s) for p, s in changes.items()],
    )


@router.get("/decision-sets/{decision_set_id}/diff/{path:path}", response_model=FileDiff)
async def file_diff(
    decision_set_id: str,
    path: str,
    request: Request,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileDiff:
    """One file's unified diff against the previous decision set's repository."""
    diff = await _diff(request, client, sessions, artifacts, caller, decision_set_id)
    before, now = await to_thread.run_sync(diff.sizes, path)
    if before is None and now is None:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r} or before")
    _checked_size(path, before)
    _checked_size(path, now)
    found = await to_thread.run_sync(diff.file_diff, path)
    if found is None:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r} or before")
    status, text = found
    return FileDiff(path=path, previous_decision_set=diff.previous, status=status, diff=text)
