"""The per-project git repository (store/design_git.py) on a temp dir with the real git."""

from __future__ import annotations

from pathlib import Path

import pytest

from store.design_git import GitError, commit_decision_set, commit_of, git, repo_path

FIRST = {"README.md": "# v1\n", "infra/serve/main.tf": "# serve\n", "plan.md": "plan 1\n"}


def test_one_commit_per_decision_set_with_the_previous_as_parent(tmp_path: Path) -> None:
    c1 = commit_decision_set(tmp_path, "p1", "ds1", FIRST, message="decision set ds1 v1\n")
    second = {**FIRST, "README.md": "# v2\n", "reports/diff.json": "{}\n"}
    del second["infra/serve/main.tf"]
    c2 = commit_decision_set(
        tmp_path, "p1", "ds2", second, message="decision set ds2 v1\n", parent_decision_set="ds1"
    )
    repo = repo_path(tmp_path, "p1")
    assert git(repo, "rev-parse", f"{c2}^").stdout.strip() == c1
    assert git(repo, "rev-list", "--count", c1).stdout.strip() == "1"  # ds1 is a root
    changed = git(repo, "diff", "--name-status", c1, c2).stdout.split("\n")
    assert sorted(filter(None, changed)) == [
        "A\treports/diff.json",
        "D\tinfra/serve/main.tf",
        "M\tREADME.md",
    ]
    assert git(repo, "show", f"{c2}:README.md").stdout == "# v2\n"
    assert git(repo, "log", "-1", "--format=%s|%an|%ae", c2).stdout.strip() == (
        "decision set ds2 v1|Keel|keel@localhost"
    )
    assert commit_of(repo, "ds1") == c1 and commit_of(repo, "ds2") == c2
    assert git(repo, "rev-parse", "refs/heads/main").stdout.strip() == c2


def test_a_retried_commit_is_the_same_commit(tmp_path: Path) -> None:
    c1 = commit_decision_set(tmp_path, "p1", "ds1", FIRST, message="decision set ds1 v1\n")
    again = commit_decision_set(tmp_path, "p1", "ds1", dict(FIRST), message="other message\n")
    repo = repo_path(tmp_path, "p1")
    assert again == c1
    assert git(repo, "rev-list", "--all", "--count").stdout.strip() == "1"


def test_new_files_for_the_same_decision_set_follow_its_earlier_commit(tmp_path: Path) -> None:
    c1 = commit_decision_set(tmp_path, "p1", "ds1", FIRST, message="decision set ds1 v1\n")
    c2 = commit_decision_set(
        tmp_path, "p1", "ds1", {**FIRST, "plan.md": "plan 2\n"}, message="decision set ds1 v2\n"
    )
    repo = repo_path(tmp_path, "p1")
    assert c2 != c1 and git(repo, "rev-parse", f"{c2}^").stdout.strip() == c1
    assert commit_of(repo, "ds1") == c2


def test_projects_have_their_own_repositories(tmp_path: Path) -> None:
    commit_decision_set(tmp_path, "p1", "ds1", FIRST, message="m\n")
    commit_decision_set(tmp_path, "p2", "ds1", {"a.txt": "a\n"}, message="m\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p1.git", "p2.git"]
    # A parent that has no commit (another project's set) leaves a root commit.
    c = commit_decision_set(tmp_path, "p2", "ds2", {"b.txt": "b\n"}, message="m\n",
                            parent_decision_set="nope")  # fmt: skip
    assert git(repo_path(tmp_path, "p2"), "rev-list", "--count", c).stdout.strip() == "1"


@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a/../b", ".git/config", "a\\b", ""])
def test_bad_paths_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(GitError, match="not a relative path"):
        commit_decision_set(tmp_path, "p1", "ds1", {path: "x"}, message="m\n")


@pytest.mark.parametrize("bad", ["../p", "a/b", ".hidden", ""])
def test_bad_ids_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(GitError, match="is not an id"):
        commit_decision_set(tmp_path, bad, "ds1", FIRST, message="m\n")
    with pytest.raises(GitError, match="is not an id"):
        commit_decision_set(tmp_path, "p1", bad, FIRST, message="m\n")


def test_user_git_config_does_not_leak(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Mallory\n\temail = m@example.com\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Mallory")
    c = commit_decision_set(tmp_path / "repos", "p1", "ds1", FIRST, message="m\n")
    log = git(repo_path(tmp_path / "repos", "p1"), "log", "-1", "--format=%an %cn", c).stdout
    assert log.strip() == "Keel Keel"


def test_reads_list_diff_and_read_trees(tmp_path: Path) -> None:
    from store.design_git import (
        EMPTY_TREE,
        changed_paths,
        list_tree,
        read_blobs,
        tree_of,
        unified_diff,
    )

    odd = "docs/[a]*?.md"  # glob characters: a literal path, never a pattern
    commit_decision_set(tmp_path, "p1", "ds1", {**FIRST, odd: "x\n"}, message="m\n")
    second = {**FIRST, "README.md": "# v2\nmore\n", odd: "y\n", "new.txt": "ü\n"}
    del second["infra/serve/main.tf"]
    commit_decision_set(tmp_path, "p1", "ds2", second, message="m\n", parent_decision_set="ds1")
    repo = repo_path(tmp_path, "p1")
    t1, t2 = tree_of(repo, "ds1"), tree_of(repo, "ds2")
    assert t1 and t2 and tree_of(repo, "nope") is None
    assert tree_of(repo_path(tmp_path, "absent"), "ds1") is None
    assert list_tree(repo, t2) == {"README.md": 10, odd: 2, "new.txt": 3, "plan.md": 7}
    assert read_blobs(repo, t2, ["new.txt", "gone", odd]) == {
        "new.txt": "ü\n".encode(),
        odd: b"y\n",
    }
    assert changed_paths(repo, t1, t2) == {
        "README.md": "modified",
        odd: "modified",
        "infra/serve/main.tf": "removed",
        "new.txt": "added",
    }
    assert set(changed_paths(repo, EMPTY_TREE, t1).values()) == {"added"}
    text = unified_diff(repo, t1, t2, "README.md", old_label="ds1", new_label="ds2")
    assert text == "--- ds1/README.md\n+++ ds2/README.md\n@@ -1 +1,2 @@\n-# v1\n+# v2\n+more\n"
    added = unified_diff(repo, t1, t2, "new.txt", old_label="ds1", new_label="ds2")
    assert added.startswith("--- /dev/null\n+++ ds2/new.txt\n")
    removed = unified_diff(repo, t1, t2, "infra/serve/main.tf", old_label="ds1", new_label="ds2")
    assert removed.startswith("--- ds1/infra/serve/main.tf\n+++ /dev/null\n")
    assert unified_diff(repo, t1, t2, odd, old_label="ds1", new_label="ds2").endswith("-x\n+y\n")
    assert unified_diff(repo, t1, t2, "plan.md", old_label="ds1", new_label="ds2") == ""
