"""``runllm validate`` and ``mrp compile`` on YAML nested 50,000 deep: the parser's own
error with the file, line and limit, and the CLI's exit code for it, never a traceback
(issue 14 §2). Neither command needs a Temporal server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DEEP = "[" * 50_000 + "]" * 50_000

pytestmark = pytest.mark.timeout(120)


def cli(module: str, args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update({"KEEL_ENV": "test", "KEEL_DATA_DIR": str(tmp_path / "keel")})
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_runllm_validate_reports_deep_nesting_as_a_parse_error(tmp_path: Path) -> None:
    app = tmp_path / "deep.rllm"
    app.write_text("---\nname: deep\nmetadata: " + DEEP + "\n---\nhi\n")
    proc = cli("cli.runllm", ["validate", str(app)], tmp_path)
    assert proc.returncode == 10, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["error_code"] == "RLLM_PARSE_ERROR"
    assert doc["details"] == {"file": str(app), "line": 3, "column": 75}
    assert (
        doc["message"]
        == f"{app}:3:75: the frontmatter exceeds a limit: nesting deeper than 64 levels"
    )


def test_mrp_compile_reports_deep_nesting_with_its_line(tmp_path: Path) -> None:
    job = tmp_path / "deep.yaml"
    job.write_text('dsl_version: "0.1"\njob_id: deep\ninputs: {items: ' + DEEP + "}\n")
    proc = cli("cli.mrp", ["compile", str(job), "--text"], tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"error: {job}:3: document exceeds a limit: nesting deeper than 64 levels"
    )
