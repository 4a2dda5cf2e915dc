"""keel/srl stays pure: no I/O modules, nothing of ours but keel, no unseeded randomness."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

SRL = Path(__file__).resolve().parents[3] / "keel" / "srl"
THIRD_PARTY = {"pydantic", "yaml", "blake3", "jsonschema"}
IO_MODULES = {
    "os",
    "sys",
    "subprocess",
    "socket",
    "pathlib",
    "shutil",
    "tempfile",
    "time",
    "urllib",
    "http",
    "asyncio",
    "threading",
    "multiprocessing",
    "secrets",
    "uuid",
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_srl_modules_import_only_stdlib_keel_and_allowed_packages() -> None:
    files = sorted(SRL.glob("*.py"))
    assert len(files) >= 7
    for path in files:
        for name in imported_modules(path):
            allowed = name == "keel" or name in THIRD_PARTY or name in sys.stdlib_module_names
            assert allowed, f"{path.name} imports {name}"
            assert name not in IO_MODULES, f"{path.name} imports the I/O module {name}"


def test_no_open_calls_clock_reads_or_unseeded_random() -> None:
    for path in sorted(SRL.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"(?<![\w.])open\(", text), path.name
        assert ".now(" not in text and "utcnow" not in text, path.name
        assert not re.search(r"random\.(?!Random\(seed\))", text.replace("import random", "")), (
            path.name
        )
