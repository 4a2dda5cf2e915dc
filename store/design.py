"""Design pipelines in SQL (plan §7): one ``persist`` per decision set run, reads for the
next iteration, the API and tests.

``persist`` is idempotent by the run's persist key: a retried or replayed write finds its
own key on the decision set and changes nothing. A different run updating the same
decision set takes the optimistic lock: it names the version it read, and loses (raises
:class:`VersionConflict`) when another writer bumped it first.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from keel.design.critics import CostEstimate
from keel.design.steps import (
    EVENT_RUN_COMPLETE,
    AgentRun,
    DesignEvent,
    PersistInput,
    PreviousState,
    event_key,
    event_seq,
)
from store import design_git
from store.artifacts import ArtifactNotFound, ArtifactStore
from store.models import (
    AgentRunRow,
    ApprovalRow,
    CostEstimateRow,
    DecisionSetRow,
    DesignArtifactRow,
    DesignEventRow,
    DesignProjectRow,
)
from store.records import _insert_ignoring_conflict

#: The status of a decision set noted by :func:`submit_decision_set` whose pipeline has
#: not persisted yet.
SUBMITTED = "submitted"


class VersionConflict(RuntimeError):
    """Another writer updated the decision set since it was read."""


class NotYours(PermissionError):
    """The project exists and belongs to someone else."""


class DecisionSetExists(ValueError):
    """The project already has a decision set of that id."""


def create_project(sm: sessionmaker[Session], project: str, *, owner: str, name: str = "") -> bool:
    """Create the project for ``owner``; True if created, False if ``owner`` has it already.

    Raises:
        NotYours: another owner has a project of that id.
    """
    with sm.begin() as s:
        created = _insert_ignoring_conflict(
            s,
            DesignProjectRow,
            {
                "id": project,
                "name": name or project,
                "owner_id": owner,
                "created_at": datetime.now(UTC),
            },
            ["id"],
        )
        if created:
            return True
        row = s.get(DesignProjectRow, project)
        if row is None or row.owner_id != owner:
            raise NotYours(f"project {project!r} belongs to another owner")
        return False


def project_row(sm: sessionmaker[Session], project: str) -> dict[str, Any] | None:
    """The project's row as a dict; None if there is none."""
    with sm() as s:
        row = s.get(DesignProjectRow, project)
        if row is None:
            return None
        return {c.key: getattr(row, c.key) for c in DesignProjectRow.__table__.columns}


def projects_of(sm: sessionmaker[Session], owner: str | None) -> list[dict[str, Any]]:
    """The projects of ``owner`` (None: every project), newest first."""
    with sm() as s:
        q = select(DesignProjectRow).order_by(DesignProjectRow.created_at.desc())
        if owner is not None:
            q = q.where(DesignProjectRow.owner_id == owner)
        return [
            {c.key: getattr(r, c.key) for c in DesignProjectRow.__table__.columns}
            for r in s.scalars(q).all()
        ]


def submit_decision_set(
    sm: sessionmaker[Session], project: str, decision_set: str, *, parent: str | None = None
) -> None:
    """Note a decision set as submitted (version 0) before its pipeline starts, so readers
    find its project at once; the pipeline's persist makes it version 1.

    Raises:
        DecisionSetExists: the project has that decision set already.
    """
    now = datetime.now(UTC)
    with sm.begin() as s:
        inserted = _insert_ignoring_conflict(
            s,
            DecisionSetRow,
            {
                "id": decision_set,
                "project_id": project,
                "parent_id": parent,
                "version": 0,
                "status": SUBMITTED,
                "constraints_json": {},
                "plan_json": None,
                "summary_md": "",
                "persist_key": "",
                "created_at": now,
                "updated_at": now,
            },
            ["id", "project_id"],
        )
    if not inserted:
        raise DecisionSetExists(f"project {project!r} has a decision set {decision_set!r}")


