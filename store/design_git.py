"""A server-side git repository per design project (plan §21.7): one commit per decision set.

Each project has a bare repository ``<root>/<project>.git``. A decision set's files (the
generated repository, its ``reports/`` and ``plan.md``) become one commit whose parent is
the commit of the decision set it iterates on; the tag ``ds/<decision set>`` names it and
``main`` follows the newest. Committing is idempotent: when the tag already names a commit
with the same tree, that commit is the answer, so a retried persist makes no second one.

The ``git`` binary runs with a fixed environment: no user or system configuration, a fixed
author, no prompts, C locale; nothing of the server's account leaks into the commits.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

#: Project and decision set ids as ``keel.design.steps`` admits them; checked again here
#: since they become file and ref names.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
AUTHOR = ("Keel", "keel@localhost")
GIT_TIMEOUT_S = 60.0


class GitError(RuntimeError):
    """A git command failed (its stderr is the message), or a name or path is refused."""


def _env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": "/nonexistent",
        "LC_ALL": "C",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_SYSTEM": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_AUTHOR_NAME": AUTHOR[0],
        "GIT_AUTHOR_EMAIL": AUTHOR[1],
        "GIT_COMMITTER_NAME": AUTHOR[0],
        "GIT_COMMITTER_EMAIL": AUTHOR[1],
    }


def git(
    repo: Path,
    *args: str,
    stdin: str | None = None,
    index: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``git --git-dir=<repo> <args>`` with the fixed environment."""
    env = _env()
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    proc = subprocess.run(
        ["git", f"--git-dir={repo}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    if check and proc.returncode != 0:
        raise GitError(f"git {args[0]}: {proc.stderr.strip()[:2000]}")
    return proc


def _checked_id(what: str, value: str) -> str:
    if not _ID.match(value):
        raise GitError(f"{what} {value!r} is not an id")
    return value


def repo_path(root: Path, project: str) -> Path:
    """The bare repository of ``project`` under ``root`` (whether or not it exists)."""
    return root / f"{_checked_id('project', project)}.git"


def ensure_repo(root: Path, project: str) -> Path:
    """The project's bare repository, created (branch ``main``) if missing."""
    repo = repo_path(root, project)
    if not (repo / "HEAD").is_file():
        repo.parent.mkdir(parents=True, exist_ok=True)
        # init on an existing repository is harmless, so two first persists may race.
        subprocess.run(
            ["git", "init", "--bare", "-q", "--initial-branch=main", str(repo)],
            env=_env(),
            capture_output=True,
            check=True,
            timeout=GIT_TIMEOUT_S,
        )
    return repo


def _tag(decision_set: str) -> str:
    return f"refs/tags/ds/{_checked_id('decision set', decision_set)}"


def commit_of(repo: Path, decision_set: str) -> str | None:
    """The commit tagged for ``decision_set``, or None."""
    proc = git(repo, "rev-parse", "-q", "--verify", f"{_tag(decision_set)}^{{commit}}", check=False)
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def _checked_path(path: str) -> str:
    segments = path.split("/")
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or any(seg in ("", ".", "..", ".git") for seg in segments)
        or any(ord(c) < 32 for c in path)
    ):
        raise GitError(f"{path!r} is not a relative path")
    return path


def write_tree(repo: Path, files: Mapping[str, str]) -> str:
    """Store ``files`` (``path -> text``) as blobs and a tree; the tree's id."""
    paths = sorted(_checked_path(p) for p in files)
    with tempfile.TemporaryDirectory(prefix="keel-git-") as tmp:
        work = Path(tmp) / "files"
        for i, path in enumerate(paths):
            # Flat names: the paths go to git by the index lines, not by the file system.
            (work / str(i)).parent.mkdir(exist_ok=True)
            (work / str(i)).write_bytes(files[path].encode())
        blobs = (
            git(
                repo,
                "hash-object",
                "-w",
                "--no-filters",
                "--stdin-paths",
                stdin="".join(f"{work / str(i)}\n" for i in range(len(paths))),
            ).stdout.split()
            if paths
            else []
        )
        index = Path(tmp) / "index"
        git(
            repo,
            "update-index",
            "--add",
            "--index-info",
            stdin="".join(f"100644 {b}\t{p}\n" for b, p in zip(blobs, paths, strict=True)),
            index=index,
        )
        return git(repo, "write-tree", index=index).stdout.strip()


def commit_decision_set(
    root: Path,
    project: str,
    decision_set: str,
    files: Mapping[str, str],
    *,
    message: str,
    parent_decision_set: str | None = None,
) -> str:
    """Commit ``files`` as the decision set's commit; its id.

    The parent is the decision set's own earlier commit when it has one (a later run of
    the same set), else the commit of ``parent_decision_set`` when that one has a commit.
    Idempotent: the same files for the same decision set give the tagged commit again.

    Raises:
        GitError: a git command failed, or an id or path is refused.
    """
    repo = ensure_repo(root, project)
    tree = write_tree(repo, files)
    existing = commit_of(repo, decision_set)
    if existing is not None and _tree_of(repo, existing) == tree:
        return existing
    parent = existing
    if parent is None and parent_decision_set is not None:
        parent = commit_of(repo, parent_decision_set)
    commit = git(
        repo, "commit-tree", tree, *(["-p", parent] if parent else []), stdin=message
    ).stdout.strip()
    # The old value makes the tag move only from what was read ("" = must not exist), so
    # of two racing persists of one decision set exactly one tags its commit.
    moved = git(repo, "update-ref", _tag(decision_set), commit, existing or "", check=False)
    if moved.returncode != 0:
        winner = commit_of(repo, decision_set)
        if winner is not None and _tree_of(repo, winner) == tree:
            return winner
        raise GitError(f"decision set {decision_set} was committed meanwhile: {moved.stderr}")
    git(repo, "update-ref", "refs/heads/main", commit)
    return commit


def _tree_of(repo: Path, commit: str) -> str:
    return git(repo, "rev-parse", f"{commit}^{{tree}}").stdout.strip()


# --- reading: the decision sets' trees, their files and diffs ------------------------------

#: The tree with no files (git knows it without storing it): the "before" of a first tree.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def _git_bytes(repo: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """``git()`` for output that is file content: bytes, not decoded."""
    proc = subprocess.run(
        ["git", f"--git-dir={repo}", *args],
        input=stdin,
        capture_output=True,
        env=_env(),
        timeout=GIT_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise GitError(f"git {args[0]}: {proc.stderr.decode(errors='replace').strip()[:2000]}")
    return proc.stdout


def tree_of(repo: Path, decision_set: str) -> str | None:
    """The tree of the decision set's commit; None without one (no repository, or a set
    recorded before the project's git history)."""
    if not (repo / "HEAD").is_file():
        return None
    commit = commit_of(repo, decision_set)
    return None if commit is None else _tree_of(repo, commit)


def list_tree(repo: Path, tree: str) -> dict[str, int]:
    """``path -> size in bytes`` of every file of ``tree``."""
    out: dict[str, int] = {}
    for entry in _git_bytes(repo, "ls-tree", "-r", "-l", "-z", tree).split(b"\0"):
        if not entry:
            continue
        meta, _, path = entry.partition(b"\t")
        out[path.decode()] = int(meta.split()[3])
    return out


def read_blobs(repo: Path, tree: str, paths: list[str]) -> dict[str, bytes]:
    """The content of ``paths`` in ``tree`` (one ``cat-file --batch``); a path the tree
    does not hold is left out."""
    if not paths:
        return {}
    data = _git_bytes(
        repo, "cat-file", "--batch", stdin="".join(f"{tree}:{p}\n" for p in paths).encode()
    )
    out: dict[str, bytes] = {}
    at = 0
    for path in paths:
        end = data.index(b"\n", at)
        head = data[at:end].split()
        at = end + 1
        if len(head) != 3 or head[1] != b"blob":  # "<name> missing"
            continue
        size = int(head[2])
        out[path] = data[at : at + size]
        at += size + 1
    return out


def changed_paths(repo: Path, old_tree: str, new_tree: str) -> dict[str, str]:
    """``path -> added | removed | modified`` between two trees (no rename detection)."""
    names = {"A": "added", "D": "removed", "M": "modified", "T": "modified"}
    fields = _git_bytes(
        repo, "diff-tree", "-r", "-z", "--no-renames", "--name-status", old_tree, new_tree
    ).split(b"\0")
    return {
        fields[i + 1].decode(): names.get(fields[i].decode()[:1], "modified")
        for i in range(0, len(fields) - 1, 2)
        if fields[i]
    }


def unified_diff(
    repo: Path, old_tree: str, new_tree: str, path: str, *, old_label: str, new_label: str
) -> str:
    """One file's unified diff between two trees, its ``---``/``+++`` lines naming
    ``<old_label>/<path>`` and ``<new_label>/<path>`` (``/dev/null`` for a side without
    it); empty when the file is the same on both sides."""
    text = _git_bytes(
        repo, "diff", "--no-color", "--no-renames", "--no-ext-diff", "--text",
        f"--src-prefix={old_label}/", f"--dst-prefix={new_label}/",
        old_tree, new_tree, "--", f":(literal){_checked_path(path)}",
    ).decode("utf-8", errors="replace")  # fmt: skip
    # git's own header lines (diff --git, index, new file mode) come before "--- ".
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if ln.startswith("--- ")), len(lines))
    return "".join(lines[start:])
