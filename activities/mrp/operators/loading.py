"""Loading operator code: each operator's folder imported as its own package, once."""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import re
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from activities.mrp.operators.files import code_digest, find_operator_dir
from keel.mrp.errors import RegistryError
from keel.mrp.registry import OperatorKind, OperatorSpec
from keel.mrp.sdk import (
    AgentBase,
    EvaluatorBase,
    OperatorBase,
    ProducerBase,
    ReducerBase,
)

if TYPE_CHECKING:
    pass


# Loading operator code

_BASES: dict[OperatorKind, type[OperatorBase]] = {
    OperatorKind.MAP: AgentBase,
    OperatorKind.REDUCE: ReducerBase,
    OperatorKind.EVALUATE: EvaluatorBase,
    OperatorKind.PRODUCE: ProducerBase,
}


# Loading


_PACKAGE_ROOT = "keel_mrp_operators"
_load_lock = threading.RLock()
_loaded: dict[tuple[str, str, str], OperatorBase] = {}


def _package_name(spec: OperatorSpec, folder: Path) -> str:
    # One module namespace per (operator, code digest, folder): two versions of one
    # operator, or a changed copy of it, never share (or overwrite) a module.
    tag = hashlib.sha256(f"{spec.code_digest}\0{folder}".encode()).hexdigest()[:16]
    safe = re.sub(r"[^A-Za-z0-9_]", "_", f"{spec.name}_{spec.version}")
    return f"{_PACKAGE_ROOT}.{safe}_{tag}"


def _import_package(name: str, folder: Path) -> None:
    if _PACKAGE_ROOT not in sys.modules:
        root = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec(_PACKAGE_ROOT, None, is_package=True)
        )
        root.__path__ = []
        sys.modules[_PACKAGE_ROOT] = root
    if name in sys.modules:
        return
    init = folder / "__init__.py"
    if init.is_file():
        mspec = importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(folder)]
        )
    else:
        mspec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        mspec.submodule_search_locations = [str(folder)]
    if mspec is None:
        raise RegistryError(f"cannot import operator code from {folder}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module
    try:
        if mspec.loader is not None:
            mspec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise


def load_operator(
    spec: OperatorSpec, folder: str | Path | None = None, *, verify: bool = True
) -> OperatorBase:
    """Import ``spec.entrypoint`` from the operator's folder and return an instance.

    ``folder`` is the directory holding the ``operator.yaml``; None looks the operator up
    on the default search path (:func:`find_operator_dir`). With
    ``verify`` the folder's code is hashed first and must match ``spec.code_digest``, so
    the code that runs is the code that was pinned and signed. Instances are cached per
    process (operators must not keep per-call state on ``self``).

    Raises :class:`~keel.mrp.errors.RegistryError` (code does not match its pin, module or
    class missing, wrong kind).
    """
    path = Path(folder).resolve() if folder is not None else find_operator_dir(spec)
    key = (spec.ref, spec.code_digest, str(path))
    with _load_lock:
        cached = _loaded.get(key)
        if cached is not None:
            return cached
        if verify:
            actual = code_digest(path)
            if actual != spec.code_digest:
                raise RegistryError(
                    f"operator {spec.ref}: code in {path} has digest {actual}, "
                    f"but its pin is {spec.code_digest}; re-sign it or restore the code"
                )
        module_rel, _, attr = spec.entrypoint.partition(":")
        package = _package_name(spec, path)
        try:
            _import_package(package, path)
            module = importlib.import_module(f"{package}.{module_rel}")
        except ImportError as e:
            raise RegistryError(
                f"operator {spec.ref}: cannot import {module_rel!r} from {path}: {e}"
            ) from None
        target = getattr(module, attr, None)
        if target is None:
            raise RegistryError(
                f"operator {spec.ref}: module {module_rel!r} has no attribute {attr!r}"
            )
        base = _BASES[spec.kind]
        if not (isinstance(target, type) and issubclass(target, base)):
            raise RegistryError(
                f"operator {spec.ref}: entrypoint {spec.entrypoint} must be a subclass of "
                f"{base.__name__} (kind {spec.kind.value})"
            )
        instance = target()
        _loaded[key] = instance
        return instance
