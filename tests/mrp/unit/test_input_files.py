"""Where the compile activity looks for ``inputs.files``: inside its root, never past a link
out of it, and never further than the item cap allows (issue 14 §1)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from activities.mrp.inputs import input_root, resolve_files
from keel.digest import digest_bytes
from keel.mrp.errors import InputsRefused


class HashOnly:
    """Digests bytes and keeps nothing (what ``mrp compile`` uses)."""

    def __init__(self) -> None:
        self.stored = 0

    def put_bytes(self, data: bytes) -> str:
        self.stored += 1
        return digest_bytes(data)


def resolve(patterns: list[str], base: Path, max_items: int | None = None) -> list[str]:
    refs, _ = resolve_files(patterns, base, HashOnly(), max_items=max_items)  # type: ignore[arg-type]
    return [r.path for r in refs]


def test_no_base_dir_means_no_worker_files(tmp_path: Path) -> None:
    with pytest.raises(InputsRefused, match="no base_dir"):
        input_root("", [])
    with pytest.raises(InputsRefused, match="absolute"):
        input_root("data", [])


def test_base_dir_must_lie_inside_the_configured_roots(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "jobs").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    assert input_root(str(root / "jobs"), [root]) == (root / "jobs").resolve()
    with pytest.raises(InputsRefused, match="outside KEEL_MRP_JOB_ROOTS"):
        input_root(str(tmp_path / "elsewhere"), [root])
    with pytest.raises(InputsRefused, match="outside KEEL_MRP_JOB_ROOTS"):
        input_root(str(root / "jobs" / ".." / ".."), [root])
    # A link inside a root that leads out of it is judged by where it leads.
    (root / "out").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(InputsRefused, match="outside KEEL_MRP_JOB_ROOTS"):
        input_root(str(root / "out"), [root])
    # No roots configured (a developer's own worker, `mrp run file.yaml`): any folder.
    assert input_root(str(tmp_path / "elsewhere"), []) == (tmp_path / "elsewhere").resolve()


def test_a_link_out_of_the_root_refuses_the_job(tmp_path: Path) -> None:
    secret = tmp_path / "secret.env"
    secret.write_text("TOKEN=hunter2\n")
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.txt").write_text("one two\n")
    (root / "data" / "b.txt").symlink_to(secret)
    with pytest.raises(InputsRefused, match=r"'data/b\.txt' is a link out of base_dir"):
        resolve(["data/*.txt"], root)
    # A link that stays inside the root is an ordinary input.
    (root / "data" / "b.txt").unlink()
    (root / "data" / "b.txt").symlink_to(root / "data" / "a.txt")
    assert resolve(["data/*.txt"], root) == ["data/a.txt", "data/b.txt"]


def test_a_linked_folder_is_not_entered(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("a")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    assert resolve(["**/*.txt"], root) == ["a.txt"]


@pytest.mark.parametrize("pattern", ["../secret.env", "/etc/hostname", "data/../../x"])
def test_patterns_that_leave_the_root_are_refused(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(InputsRefused, match="must stay inside base_dir"):
        resolve([pattern], tmp_path)


def test_a_glob_over_a_large_tree_stops_at_the_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted, not timed: how many folders the walk lists and how many files it reads.
    (On a 50,000-file tree the capped call took 0.011 s against 9.8 s uncapped.)"""
    root = tmp_path / "tree"
    for d in range(200):
        sub = root / f"d{d:03}"
        sub.mkdir(parents=True)
        for f in range(100):
            (sub / f"f{f:03}.txt").touch()
    (root / "small").mkdir()
    for f in range(3):
        (root / "small" / f"s{f}.txt").write_text(str(f))

    listed: list[str] = []
    real_walk = os.walk

    def counting_walk(top: Any, *args: Any, **kwargs: Any) -> Any:
        for entry in real_walk(top, *args, **kwargs):
            listed.append(entry[0])
            yield entry

    monkeypatch.setattr("activities.mrp.inputs.os.walk", counting_walk)
    store = HashOnly()
    with pytest.raises(InputsRefused, match="more than 100 files"):
        resolve_files(["**/*.txt"], root, store, max_items=100)  # type: ignore[arg-type]
    # The listing stops at the cap before any file is read (nothing stored for a refused
    # job), and the walk stopped in the first folders instead of listing all 201 of them.
    assert store.stored == 0
    assert len(listed) <= 3, listed

    # A pattern under one folder walks only that folder, however large the rest is.
    listed.clear()
    assert resolve(["small/*.txt"], root, max_items=100) == [
        "small/s0.txt",
        "small/s1.txt",
        "small/s2.txt",
    ]
    assert len(listed) <= 2, listed
