"""Reading users' files: ``.rllm`` apps (with every file they use), the models config and
the SRL actors config.

``keel`` parses text and bytes and stays pure; this module opens the files, so the CLI,
the API and the worker read a user's files in one way, with the same errors.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from keel.llm import ModelsConfig, ModelsConfigError, parse_models_config
from keel.rllm.deps import Loader, ResolvedApp, resolve
from keel.rllm.errors import DependencyResolutionError, ParseError
from keel.rllm.model import RllmProgram
from keel.rllm.parser import parse_bytes
from keel.rllm.run import uses_paths
from keel.srl.actors import ActorsConfig, parse_actors_config
from keel.srl.errors import ActorsConfigError


def load_rllm(path: str | os.PathLike[str]) -> RllmProgram:
    """Read and parse a ``.rllm`` file. ``source_digest`` is BLAKE3 of the file's bytes.

    Raises:
        ParseError: the file cannot be read or is not UTF-8, plus everything
            :func:`keel.rllm.parser.parse_text` raises.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ParseError(
            f"{p}: cannot read the file: {e.strerror or e}",
            details={"file": str(p)},
            recovery_hint="Check the path and that the file is readable.",
        ) from None
    return parse_bytes(raw, p)


def load_rllm_app(path: str | os.PathLike[str], *, loader: Loader | None = None) -> ResolvedApp:
    """Load an app file and resolve its dependencies: what ``runllm validate`` checks.

    Raises:
        RllmError: the root file's own errors as raised by :func:`load_rllm`,
            or :class:`DependencyResolutionError` for its dependencies.
    """
    load = loader or load_rllm
    return resolve(load(Path(path)), path=path, loader=load, anchor=os.getcwd())


def bundle_files(path: str | os.PathLike[str]) -> dict[str, str]:
    """Read an app file and every file it ``uses``, transitively, for :class:`RllmRunInput`.

    Keys are paths relative to the root file's directory with ``/`` separators; the root
    is under its own file name. Files that do not parse are still bundled (the worker
    reports their errors with positions); a cycle simply stops where a file repeats.

    Raises:
        ParseError: the root file cannot be read or is not UTF-8.
        DependencyResolutionError: a used file cannot be read, or lies outside the root
            file's directory tree (``../x.rllm``), which a bundle cannot name.
    """
    root = Path(path)
    base = root.resolve().parent
    out: dict[str, str] = {}
    queue: list[tuple[Path, str | None]] = [(root.resolve(), None)]
    while queue:
        file, parent = queue.pop(0)
        try:
            rel = file.relative_to(base).as_posix()
        except ValueError:
            raise DependencyResolutionError(
                f"{parent}: uses {file}, which is outside {base}",
                details={"file": parent, "child": str(file)},
                recovery_hint="Keep every used file in the root app's directory or below it.",
            ) from None
        if rel in out:
            continue
        try:
            text = file.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            msg = f"cannot read {file}: {getattr(e, 'strerror', None) or e}"
            if parent is None:
                raise ParseError(msg, details={"file": str(file)}) from None
            raise DependencyResolutionError(
                f"{parent}: {msg}", details={"file": parent, "child": rel}
            ) from None
        out[rel] = text
        for child in uses_paths(text):
            queue.append((Path(os.path.normpath(file.parent / child)), rel))
    return out


def load_models_config(path: str | Path, env: Mapping[str, str] | None = None) -> ModelsConfig:
    """Read and validate a models config file (:func:`keel.llm.parse_models_config`).

    ``${NAME}`` and ``${NAME:-default}`` in ``api_base`` are replaced from ``env``
    (default ``os.environ``), so ``${KEEL_MODEL_SERVER_PORT:-8089}`` follows the port the
    local model server was started on.

    Raises:
        ModelsConfigError: the message names the file and the offending key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelsConfigError(f"{path}: cannot read models config: {e.strerror or e}") from e
    return parse_models_config(text, str(path), os.environ if env is None else env)


def load_actors_config(path: str | Path) -> ActorsConfig:
    """Read and validate an SRL actors config file (:func:`keel.srl.actors.parse_actors_config`).

    Raises:
        ActorsConfigError: the file cannot be read, or its message names the file and the
            offending key.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ActorsConfigError(
            f"{path}: cannot read actors config: {getattr(e, 'strerror', None) or e}"
        ) from e
    return parse_actors_config(text, str(path))
