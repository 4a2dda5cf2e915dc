"""The secret scan: detect-secrets over the generated tree, on the host."""

from __future__ import annotations

import tempfile
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


def scan_secrets(files: Mapping[str, str]) -> ValidatorResult:
    """detect-secrets over every file; a finding names the file, line and secret type,
    never the value."""
    try:
        from importlib.metadata import version

        from detect_secrets import SecretsCollection
        from detect_secrets.settings import default_settings
    except ImportError:
        return ValidatorResult(
            name="secrets", status="not_run", summary="detect-secrets is not installed"
        )
    scanner = f"{SECRET_SCANNER} {version(SECRET_SCANNER)}"
    findings: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="keel-secrets-") as tmp:
        _write_tree(files, Path(tmp))
        found = SecretsCollection(root=tmp)
        with default_settings() as settings:
            plugins = sorted(settings.plugins)
            for path in sorted(files):
                found.scan_file(path)
        for path, secret in found:
            findings.append({"file": path, "line": secret.line_number, "rule": secret.type})
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
