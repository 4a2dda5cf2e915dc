"""The design read model (store/design.py ``stored_view``, ``repository_view``,
``repository_diff``) on SQLite, a local artifact store and the real git."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from store import design as design_store
from store.artifacts import LocalArtifactStore
from store.design_git import commit_decision_set
from tests.design.unit.test_design_store import persist_input


def _zip(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return buf.getvalue()


def _persist(sm: sessionmaker[Session], store: LocalArtifactStore, ds: str, files: dict[str, str],
             parent: str | None = None) -> None:  # fmt: skip
    data = _zip(files)
    design_store.persist(
        sm,
        persist_input(f"k-{ds}", project="view", decision_set=ds, parent=parent),
        archive_digest=store.put_bytes(data) if files else None,
        archive_size=len(data),
    )


def test_git_history_and_a_set_recorded_before_it(
    sm: sessionmaker[Session], tmp_path: Path
) -> None:
    store = LocalArtifactStore(tmp_path / "artifacts")
    repos = tmp_path / "repos"
    one = {"README.md": "# one\n", "main.tf": 'resource "a" "b" {}\n', "plan.md": "mine\n"}
    two = {"README.md": "# two\n", "reports/diff.json": "{}\n"}
    # ds0 is planned only (no archive); ds1 predates the git history (archive only);
    # ds2 has its commit, whose plan.md is the Change Summary, not a repository file.
    _persist(sm, store, "ds0", {})
    _persist(sm, store, "ds1", one, parent="ds0")
    _persist(sm, store, "ds2", two, parent="ds1")
    commit_decision_set(repos, "view", "ds2", {**two, "plan.md": "summary\n"}, message="m\n")

    assert design_store.repository_view(sm, store, repos, "view", "ds0") is None
    old = design_store.repository_view(sm, store, repos, "view", "ds1")
    assert old is not None and not old.from_git
    assert set(old.files()) == set(one) and old.read("plan.md") == b"mine\n"
    new = design_store.repository_view(sm, store, repos, "view", "ds2")
    assert new is not None and new.from_git
    assert new.files() == {"README.md": 6, "reports/diff.json": 3}
    assert new.read("plan.md") is None and new.read("README.md") == b"# two\n"

    diff = design_store.repository_diff(sm, store, repos, "view", "ds2")
    assert diff is not None and diff.previous == "ds1" and diff.previous_has_files
    assert diff.changes() == {
        "README.md": "modified",
        "main.tf": "removed",
        "reports/diff.json": "added",
    }
    status, text = diff.file_diff("README.md") or ("", "")
    assert status == "modified" and text.startswith("--- ds1/README.md\n+++ ds2/README.md\n")
    assert diff.file_diff("nope") is None
    assert diff.file_diff("plan.md") is None  # hidden on the git side
    # Against a planned-only set: every file is new.
    first = design_store.repository_diff(sm, store, repos, "view", "ds1")
    assert first is not None and first.previous == "ds0" and not first.previous_has_files
    assert first.changes() == {p: "added" for p in sorted(one)}
    assert first.file_diff("README.md") == (
        "added",
        "--- /dev/null\n+++ ds1/README.md\n@@ -0,0 +1 @@\n+# one\n",
    )

    stored = design_store.stored_view(sm, "view", "ds2")
    assert stored.row is not None and stored.row["parent_id"] == "ds1"
    assert stored.archive is not None and stored.last["run-complete"]["version"] == 1
    assert stored.validation is None and stored.failed_validators is None
    assert design_store.stored_view(sm, "view", "none").row is None