def note_run_ended(sm: sessionmaker[Session], project: str, decision_set: str, status: str) -> bool:
    """Write how a decision set's run ended (``failed``, ``terminated``, ...) on its row if
    the row is still only submitted: a run that ends without persisting never writes it
    itself. True if the row changed."""
    with sm.begin() as s:
        changed = s.execute(
            update(DecisionSetRow)
            .where(
                DecisionSetRow.id == decision_set,
                DecisionSetRow.project_id == project,
                DecisionSetRow.version == 0,
                DecisionSetRow.status == SUBMITTED,
            )
            .values(status=status, updated_at=datetime.now(UTC))
        )
        return bool(getattr(changed, "rowcount", 0))


def projects_with(sm: sessionmaker[Session], decision_set: str) -> list[str]:
    """The projects that have a decision set of that id (ids are per project)."""
    with sm() as s:
        return list(
            s.scalars(
                select(DecisionSetRow.project_id)
                .where(DecisionSetRow.id == decision_set)
                .order_by(DecisionSetRow.project_id)
            ).all()
        )


def decision_sets_of(sm: sessionmaker[Session], project: str) -> list[dict[str, Any]]:
    """The project's decision sets, newest first (id, parent, version, status, times)."""
    with sm() as s:
        rows = s.scalars(
            select(DecisionSetRow)
            .where(DecisionSetRow.project_id == project)
            .order_by(DecisionSetRow.created_at.desc(), DecisionSetRow.id)
        ).all()
        return [
            {
                "id": r.id,
                "parent_id": r.parent_id,
                "version": r.version,
                "status": r.status,
                "created_at": r.created_at,
                "updated_at": r.updated_at,
            }
            for r in rows
        ]


def persist(
    sm: sessionmaker[Session],
    inp: PersistInput,
    *,
    archive_digest: str | None,
    archive_size: int | None = None,
    git_commit: str | None = None,
) -> tuple[int, int]:
    """Write the decision set of ``inp`` with its rows; return (version, events inserted).

    Raises:
        VersionConflict: the decision set was updated by another run meanwhile.
    """
    now = datetime.now(UTC)
    with sm.begin() as s:
        _insert_ignoring_conflict(
            s,
            DesignProjectRow,
            {"id": inp.project, "name": inp.project, "owner_id": inp.owner, "created_at": now},
            ["id"],
        )
        row = s.get(DecisionSetRow, (inp.decision_set, inp.project), populate_existing=True)
        values: dict[str, Any] = {
            "parent_id": inp.parent,
            "status": inp.status,
            "constraints_json": inp.constraints.model_dump(mode="json"),
            "plan_json": inp.plan,
            "summary_md": inp.summary_md,
            "persist_key": inp.key,
            "updated_at": now,
        }
        if row is not None and row.persist_key == inp.key:
            return row.version, 0
        if row is None:
            version = 1
            inserted = _insert_ignoring_conflict(
                s,
                DecisionSetRow,
                {
                    **values,
                    "id": inp.decision_set,
                    "project_id": inp.project,
                    "version": 1,
                    "created_at": now,
                },
                ["id", "project_id"],
            )
            if not inserted:
                raise VersionConflict(f"decision set {inp.decision_set} was created meanwhile")
        else:
            version = bump_version(s, inp.project, inp.decision_set, row.version, values)
        ds = {"decision_set_id": inp.decision_set, "project_id": inp.project}
        s.execute(
            delete(DesignArtifactRow).where(
                DesignArtifactRow.decision_set_id == inp.decision_set,
                DesignArtifactRow.project_id == inp.project,
            )
        )
        for path, digest in sorted(inp.file_digests.items()):
            s.add(DesignArtifactRow(**ds, path=path, digest=digest, kind="file", created_at=now))
        if archive_digest is not None:
            s.add(
                DesignArtifactRow(
                    **ds,
                    path="repository.zip",
                    digest=archive_digest,
                    kind="archive",
                    size_bytes=archive_size,
                    created_at=now,
                )
            )
        for run in inp.agent_runs:
            _insert_agent_run(s, inp.project, inp.decision_set, run, now)
        for a in inp.approvals:
            _insert_ignoring_conflict(
                s,
                ApprovalRow,
                {**ds, **a.model_dump(), "created_at": now},
                ["decision_set_id", "project_id", "gate"],
            )
        if inp.cost is not None:
            s.execute(
                delete(CostEstimateRow).where(
                    CostEstimateRow.decision_set_id == inp.decision_set,
                    CostEstimateRow.project_id == inp.project,
                )
            )
            s.add(
                CostEstimateRow(
                    **ds,
                    monthly_usd=inp.cost.monthly_usd,
                    delta_vs_prev_usd=inp.cost.delta_vs_prev_usd,
                    breakdown_json=inp.cost.model_dump(mode="json"),
                    method=inp.cost.method[:200],
                    created_at=now,
                )
            )
        done = completed_event(inp, version, archive_digest, now, git_commit)
        count = 0
        for e in [*inp.events, done]:
            count += _insert_ignoring_conflict(
                s,
                DesignEventRow,
                {
                    **ds,
                    "event_key": e.key,
                    "type": e.type,
                    "payload_json": e.payload,
                    "created_at": now,
                },
                ["project_id", "decision_set_id", "event_key"],
            )
        return version, count


