"""A warm mypy cache for the validators' jailed mypy: the seed.

A generated repository's mypy run spends most of its time on what every repository
shares: typeshed's standard library, FastAPI, Starlette, pydantic, pytest (about 5 s of
CPU a run, 0.6 s with their cache). The seed is that cache, built once per machine from
:data:`SEED_FILES`, a tree of Keel's own (never a generated one): the templates' mypy
configuration over a module that imports every library the templates import
(``tests/design/unit/test_mypy_seed.py`` keeps that true). Each jailed run copies the
seed, bound read-only, into the jail's own ``/tmp`` and points mypy there, so nothing a
run writes reaches the seed or the next run.

mypy checks every cached module against its source (size, mtime, hash) and its options
before it trusts it, so a stale or mismatched seed only costs the time it would have
saved: the verdict is the same with or without it.

The seed lives in ``<base>/keel-mypy-seed-<uid>/<key>``, ``<base>`` being the jail's
run directory (the system temp dir by default); the key digests everything the cache
depends on. The folder must be a directory of this uid that no one else may write to,
else the seed is not used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

log = logging.getLogger(__name__)

#: Where a jailed run sees the seed (read-only) and where it copies it to (its /tmp).
SEED_MOUNT = "/keel-mypy-seed"
JAIL_CACHE = "/tmp/mypy-cache"
#: Seconds the seed's build may take (it is one mypy run over the libraries).
BUILD_TIMEOUT_S = 240.0

#: The tree the seed is built from: the mypy section of
#: ``configs/design/templates/app/pyproject.toml.j2`` and a module importing what the
#: templates import.
SEED_FILES: dict[str, str] = {
    "pyproject.toml": """[tool.mypy]
strict = true
packages = ["seed"]

[[tool.mypy.overrides]]
module = ["boto3", "boto3.*", "botocore", "botocore.*", "sklearn", "sklearn.*", "pandas", "pandas.*"]
ignore_missing_imports = true
""",
    "seed/__init__.py": '''"""Imports what the generated repositories import."""

from __future__ import annotations

import argparse
import base64
import binascii
import collections
import collections.abc
import contextlib
import csv
import dataclasses
import datetime
import gzip
import hashlib
import importlib.util
import io
import json
import math
import os
import pathlib
import pickle
import random
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import types
import typing
import urllib.error
import urllib.request

import fastapi
import fastapi.testclient
import mlflow
import moto
import numpy
import pandas
import pydantic
import pytest
import uvicorn
''',
}

_build_lock = threading.Lock()
#: Keys whose build failed in this process: not tried again at every mypy run.
_failed: set[str] = set()


def jail_code() -> str:
    """The ``python -c`` program of a seeded jailed run: copy the seed, then mypy. A copy
    that fails (a full ``/tmp``) runs mypy with no cache, as without a seed: mypy's own
    exit code and output stay the verdict."""
    return (
        "import runpy, shutil, sys\n"
        "try:\n"
        f"    shutil.copytree({SEED_MOUNT!r}, {JAIL_CACHE!r})\n"
        f"    cache = {JAIL_CACHE!r}\n"
        "except OSError:\n"
        "    cache = '/dev/null'\n"
        "sys.argv = ['mypy', '--cache-dir=' + cache]\n"
        "runpy.run_module('mypy', run_name='__main__', alter_sys=True)\n"
    )


def seed_key(executable: str, env: Mapping[str, str]) -> str:
    """What the cache depends on: the seed tree, mypy's version, the interpreter and the
    import paths."""
    from importlib.metadata import version

    parts = [SEED_FILES, version("mypy"), os.path.realpath(executable), dict(sorted(env.items()))]
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _private_dir(path: Path) -> bool:
    """``path`` is a real directory of ours that only we may write to."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _make_readable(root: Path) -> None:
    """o+r on every file and o+rx on every directory: the jail's user reads the seed."""
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)


def seed_path(base: str | None, executable: str, env: Mapping[str, str]) -> Path:
    """Where the seed for ``executable`` with ``env`` lies (complete once it holds ``ok``)."""
    return (
        Path(base or tempfile.gettempdir())
        / f"keel-mypy-seed-{os.geteuid()}"
        / seed_key(executable, env)
    )


def seed_dir(base: str | None, executable: str, env: Mapping[str, str]) -> Path | None:
    """The seed for ``executable`` with ``env`` (the jailed mypy's interpreter and import
    paths), built on first use; None (with a warning) when it cannot be had."""
    target = seed_path(base, executable, env)
    parent, key = target.parent, target.name
    with _build_lock:
        try:
            parent.mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            log.warning("mypy seed: cannot make %s: %s", parent, exc)
            return None
        if not _private_dir(parent):
            log.warning("mypy seed: %s is not a private directory of this user; unused", parent)
            return None
        if (target / "ok").is_file():
            return target
        if key in _failed:
            return None
        # One build per machine: the suite's workers (and a machine's workers) ask at
        # once on a fresh machine, and each build is about a minute of CPU. The others
        # wait for it here (in a thread: their activities go on heartbeating).
        with _held(parent / f"{key}.lock"):
            if (target / "ok").is_file():
                return target
            built = _build(parent, target, executable, env)
        if built is None:
            _failed.add(key)
        return built


@contextlib.contextmanager
def _held(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (made if missing) while the block runs."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build(parent: Path, target: Path, executable: str, env: Mapping[str, str]) -> Path | None:
    work = Path(tempfile.mkdtemp(prefix="build-", dir=parent))
    try:
        src, cache = work / "src", work / "cache"
        for rel, text in SEED_FILES.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text, encoding="utf-8")
        # On the host: the tree is Keel's own; the interpreter and import paths are the
        # jail's, so the cache's paths are the ones a jailed run looks up.
        run_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", **env}
        proc = subprocess.run(
            [executable, "-B", "-m", "mypy", f"--cache-dir={cache}", "--config-file",
             str(src / "pyproject.toml")],
            cwd=src, env=run_env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
            check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            log.warning("mypy seed: the build failed (%d): %s", proc.returncode, proc.stdout[-500:])
            return None
        (cache / "ok").write_text("")
        _make_readable(cache)
        try:
            os.rename(cache, target)
        except OSError:  # another process built it first
            if not (target / "ok").is_file():
                return None
        return target
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("mypy seed: the build failed: %s", exc)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)
