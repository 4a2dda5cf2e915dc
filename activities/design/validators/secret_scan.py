"""The secret scan: detect-secrets over the generated tree, on the host."""

from __future__ import annotations

import hashlib
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keel.design.validation import ValidatorResult

#: The secret scanner: Yelp's detect-secrets, its default plugins (AWS, private keys,
#: GitHub, Slack, Stripe, JWT, basic-auth URLs, secret keywords, high-entropy strings...).
SECRET_SCANNER = "detect-secrets"


def _write_tree(files: Mapping[str, str], root: Path) -> None:
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")


#: Files remembered by :func:`scan_secrets` (path and text digest -> findings), the
#: oldest forgotten first. Generated trees share most of their files, and a design run
#: validates its tree again after each repair: detect-secrets took 2.5 s of CPU a tree
#: (batch_training, 97 files), nearly all in its per-line plugin calls.
_SCANNED_MAX = 20_000
_scanned: OrderedDict[tuple[str, str], list[tuple[int, str]]] = OrderedDict()
_scanned_lock = threading.Lock()


def _key(path: str, text: str) -> tuple[str, str]:
    return path, hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def _remembered(keys: Mapping[str, tuple[str, str]]) -> dict[str, list[tuple[int, str]]]:
    found: dict[str, list[tuple[int, str]]] = {}
    with _scanned_lock:
        for path, key in keys.items():
            if key in _scanned:
                _scanned.move_to_end(key)
                found[path] = _scanned[key]
    return found


def _remember(scanned: Mapping[tuple[str, str], list[tuple[int, str]]]) -> None:
    with _scanned_lock:
        _scanned.update(scanned)
        while len(_scanned) > _SCANNED_MAX:
            _scanned.popitem(last=False)


def _scan(files: Mapping[str, str], paths: list[str]) -> dict[str, list[tuple[int, str]]]:
    """detect-secrets (its default plugins and filters) over ``paths`` of ``files``:
    each path's findings as (line, secret type)."""
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    hits: dict[str, list[tuple[int, str]]] = {path: [] for path in paths}
    with tempfile.TemporaryDirectory(prefix="keel-secrets-") as tmp:
        _write_tree({p: files[p] for p in paths}, Path(tmp))
        found = SecretsCollection(root=tmp)
        with default_settings():
            for path in paths:
                found.scan_file(path)
        for path, secret in found:
            hits[path].append((int(secret.line_number), str(secret.type)))
    return hits


def scan_secrets(files: Mapping[str, str]) -> ValidatorResult:
    """detect-secrets over every file; a finding names the file, line and secret type,
    never the value. A file scanned before in this process with the same path and text
    is not scanned again: its findings are the same (each file is scanned on its own,
    the same plugins and filters)."""
    try:
        from importlib.metadata import version

        from detect_secrets.settings import default_settings
    except ImportError:
        return ValidatorResult(
            name="secrets", status="not_run", summary="detect-secrets is not installed"
        )
    scanner = f"{SECRET_SCANNER} {version(SECRET_SCANNER)}"
    with default_settings() as settings:
        plugins = sorted(settings.plugins)
    keys = {path: _key(path, text) for path, text in files.items()}
    hits = _remembered(keys)
    unscanned = sorted(p for p in files if p not in hits)
    if unscanned:
        fresh = _scan(files, unscanned)
        _remember({keys[p]: fresh[p] for p in unscanned})
        hits.update(fresh)
    findings: list[dict[str, Any]] = [
        {"file": path, "line": line, "rule": rule}
        for path in sorted(files)
        for line, rule in hits[path]
    ]
    findings.sort(key=lambda f: (f["file"], f["line"], f["rule"]))
    details: dict[str, Any] = {"scanner": scanner, "plugins": plugins}
    if findings:
        rules = sorted({f["rule"] for f in findings})
        return ValidatorResult(
            name="secrets",
            status="failed",
            summary=f"{len(findings)} possible secret(s): {', '.join(rules)}",
            details={**details, "findings": findings[:200]},
        )
    return ValidatorResult(
        name="secrets",
        status="passed",
        summary=f"{scanner}: no secrets found in {len(files)} files",
        details=details,
    )
