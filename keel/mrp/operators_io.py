"""Operators on disk: find ``operator.yaml`` files, hash code, check pins and signatures."""

from __future__ import annotations

from pathlib import Path

import blake3

from keel.mrp.errors import RegistryError
from keel.mrp.registry import OperatorSpec

OPERATOR_FILE = "operator.yaml"
_SKIP_DIRS = frozenset({"__pycache__"})
REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_OPERATORS = REPO_ROOT / "operators"


def code_digest(folder: str | Path) -> str:
    """BLAKE3 over the operator folder: sorted relative paths and bytes, leaving out
    ``operator.yaml`` and ``__pycache__``."""
    root = Path(folder)
    h = blake3.blake3()
    files = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and not _SKIP_DIRS.intersection(p.relative_to(root).parts)
        and p.relative_to(root).as_posix() != OPERATOR_FILE
        and p.suffix not in (".pyc", ".pyo")
    )
    for p in files:
        rel = p.relative_to(root).as_posix().encode("utf-8")
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return "blake3:" + h.hexdigest()


def find_operator_dir(spec: OperatorSpec, search_paths: list[Path] | None = None) -> Path:
    """The folder of ``spec`` on the search path (default: the shipped ``operators/``)."""
    import yaml

    for base in search_paths or [SHIPPED_OPERATORS]:
        for f in sorted(Path(base).glob(f"*/{OPERATOR_FILE}")):
            data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
            if data.get("name") == spec.name and str(data.get("version")) == spec.version:
                return f.parent.resolve()
    raise RegistryError(f"operator {spec.ref}: no folder with its operator.yaml on the search path")