def record_agent_run(sm: sessionmaker[Session], project: str, ds: str, run: AgentRun) -> bool:
    """Write one node's ``agent_runs`` row now (an activity that paid for a model); the
    row persist writes later under the same key is then ignored. True if inserted."""
    with sm.begin() as s:
        return _insert_agent_run(s, project, ds, run, datetime.now(UTC))


def _insert_agent_run(s: Session, project: str, ds: str, run: AgentRun, now: datetime) -> bool:
    """One ``agent_runs`` row unless its key is there already; True if inserted."""
    return _insert_ignoring_conflict(
        s,
        AgentRunRow,
        {
            "decision_set_id": ds,
            "project_id": project,
            "idem_key": run.key,
            "agent": run.agent,
            "provider": run.provider,
            "model": run.model,
            "input_digest": run.input_digest,
            "output_json": run.output,
            "tokens_total": run.tokens_total,
            "latency_ms": run.latency_ms,
            "ok": run.ok,
            "created_at": now,
        },
        ["idem_key"],
    )


def completed_event(
    inp: PersistInput,
    version: int,
    archive_digest: str | None,
    now: datetime,
    git_commit: str | None = None,
) -> DesignEvent:
    """The ``run-complete`` event, always the run's last (plan §22.3)."""
    return DesignEvent(
        key=event_key(len(inp.events), EVENT_RUN_COMPLETE),
        type=EVENT_RUN_COMPLETE,
        payload={
            "project_id": inp.project,
            "decision_set_id": inp.decision_set,
            "node_name": "diff_and_persist",
            "ts": now.isoformat(),
            "version": version,
            "status": inp.status,
            "archive_digest": archive_digest,
            "git_commit": git_commit,
        },
    )


def version_after(sm: sessionmaker[Session], project: str, ds: str, key: str) -> int:
    """The version :func:`persist` with ``key`` will give the decision set, as of now
    (the commit message names it before the rows are written)."""
    with sm() as s:
        row = s.get(DecisionSetRow, (ds, project))
        if row is None:
            return 1
        return row.version if row.persist_key == key else row.version + 1


def bump_version(
    session: Session, project: str, decision_set: str, read_version: int, values: dict[str, Any]
) -> int:
    """Update the decision set only if it is still at ``read_version``; the new version.

    Raises:
        VersionConflict: another writer bumped it since it was read.
    """
    result = session.execute(
        update(DecisionSetRow)
        .where(
            DecisionSetRow.id == decision_set,
            DecisionSetRow.project_id == project,
            DecisionSetRow.version == read_version,
        )
        .values(**values, version=read_version + 1)
    )
    if result.rowcount != 1:  # type: ignore[attr-defined]
        raise VersionConflict(f"decision set {decision_set} is past version {read_version}")
    return read_version + 1


def load_previous(
    sm: sessionmaker[Session], project: str, decision_set: str
) -> PreviousState | None:
    """A stored decision set as the next iteration starts from it; None if absent."""
    with sm() as s:
        row = s.get(DecisionSetRow, (decision_set, project))
        if row is None or row.version == 0:
            # Version 0 is only submitted: nothing to start an iteration from.
            return None
        cost = s.get(CostEstimateRow, (decision_set, project))
        files = s.execute(
            select(DesignArtifactRow.path, DesignArtifactRow.digest).where(
                DesignArtifactRow.decision_set_id == decision_set,
                DesignArtifactRow.project_id == project,
                DesignArtifactRow.kind == "file",
            )
        ).all()
        return PreviousState(
            decision_set=decision_set,
            status=row.status,
            constraints=row.constraints_json,
            plan=row.plan_json,
            cost=CostEstimate.model_validate(cost.breakdown_json) if cost else None,
            file_digests={p: d for p, d in files},
        )


