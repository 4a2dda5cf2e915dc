"""What the console reads of a design project besides ``api.routes.design``: a project's
decision sets, the generated repository's files, one file's text, and a file's unified
diff against the previous decision set.

Access is that of the design routes: a project's decision sets are read by its owner and
``admin``; to anyone else the project or decision set is a 404, as if absent. The files
come from the decision set's stored archive (the generated files, the validators' output
and ``reports/``), so what the console shows is exactly what the download holds.
"""

from __future__ import annotations

import difflib
import io
import zipfile
from datetime import datetime
from typing import Any, Literal

from anyio import to_thread
from fastapi import APIRouter
from pydantic import BaseModel

from api.deps import ArtifactsDep, CallerDep, ClientDep, SessionsDep
from api.errors import ERROR_RESPONSES, ApiError
from api.routes.design import owns_project, project_of
from client import design as design_client
from store import design as design_store
from store.artifacts import ArtifactNotFound, ArtifactStore

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


def _archive_files(
    sessions: Any, artifacts: ArtifactStore, project: str, ds: str
) -> dict[str, bytes] | None:
    """The decision set's archive as ``{path: bytes}``; None when it has none."""
    rows = design_store.artifacts_of(sessions, project, ds)
    archive = next((a for a in rows if a["kind"] == "archive"), None)
    if archive is None:
        return None
    try:
        data = artifacts.get_bytes(archive["digest"])
    except ArtifactNotFound:
        return None
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}


def _parent(sessions: Any, project: str, ds: str) -> str | None:
    row = design_store.decision_set(sessions, project, ds)
    return row["parent_id"] if row is not None else None


async def _files_of(
    client: Any, sessions: Any, artifacts: ArtifactStore, caller: Any, ds: str
) -> tuple[str, dict[str, bytes]]:
    project = await project_of(client, sessions, caller, ds)
    files = await to_thread.run_sync(_archive_files, sessions, artifacts, project, ds)
    if files is None:
        raise ApiError(404, "not_found", f"decision set {ds!r} has no repository")
    return project, files


def _text(path: str, data: bytes) -> str:
    if len(data) > MAX_TEXT_BYTES:
        raise ApiError(413, "too_large", f"{path!r} is {len(data)} bytes; download the archive")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError(415, "not_text", f"{path!r} is not UTF-8 text") from None


@router.get("/decision-sets/{decision_set_id}/files", response_model=FileList)
async def list_files(
    decision_set_id: str,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileList:
    """The generated repository's files (as the archive holds them), by path; 404 when
    the decision set has no repository."""
    project, files = await _files_of(client, sessions, artifacts, caller, decision_set_id)
    parent = await to_thread.run_sync(_parent, sessions, project, decision_set_id)
    return FileList(
        decision_set_id=decision_set_id,
        previous_decision_set=parent,
        files=[FileEntry(path=p, size_bytes=len(files[p])) for p in sorted(files)],
    )


@router.get("/decision-sets/{decision_set_id}/files/{path:path}", response_model=FileText)
async def read_file(
    decision_set_id: str,
    path: str,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileText:
    """One file's text; 404 for a path the repository does not hold."""
    _, files = await _files_of(client, sessions, artifacts, caller, decision_set_id)
    if path not in files:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r}")
    return FileText(path=path, size_bytes=len(files[path]), text=_text(path, files[path]))


async def _both(
    client: Any, sessions: Any, artifacts: ArtifactStore, caller: Any, ds: str
) -> tuple[str | None, dict[str, bytes], dict[str, bytes] | None]:
    """(previous id, this repository, the previous one's or None when it has none)."""
    project, files = await _files_of(client, sessions, artifacts, caller, ds)
    parent = await to_thread.run_sync(_parent, sessions, project, ds)
    old = None
    if parent is not None:
        # The parent belongs to the same project, which the caller may read.
        old = await to_thread.run_sync(_archive_files, sessions, artifacts, project, parent)
    return parent, files, old


@router.get("/decision-sets/{decision_set_id}/diff", response_model=DiffList)
async def list_changes(
    decision_set_id: str,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> DiffList:
    """The files added, removed or modified against the previous decision set's
    repository (every file is added when the previous one was planned only)."""
    parent, files, old = await _both(client, sessions, artifacts, caller, decision_set_id)
    before = old or {}
    changes = [
        FileChange(
            path=p,
            status="added" if p not in before else "removed" if p not in files else "modified",
        )
        for p in sorted(set(files) | set(before))
        if files.get(p) != before.get(p)
    ]
    return DiffList(
        decision_set_id=decision_set_id,
        previous_decision_set=parent,
        previous_has_files=old is not None,
        changes=changes,
    )


@router.get("/decision-sets/{decision_set_id}/diff/{path:path}", response_model=FileDiff)
async def file_diff(
    decision_set_id: str,
    path: str,
    client: ClientDep,
    sessions: SessionsDep,
    caller: CallerDep,
    artifacts: ArtifactsDep,
) -> FileDiff:
    """One file's unified diff against the previous decision set's repository."""
    parent, files, old = await _both(client, sessions, artifacts, caller, decision_set_id)
    before = old or {}
    if path not in files and path not in before:
        raise ApiError(404, "not_found", f"no file {path!r} in {decision_set_id!r} or before")
    a = _text(path, before[path]) if path in before else ""
    b = _text(path, files[path]) if path in files else ""
    status: Literal["added", "removed", "modified", "unchanged"] = (
        "added" if path not in before else "removed" if path not in files else
        "unchanged" if a == b else "modified"
    )  # fmt: skip
    lines = difflib.unified_diff(
        a.splitlines(keepends=True),
        b.splitlines(keepends=True),
        fromfile=f"{parent or 'nothing'}/{path}" if path in before else "/dev/null",
        tofile=f"{decision_set_id}/{path}" if path in files else "/dev/null",
    )
    return FileDiff(path=path, previous_decision_set=parent, status=status, diff="".join(lines))
