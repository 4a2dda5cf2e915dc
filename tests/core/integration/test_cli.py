"""The `keel` CLI as a user runs it: up (and a second up refused), status, down, demo, clean exits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.model_server import unavailable_reason
from services.processes import free_port

KEEL = [sys.executable, "-m", "cli.keel"]
EXPECTED = Path(__file__).resolve().parents[3] / "examples" / "mrp" / "expected"


def keel_env(data_dir: Path) -> dict[str, str]:
    """A private instance: its own data dir and ports, so tests never meet a user's Keel."""
    return {
        **os.environ,
        "KEEL_DATA_DIR": str(data_dir),
        "KEEL_DEV_SERVER_PORT": str(free_port()),
        "KEEL_DEV_SERVER_UI_PORT": str(free_port()),
        "KEEL_API_PORT": str(free_port()),
        "KEEL_MODEL_SERVER_PORT": str(free_port()),
        "KEEL_TEMPORAL_ADDRESS": "",
    }


def run(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``keel ARGS``; past ``timeout`` (or the test's own timeout) it gets SIGTERM first (so a demo stops the keel up it
    started, which SIGKILL would orphan), then SIGKILL."""
    proc = subprocess.Popen(
        KEEL + args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # our timeout, or pytest-timeout's failure raised meanwhile
        proc.terminate()
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_up(up: subprocess.Popen[str]) -> None:
    """Stop a ``keel up`` a test started, and everything it started, even when the test
    failed halfway: SIGTERM makes it stop its services; SIGKILL alone would orphan them."""
    if up.poll() is not None:
        return
    up.terminate()
    try:
        up.wait(timeout=60)
    except subprocess.TimeoutExpired:
        up.kill()


def test_help_is_clean_and_imports_no_runtime():
    """``keel --help`` imports neither LiteLLM, the Temporal worker, Ray nor SQLAlchemy
    (what makes it fast, checked by what it imports rather than by a clock)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli.keel", "--help"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "demo" in proc.stdout
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "cli.keel" in imported or "cli" in imported, proc.stderr[-2000:]
    for heavy in ("litellm", "temporalio.worker", "ray", "sqlalchemy"):
        assert heavy not in imported, heavy


def test_cli_exits_cleanly_after_using_the_temporal_client(tmp_path, temporal_address):
    """sdk-python issue 300: exit crashes after client use; os._exit in main() avoids them."""
    env = {**keel_env(tmp_path / "keel"), "KEEL_TEMPORAL_ADDRESS": temporal_address}
    for _ in range(8):
        proc = run(["ping", "--text"], env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "Temporal answers" in proc.stdout
        assert "PyGILState" not in proc.stderr and "Fatal Python error" not in proc.stderr


@pytest.mark.slow
@pytest.mark.embedded_model
@pytest.mark.timeout(600)  # the demo's own limit below; it took 156 s on a loaded 2-core host
def test_demo_end_to_end(tmp_path):
    """The README's first command: gate opened, approved through the API, workflow done."""
    if unavailable_reason():
        pytest.skip(f"local model not installed: {unavailable_reason()}")
    env = keel_env(tmp_path / "keel") | {"KEEL_WORKER_PRELOAD": "true"}  # the default
    proc = run(["demo"], env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "Gate opened: demo/" in out
    assert "Approved through the API" in out
    assert "Workflow completed: published=True" in out
    assert "/namespaces/default/workflows/demo%2F" in out
    assert "The Keel console (design sessions, approval inbox, runs): http://127.0.0.1:" in out
    for name in ("summary", "extract_keywords", "compose_summary_keywords"):
        assert f"examples/{name}.rllm -> {{" in out  # the .rllm examples ran and printed
    # ... each output checked against its schema and its input, the model calls printed
    # (the composition makes none of its own: its children's are printed by alias).
    assert out.count("output_schema: matches; content (") == 3, out
    assert out.count("): holds") >= 3, out
    assert out.count("      attempt 1 (prompt): ") == 2, out
    assert "keywords_of (extract_keywords): attempt 1 (prompt): " in out, out
    for job in ("wordcount", "sentiment", "invoices"):  # the MRP examples ran and were checked
        assert f"examples/mrp/{job}.yaml: succeeded" in out
    assert out.count("matches golden.json") == 2, out  # the pure examples' digests
    # ... and their values, against examples/mrp/expected (worked out apart from Keel).
    expected = json.loads((EXPECTED / "wordcount.json").read_text())
    n = len(expected["counts"])
    assert f"word counts: {n} distinct words, {n} match expected; 4 files" in out, out
    assert "words per file: match expected (examples/mrp/expected/wordcount.json)" in out
    assert "3 shards; 4 of 4 values match expected (examples/mrp/expected/invoices.json)" in out
    assert re.search(r"\d of 4 replies had a label word \(.*\); \d unlabeled", out), out
    assert "matched every digest" in out, out  # the LLM example, by replay
    # The SRL collection: the local model as teacher (whatever its precision), then the
    # gold actions, each of the six verified.
    assert "8. SRL collection on examples/srl/tasks.jsonl" in out, out
    assert "gold_replay gold python: 3/3 verified" in out, out
    assert "gold_replay gold java: 1/1 verified" in out, out
    # The design step: a guided form to a generated repository that no validator failed.
    assert "9. Design pipeline on a guided intake form" in out, out
    assert "/ds1: completed, version 1, 8 capabilities" in out, out
    assert "validators: secrets passed, ruff passed, mypy passed, pytest passed" in out, out
    assert "validators: 11 passed, 0 failed, 0 not run (every validator" in out, out
    assert "All checks passed." in out
    assert not (tmp_path / "keel" / "run" / "up.json").exists()  # the demo stopped what it started


def test_bad_settings_give_one_clear_line(tmp_path):
    env = {**keel_env(tmp_path / "keel"), "KEEL_API_TOKENS": "not json"}
    proc = run(["status"], env)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: SettingsError") and "api_tokens" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("script", ["keel", "mrp", "runllm", "srl", "design"])
def test_installed_scripts_run_from_any_folder(script: str, tmp_path: Path) -> None:
    """The README runs `.venv/bin/keel`, whose sys.path starts at .venv/bin, not the repo:
    a dependency's own top-level `cli` package (python-hcl2 8 ships one) would shadow
    ours and every command would fail to import."""
    proc = subprocess.run(
        [str(Path(sys.executable).parent / script), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"Usage: {script}" in proc.stdout
