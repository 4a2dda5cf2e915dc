"""Operators on disk: the shipped paths and dev key, the refusals, the code digest and the
search for each operator's folder."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import blake3
import yaml
from pydantic import ValidationError

from keel.mrp.errors import MrpError, RegistryError
from keel.mrp.registry import OperatorSpec
from keel.problems import problems

if TYPE_CHECKING:
    pass


OPERATOR_FILE = "operator.yaml"
_SKIP_DIRS = frozenset({"__pycache__"})
_SKIP_SUFFIXES = frozenset({".pyc", ".pyo"})
REPO_ROOT = Path(__file__).resolve().parents[3]
SHIPPED_OPERATORS = REPO_ROOT / "operators"
DEFAULT_CONFIG = REPO_ROOT / "configs" / "mrp.yaml"

# The development key pair. The private half is in git (configs/keys/), so operators signed
# with it prove nothing outside dev: KEEL_ENV=prod refuses to trust or use it.
DEV_KEY_ID = "keel-dev"
DEV_KEY_PATH = REPO_ROOT / "configs" / "keys" / "keel-dev.ed25519"
DEV_PUBLIC_KEY = "79e89199b863e52cd68ea682404b2bcafb5a040bf25fd2cca0ee7717e5f16ee8"

_PUBLIC_KEY_RE = re.compile(r"^[0-9a-f]{64}$")

RefusalReason = Literal[
    "invalid_spec", "code_mismatch", "bad_signature", "duplicate", "missing_folder"
]


class MrpConfigError(MrpError):
    """``configs/mrp.yaml`` is missing, malformed, or refused in this environment."""


class OperatorRefused(RegistryError):
    """An operator found on disk that must not run: its code no longer matches its pin, its
    signature does not verify, its spec is invalid, or it is found twice.

    ``operator`` is ``name@version`` (or the folder when the spec cannot be read),
    ``reason`` one of :data:`RefusalReason`.
    """

    def __init__(self, operator: str, reason: RefusalReason, detail: str) -> None:
        self.operator = operator
        self.reason = reason
        self.detail = detail
        super().__init__(f"operator {operator} is refused ({reason}): {detail}")


# Code digest and folders


def _code_files(root: Path) -> list[Path]:
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts) or p.suffix in _SKIP_SUFFIXES:
            continue
        if rel.as_posix() == OPERATOR_FILE or not p.is_file():
            continue
        out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def code_digest(folder: str | Path) -> str:
    """``blake3:<hex>`` of an operator folder's code.

    BLAKE3 over every file but ``operator.yaml``, ``__pycache__`` and ``*.pyc``, in sorted
    relative-path order, each as (length-prefixed path, length-prefixed bytes), so moving
    bytes between files or renaming one changes the digest. The folder's own location does
    not count: a copy hashes the same.
    """
    root = Path(folder)
    if not root.is_dir():
        raise RegistryError(f"operator folder {root} does not exist")
    h = blake3.blake3()
    h.update(b"keel.mrp.operator-code/v1\0")
    for p in _code_files(root):
        rel = p.relative_to(root).as_posix().encode("utf-8")
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "big") + rel + len(data).to_bytes(8, "big") + data)
    return "blake3:" + h.hexdigest()


@dataclass
class ScannedOperator:
    """One ``operator.yaml`` found on a search path, parsed or not."""

    yaml_path: Path
    folder: Path
    spec: OperatorSpec | None
    error: str | None = None
    actual_digest: str | None = None


def _read_spec(path: Path) -> OperatorSpec:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: must be a YAML mapping")
    try:
        return OperatorSpec.model_validate(data)
    except ValidationError as e:
        raise ValueError(f"{path}: {problems(e, root='<root>')}") from None


def scan_operators(search_paths: Iterable[str | Path]) -> list[ScannedOperator]:
    """Every ``<path>/*/operator.yaml`` (one level deep), in path order then folder name,
    with its spec (or why it could not be read) and the digest of its code."""
    found: list[ScannedOperator] = []
    for base in search_paths:
        for yaml_path in sorted(Path(base).glob(f"*/{OPERATOR_FILE}")):
            folder = yaml_path.parent.resolve()
            try:
                spec: OperatorSpec | None = _read_spec(yaml_path)
                error = None
            except (OSError, ValueError) as e:
                spec, error = None, str(e)
            found.append(
                ScannedOperator(
                    yaml_path=yaml_path.resolve(),
                    folder=folder,
                    spec=spec,
                    error=error,
                    actual_digest=code_digest(folder),
                )
            )
    return found


def find_operator_dir(spec: OperatorSpec, search_paths: Iterable[str | Path] | None = None) -> Path:
    """The folder whose ``operator.yaml`` declares ``spec.ref``.

    The default search path is ``Settings.mrp_operator_paths`` (``KEEL_MRP_OPERATOR_PATHS``,
    ``os.pathsep``-separated) if set, else the shipped ``operators/`` folder. Callers that have an :class:`MrpConfig`
    use :meth:`MrpConfig.operator_dir` instead.
    """
    if search_paths is None:
        from keel.settings import Settings

        search_paths = list(Settings().mrp_operator_paths) or [SHIPPED_OPERATORS]
    for base in search_paths:
        for yaml_path in sorted(Path(base).glob(f"*/{OPERATOR_FILE}")):
            try:
                data = yaml.safe_load(yaml_path.read_text(encoding="utf-8")) or {}
            except (OSError, yaml.YAMLError):
                continue
            if (
                isinstance(data, dict)
                and data.get("name") == spec.name
                and str(data.get("version")) == spec.version
            ):
                return yaml_path.parent.resolve()
    raise RegistryError(f"operator {spec.ref}: no folder with its operator.yaml on the search path")
