"""keel/ is the pure domain (docs/architecture.md): it parses, compiles and decides, and
never opens a file, a socket or a process, reads the environment or the clock, or edits
the interpreter. ``lint-imports`` checks the imports between our packages; this checks
what ``keel`` does with the standard library."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

KEEL = Path(__file__).resolve().parents[3] / "keel"
#: Third-party packages the domain may use: models, YAML, schemas (jsonschema, and
#: jsonschema_rs for the operator schema checks' fast path), digests, HCL (python-hcl2 and
#: its parser lark: the design diff reads generated Terraform from strings).
THIRD_PARTY = {
    "hcl2",
    "lark",
    "pydantic",
    "pydantic_core",
    "yaml",
    "jsonschema",
    "jsonschema_rs",
    "referencing",
    "blake3",
    "typing_extensions",
}
#: Standard modules whose use is I/O, concurrency or interpreter surgery.
IO_MODULES = {
    "subprocess",
    "socket",
    "shutil",
    "tempfile",
    "threading",
    "multiprocessing",
    "asyncio",
    "http",
    "urllib.request",
    "importlib",
    "ctypes",
    "signal",
    "time",
    "secrets",
}
#: The settings class is where the environment is read (pydantic-settings does it when an
#: entry point builds Settings) and where the shipped configs are found: the one module
#: exempt from the call check, and the one that imports pydantic_settings.
SETTINGS = "settings.py"
#: Calls that touch the outside world, as source patterns.
IO_CALLS = [
    r"(?<![\w.])open\(",
    r"\.read_text\(",
    r"\.read_bytes\(",
    r"\.write_text\(",
    r"\.write_bytes\(",
    r"\.mkdir\(",
    r"\.unlink\(",
    r"\.iterdir\(",
    r"\.glob\(",
    r"os\.environ",
    r"os\.getenv",
    r"os\.getcwd",
    r"os\.path\.abspath",
    r"\.resolve\(\)",
    r"sys\.modules",
    r"sys\.addaudithook",
    r"\.now\(",
    r"utcnow",
    r"uuid[14]\(",
    r"random\.(?!Random\()",
]

MODULES = sorted(p for p in KEEL.rglob("*.py"))
#: The modules held to the call check: all but the settings class (see SETTINGS).
CHECKED = [p for p in MODULES if p != KEEL / SETTINGS]


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def code_only(text: str) -> str:
    """The source without comments and strings, so prose and data may name what code may
    not do (SRL's API-replacement table names ``os.getcwd``)."""
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.unparse(tree)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(KEEL)))
def test_imports_only_keel_stdlib_and_the_domains_packages(path: Path) -> None:
    extra = {"pydantic_settings"} if path.name == SETTINGS and path.parent == KEEL else set()
    for name in imports(path):
        top = name.split(".")[0]
        assert (
            top == "keel" or top in THIRD_PARTY or top in extra or top in sys.stdlib_module_names
        ), f"{path.relative_to(KEEL)} imports {name}"
        assert name not in IO_MODULES and top not in IO_MODULES - {"http", "urllib.request"}, (
            f"{path.relative_to(KEEL)} imports {name}, which does I/O (move that code to "
            "activities/, store/ or sandbox/)"
        )


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(KEEL)))
def test_no_file_env_clock_or_interpreter_access(path: Path) -> None:
    code = code_only(path.read_text())
    for pattern in IO_CALLS:
        found = re.search(pattern, code)
        assert found is None, f"{path.relative_to(KEEL)}: {found.group(0)!r} is I/O"


def test_the_check_sees_every_family() -> None:
    families = {p.relative_to(KEEL).parts[0] for p in MODULES if len(p.relative_to(KEEL).parts) > 1}
    assert families >= {"mrp", "rllm", "srl", "design"}