def decision_set(sm: sessionmaker[Session], project: str, ds: str) -> dict[str, Any] | None:
    """The decision set row as a dict (the API's and tests' view)."""
    with sm() as s:
        row = s.get(DecisionSetRow, (ds, project))
        if row is None:
            return None
        return {c.key: getattr(row, c.key) for c in DecisionSetRow.__table__.columns}


def stored_event(sm: sessionmaker[Session], project: str, ds: str, key: str) -> DesignEvent | None:
    """The event ``key`` of a decision set as written; None if absent."""
    with sm() as s:
        row = s.scalars(
            select(DesignEventRow).where(
                DesignEventRow.project_id == project,
                DesignEventRow.decision_set_id == ds,
                DesignEventRow.event_key == key,
            )
        ).one_or_none()
        if row is None:
            return None
        return DesignEvent(key=row.event_key, type=row.type, payload=row.payload_json)


def list_events(sm: sessionmaker[Session], project: str, ds: str) -> Sequence[dict[str, Any]]:
    """The decision set's events in the order they were written."""
    with sm() as s:
        rows = s.scalars(
            select(DesignEventRow)
            .where(DesignEventRow.project_id == project, DesignEventRow.decision_set_id == ds)
            .order_by(DesignEventRow.id)
        ).all()
        return [
            {
                "id": r.id,
                "seq": event_seq(r.event_key),
                "key": r.event_key,
                "type": r.type,
                "payload": r.payload_json,
            }
            for r in rows
        ]


def agent_runs_of(sm: sessionmaker[Session], project: str, ds: str) -> list[tuple[str, str, str]]:
    """``(agent, provider, model)`` of every ``agent_runs`` row of one decision set, in the
    order they were written."""
    with sm() as s:
        rows = s.execute(
            select(AgentRunRow.agent, AgentRunRow.provider, AgentRunRow.model)
            .where(AgentRunRow.project_id == project, AgentRunRow.decision_set_id == ds)
            .order_by(AgentRunRow.created_at, AgentRunRow.idem_key)
        ).all()
    return [(agent, provider, model) for agent, provider, model in rows]


def count_rows(sm: sessionmaker[Session], project: str, ds: str) -> dict[str, int]:
    """Rows per design table for one decision set (tests, the CLI's show)."""
    out: dict[str, int] = {}
    with sm() as s:
        for name, model in (
            ("artifacts", DesignArtifactRow),
            ("agent_runs", AgentRunRow),
            ("approvals", ApprovalRow),
            ("cost_estimates", CostEstimateRow),
            ("events", DesignEventRow),
        ):
            out[name] = (
                s.scalar(
                    select(func.count())
                    .select_from(model)
                    .where(
                        model.project_id == project,  # type: ignore[attr-defined]
                        model.decision_set_id == ds,  # type: ignore[attr-defined]
                    )
                )
                or 0
            )
    return out


def artifacts_of(sm: sessionmaker[Session], project: str, ds: str) -> list[dict[str, Any]]:
    """The decision set's artifact rows (files and the archive), by path."""
    with sm() as s:
        rows = s.scalars(
            select(DesignArtifactRow)
            .where(DesignArtifactRow.project_id == project, DesignArtifactRow.decision_set_id == ds)
            .order_by(DesignArtifactRow.path)
        ).all()
        return [
            {"path": r.path, "digest": r.digest, "kind": r.kind, "size_bytes": r.size_bytes}
            for r in rows
        ]


def is_archive(sm: sessionmaker[Session], digest: str) -> bool:
    """Whether ``digest`` is the archive of some decision set (what download links serve)."""
    with sm() as s:
        found = s.scalars(
            select(DesignArtifactRow.digest)
            .where(DesignArtifactRow.digest == digest, DesignArtifactRow.kind == "archive")
            .limit(1)
        ).first()
        return found is not None


