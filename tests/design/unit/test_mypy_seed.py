"""The jailed mypy's warm cache (activities/design/mypy_seed.py): its tree imports what the
templates import, under the templates' own mypy options, and a shared folder is only
used when it is ours alone. That the seeded mypy passes the generated repositories and
still fails a type error is in tests/design/integration/test_validators.py."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from activities.design import mypy_seed
from activities.design.app import TEMPLATES
from activities.design.codegen import render_request
from activities.design.mypy_seed import SEED_FILES, seed_dir
from tests.design.codegen_cases import request_for

#: The generated repositories' own packages.
LOCAL = ("services", "tests", "__future__")


def _seed_imports() -> set[str]:
    tree = ast.parse(SEED_FILES["seed/__init__.py"])
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }


def _template_imports() -> set[str]:
    found: set[str] = set()
    for path in TEMPLATES.rglob("*"):
        if path.is_file():
            text = path.read_text(encoding="utf-8")
            found |= set(re.findall(r"^\s*(?:from|import) ([A-Za-z_][\w.]*)", text, re.M))
    return {m for m in found if m.split(".")[0] not in LOCAL}


def _untyped(config: dict[str, object]) -> list[str]:
    overrides = config.get("overrides", [])
    assert isinstance(overrides, list)
    return [m for o in overrides if o.get("ignore_missing_imports") for m in o["module"]]


def _covered(module: str, names: set[str], untyped: list[str]) -> bool:
    if module in names:
        return True
    return any(module == u or (u.endswith(".*") and module.startswith(u[:-1])) for u in untyped)


def test_the_seed_imports_every_library_the_templates_import() -> None:
    seed_config = tomllib.loads(SEED_FILES["pyproject.toml"])["tool"]["mypy"]
    untyped = [*_untyped(seed_config), "confluent_kafka", "confluent_kafka.*"]
    missing = sorted(m for m in _template_imports() if not _covered(m, _seed_imports(), untyped))
    assert not missing, f"add to mypy_seed.SEED_FILES: {missing}"
    assert {"fastapi", "fastapi.testclient", "pydantic", "pytest", "uvicorn"} <= _seed_imports()


def test_the_seed_has_the_generated_repositories_mypy_options() -> None:
    """Options decide whether mypy trusts a cached module: the same ones, but ``packages``."""
    generated = tomllib.loads(render_request(request_for("rag"))["pyproject.toml"])
    seed = tomllib.loads(SEED_FILES["pyproject.toml"])
    mine, theirs = dict(seed["tool"]["mypy"]), dict(generated["tool"]["mypy"])
    assert mine.pop("packages") == ["seed"] and theirs.pop("packages") == ["services", "tests"]
    assert mine == theirs


def test_a_seed_folder_others_may_write_to_is_not_used(tmp_path: Path) -> None:
    shared = tmp_path / f"keel-mypy-seed-{os.geteuid()}"
    shared.mkdir()
    shared.chmod(0o777)
    assert seed_dir(str(tmp_path), "/usr/bin/python3", {"PYTHONPATH": ""}) is None
    assert list(shared.iterdir()) == []  # nothing was built there either


def test_a_failed_build_is_not_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter that cannot run mypy: no seed, and later calls do not build again."""
    builds: list[Path] = []
    real = mypy_seed._build

    def counted(parent: Path, target: Path, executable: str, env: dict[str, str]) -> Path | None:
        builds.append(target)
        return real(parent, target, executable, env)

    monkeypatch.setattr(mypy_seed, "_build", counted)
    env = {"PYTHONPATH": "", "PYTHONNOUSERSITE": "1"}
    assert seed_dir(str(tmp_path), "/bin/false", env) is None
    assert seed_dir(str(tmp_path), "/bin/false", env) is None
    assert len(builds) == 1
    # Nothing of the failed build is left: only the (empty) lock file of its key.
    left = list((tmp_path / f"keel-mypy-seed-{os.geteuid()}").iterdir())
    assert [p.suffix for p in left] == [".lock"] and left[0].read_bytes() == b""


def test_one_build_per_machine_the_lock_holds_across_processes(tmp_path: Path) -> None:
    """While a process builds a key's seed, another process's lock on it waits (here: a
    non-blocking try fails); once released, it is had at once."""
    lock = tmp_path / "key.lock"
    code = (
        "import fcntl, sys\n"
        f"f = open({str(lock)!r}, 'a')\n"
        "fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
    )
    with mypy_seed._held(lock):
        held = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert held.returncode == 1 and "BlockingIOError" in held.stderr, held.stderr
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert free.returncode == 0, free.stderr


def test_the_setup_built_the_seed_the_validators_use() -> None:
    """scripts/bootstrap.sh (which the test command runs first) warms the seed for the
    config the validators run with: the first validator test finds it, instead of
    spending its minute building it (120.3 s against 19.4 s warm, in a clean clone)."""
    from activities.design.validators.jailed import warm_mypy_seed
    from sandbox.models import default_config

    said: list[str] = []
    outcome = warm_mypy_seed(default_config(), said.append)
    assert said == [] and outcome.startswith("ready at "), (said, outcome)