def failing_validators(sm: sessionmaker[Session], project: str, ds: str) -> list[str] | None:
    """The validators that failed on the decision set's tree, from its last ``validation``
    event; None when no validators ran (no repository was generated)."""
    with sm() as s:
        payload = s.scalars(
            select(DesignEventRow.payload_json)
            .where(
                DesignEventRow.project_id == project,
                DesignEventRow.decision_set_id == ds,
                DesignEventRow.type == "validation",
            )
            .order_by(DesignEventRow.id.desc())
            .limit(1)
        ).first()
    return None if payload is None else _failed(payload)


def _failed(validation: dict[str, Any]) -> list[str]:
    """The validators a ``validation`` event's summary names as failed, sorted."""
    summary = validation.get("summary") or {}
    return sorted(name for name, status in summary.items() if status == "failed")


def archive_failing_validators(sm: sessionmaker[Session], digest: str) -> list[str]:
    """The validators that failed on the tree of archive ``digest`` (any decision set that
    has it); empty when every one passed or ran none."""
    with sm() as s:
        owners = s.execute(
            select(DesignArtifactRow.project_id, DesignArtifactRow.decision_set_id).where(
                DesignArtifactRow.digest == digest, DesignArtifactRow.kind == "archive"
            )
        ).all()
    failed: set[str] = set()
    for project, ds in owners:
        failed.update(failing_validators(sm, project, ds) or [])
    return sorted(failed)


def cost_of(sm: sessionmaker[Session], project: str, ds: str) -> dict[str, Any] | None:
    """The stored cost estimate (the critic's whole estimate); None if there is none."""
    with sm() as s:
        row = s.get(CostEstimateRow, (ds, project))
        return dict(row.breakdown_json) if row is not None else None


# --- the read model: one view of a stored decision set, for the API and the CLI ----------

#: What a decision set's commit adds to its repository: the Change Summary and Design
#: Rationale (the row's ``summary_md``), not a file of the download.
COMMIT_ONLY = frozenset({"plan.md"})


@dataclass(frozen=True)
class StoredDecisionSet:
    """What the store holds of one decision set: its row, the last stored event of each
    type, its cost estimate and artifact rows (``row`` None: no such decision set)."""

    project: str
    decision_set: str
    row: dict[str, Any] | None
    last: dict[str, dict[str, Any]]
    cost: dict[str, Any] | None
    artifacts: list[dict[str, Any]]

    @property
    def archive(self) -> dict[str, Any] | None:
        """The repository archive's artifact row; None: no repository."""
        return next((a for a in self.artifacts if a["kind"] == "archive"), None)

    @property
    def validation(self) -> dict[str, str] | None:
        """``validator -> status`` of the last validation; None when none ran."""
        found = self.last.get("validation")
        return None if found is None else dict(found.get("summary") or {})

    @property
    def failed_validators(self) -> list[str] | None:
        """The validators that failed, sorted; None when none ran (as
        :func:`failing_validators`)."""
        found = self.last.get("validation")
        return None if found is None else _failed(found)


def stored_view(sm: sessionmaker[Session], project: str, ds: str) -> StoredDecisionSet:
    """One read of a decision set's stored state (the API's ``GET
    /design/decision-sets/{ds}`` and ``design show``)."""
    return StoredDecisionSet(
        project=project,
        decision_set=ds,
        row=decision_set(sm, project, ds),
        last={e["type"]: e["payload"] for e in list_events(sm, project, ds)},
        cost=cost_of(sm, project, ds),
        artifacts=artifacts_of(sm, project, ds),
    )


@dataclass(frozen=True)
class RepositoryView:
    """A decision set's generated repository as the project's git history holds it: the
    tree of its commit (``from_git``), or, for a set recorded before that history, a tree
    made of its archive's files (objects only: no commit, no tag)."""

    decision_set: str
    repo: Path
    tree: str
    from_git: bool

    def files(self) -> dict[str, int]:
        """``path -> size`` of the repository's files (what the download holds)."""
        listed = design_git.list_tree(self.repo, self.tree)
        return {p: n for p, n in sorted(listed.items()) if not self._commit_only(p)}

    def read(self, path: str) -> bytes | None:
        """One file's content; None for a path the repository does not hold."""
        if self._commit_only(path):
            return None
        return design_git.read_blobs(self.repo, self.tree, [path]).get(path)

    def texts(self, suffix: str = "") -> dict[str, str]:
        """The text of every file whose path ends with ``suffix``."""
        paths = [p for p in self.files() if p.endswith(suffix)]
        blobs = design_git.read_blobs(self.repo, self.tree, paths)
        return {p: b.decode("utf-8", errors="replace") for p, b in blobs.items()}

    def _commit_only(self, path: str) -> bool:
        return self.from_git and path in COMMIT_ONLY


def repository_view(
    sm: sessionmaker[Session], artifacts: ArtifactStore, repos_dir: Path, project: str, ds: str
) -> RepositoryView | None:
    """The decision set's repository; None when it has none (planned only, not finished,
    or an archive the artifact store no longer holds)."""
    rows = artifacts_of(sm, project, ds)
    archive = next((a for a in rows if a["kind"] == "archive"), None)
    if archive is None:
        return None
    repo = design_git.repo_path(repos_dir, project)
    tree = design_git.tree_of(repo, ds)
    if tree is not None:
        return RepositoryView(ds, repo, tree, from_git=True)
    # Recorded before the project's git history: its archive, as a tree git can diff.
    try:
        data = artifacts.get_bytes(archive["digest"])
    except ArtifactNotFound:
        return None
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        files = {
            name: zf.read(name).decode("utf-8", errors="replace")
            for name in zf.namelist()
            if not name.endswith("/")
        }
    repo = design_git.ensure_repo(repos_dir, project)
    return RepositoryView(ds, repo, design_git.write_tree(repo, files), from_git=False)


FileStatus = Literal["added", "removed", "modified", "unchanged"]


@dataclass(frozen=True)
class RepositoryDiff:
    """A decision set's repository against an earlier one's (by default its previous
    decision set's; every file added when that one has no repository)."""

    new: RepositoryView
    previous: str | None
    old: RepositoryView | None

    @property
    def previous_has_files(self) -> bool:
        return self.old is not None

    @property
    def _old_tree(self) -> str:
        return self.old.tree if self.old is not None else design_git.EMPTY_TREE

    def _hidden(self, path: str) -> bool:
        return path in COMMIT_ONLY and (
            self.new.from_git or (self.old is not None and self.old.from_git)
        )

    def changes(self) -> dict[str, Literal["added", "removed", "modified"]]:
        """``path -> added | removed | modified``, by path."""
        found = design_git.changed_paths(self.new.repo, self._old_tree, self.new.tree)
        return {p: s for p, s in sorted(found.items()) if not self._hidden(p)}  # type: ignore[misc]

    def sizes(self, path: str) -> tuple[int | None, int | None]:
        """The file's size before and now (None: absent on that side)."""
        if self._hidden(path):
            return None, None
        before = self.old.files().get(path) if self.old is not None else None
        return before, self.new.files().get(path)

    def file_diff(self, path: str) -> tuple[FileStatus, str] | None:
        """One file's status and unified diff; None when neither side holds it."""
        before, now = self.sizes(path)
        if before is None and now is None:
            return None
        text = design_git.unified_diff(
            self.new.repo, self._old_tree, self.new.tree, path,
            old_label=self.previous or "nothing", new_label=self.new.decision_set,
        )  # fmt: skip
        status: FileStatus = (
            "added" if before is None else "removed" if now is None else
            "modified" if text else "unchanged"
        )  # fmt: skip
        return status, text


def repository_diff(
    sm: sessionmaker[Session],
    artifacts: ArtifactStore,
    repos_dir: Path,
    project: str,
    ds: str,
    *,
    against: str | None = None,
) -> RepositoryDiff | None:
    """The diff of ``ds``'s repository against ``against`` (default: its previous
    decision set); None when ``ds`` has no repository."""
    new = repository_view(sm, artifacts, repos_dir, project, ds)
    if new is None:
        return None
    previous = against
    if previous is None:
        row = decision_set(sm, project, ds)
        previous = row["parent_id"] if row is not None else None
    old = None
    if previous is not None:
        old = repository_view(sm, artifacts, repos_dir, project, previous)
    return RepositoryDiff(new=new, previous=previous, old=old)
