"""The ``mrp`` CLI as a user runs it (subprocesses), against the session's dev server.

No worker polls the test's task queue, so ``mrp run`` and ``mrp replay`` start one
(``keel worker``) and stop it afterwards; output is JSON because stdout is a pipe.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from keel.digest import digest_bytes
from keel.mrp.run import run_manifest_from_json
from keel.settings import Settings
from services.processes import stop_pid
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.models import MrpRunRow
from tests.support.faults import wait_gone_sync

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples" / "mrp"
MRP = [sys.executable, "-m", "cli.mrp"]


@pytest.fixture
def env(tmp_path: Path, temporal_address: str) -> dict[str, str]:
    return {
        **os.environ,
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        "KEEL_TEMPORAL_ADDRESS": temporal_address,
        "KEEL_TASK_QUEUE": f"mrp-cli-{uuid.uuid4()}",
        "KEEL_METRICS_PORT": "0",
    }


def mrp(
    args: list[str], env: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        MRP + args, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO
    )


def doc(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def settings_of(env: dict[str, str]) -> Settings:
    return Settings(env="test", data_dir=Path(env["KEEL_DATA_DIR"]))


def test_compile_writes_ir_manifest_and_report(tmp_path: Path, env: dict[str, str]) -> None:
    out = tmp_path / "compiled"
    proc = mrp(["compile", str(EXAMPLES / "wordcount.yaml"), "--out", str(out)], env)
    assert proc.returncode == 0, proc.stderr
    got = doc(proc)
    assert got["job_id"] == "example-wordcount" and got["shards"] == 4
    for name in ("IR.json", "manifest.json", "policy_report.json"):
        assert (out / name).stat().st_size > 0
    assert digest_bytes((out / "IR.json").read_bytes()) == got["ir_digest"]
    assert digest_bytes((out / "manifest.json").read_bytes()) == got["manifest_digest"]
    text = mrp(["compile", str(EXAMPLES / "invoices.yaml"), "--text", "--out", str(out)], env)
    assert text.returncode == 0 and "example-invoices: compiled, 3 shards" in text.stdout


def test_compile_refusals_name_the_rule_and_the_line(tmp_path: Path, env: dict[str, str]) -> None:
    source = (EXAMPLES / "invoices.yaml").read_text()
    over = tmp_path / "over.yaml"
    over.write_text(source.replace("max_workers: 2", "max_workers: 64"))
    line = 1 + source.splitlines().index("  max_workers: 2")
    proc = mrp(["compile", str(over), "--out", str(tmp_path / "o")], env)
    assert proc.returncode == 4, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first == (
        f"error: {over}:{line}: MRP-P001 max_workers over cap at policy.max_workers: "
        "asks for 64 workers; the cap is 32"
    )
    assert doc(proc)["error"]["code"] == "refused"
    report = json.loads((tmp_path / "o" / "policy_report.json").read_text())
    assert [v["rule_id"] for v in report["violations"]] == ["MRP-P001"]

    typo = tmp_path / "typo.yaml"
    typo.write_text(source.replace("  params: {field: amount}", "  parms: {field: amount}"))
    proc = mrp(["compile", str(typo), "--text"], env)
    assert proc.returncode == 3
    assert re.match(rf"error: {re.escape(str(typo))}:\d+: map.parms: unknown field", proc.stderr)

    assert mrp(["compile", str(tmp_path / "missing.yaml")], env).returncode == 2
    assert mrp(["run", str(over), "--backend", "threads"], env).returncode == 4  # before any start


def test_compile_refuses_a_destination_the_runtime_cannot_write(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """The shipped caps admit no URI prefix; a config admitting gs:// still cannot make the
    runtime write there: MRP-P016 refuses it at compile, naming the line."""
    source = (EXAMPLES / "wordcount.yaml").read_text()
    line = 1 + next(i for i, t in enumerate(source.splitlines()) if "destination:" in t)
    job = tmp_path / "gs.yaml"
    shutil.copytree(EXAMPLES / "data", tmp_path / "data")
    job.write_text(
        source.replace("destination: wordcount.json", 'destination: "gs://keel-out/wc.json"')
    )
    config = yaml.safe_load((REPO / "configs" / "mrp.yaml").read_text())
    config["operator_paths"] = [str(REPO / "operators")]
    config["caps"]["allowed_destination_prefixes"] = ["gs://keel-out/"]
    (tmp_path / "mrp.yaml").write_text(yaml.safe_dump(config))
    proc = mrp(
        ["compile", str(job), "--text"], {**env, "KEEL_MRP_CONFIG": str(tmp_path / "mrp.yaml")}
    )
    assert proc.returncode == 4, proc.stderr
    assert proc.stderr.splitlines()[0] == (
        f"error: {job}:{line}: MRP-P016 sink not writable at produce.sink.destination: "
        "destination 'gs://keel-out/wc.json' uses scheme 'gs', which this runtime cannot "
        "write (it writes relative paths under the run's output root and s3:// URIs)"
    )
    # Run refuses it the same way, before any workflow starts.
    run = mrp(
        ["run", str(job), "--backend", "threads"],
        {**env, "KEEL_MRP_CONFIG": str(tmp_path / "mrp.yaml")},
    )
    assert run.returncode == 4 and "MRP-P016" in run.stderr


def test_run_inspect_download_and_replay(tmp_path: Path, env: dict[str, str]) -> None:
    proc = mrp(["run", str(EXAMPLES / "wordcount.yaml"), "--backend", "threads"], env)
    assert proc.returncode == 0, proc.stderr
    assert "starting one" in proc.stderr  # no worker polled the queue: the CLI started one
    result = doc(proc)
    assert result["status"] == "succeeded" and result["counters"]["run"] == 4
    run_id = result["run_id"]
    worker_log = Path(env["KEEL_DATA_DIR"]) / "logs" / "mrp-worker.log"
    assert "worker stopped" in worker_log.read_text()  # and stopped it afterwards

    dest = tmp_path / "download"
    proc = mrp(["inspect", "--run-id", run_id, "--download", str(dest)], env)
    assert proc.returncode == 0, proc.stderr
    seen = doc(proc)
    assert seen["run"]["status"] == "succeeded"
    assert [s["shard_id"] for s in seen["shards"]] == [f"shard-00000{i}" for i in range(4)]
    assert seen["manifest"]["job_id"] == "example-wordcount"
    assert set(seen["run_manifest"]["phase_timings"]) >= {"compile", "map", "reduce", "produce"}
    out = dest / "wordcount.json"
    assert digest_bytes(out.read_bytes()) == result["output_digests"]["produced:wordcount.json"]
    for name in ("IR.json", "manifest.json", "run-manifest.json", "wordcount.json.audit.jsonl"):
        assert (dest / name).exists()
    text = mrp(["inspect", "--run-id", run_id, "--text"], env)
    assert "shard-000003 succeeded" in text.stdout and "phases       compile" in text.stdout

    proc = mrp(["replay", "--run-id", run_id], env)
    assert proc.returncode == 0, proc.stderr
    replay = doc(proc)
    assert replay["compared"] == replay["matched"] == 4 + 1 + 2  # shards, reduce, two files
    assert replay["first_difference"] is None

    # Make the stored original disagree on shard 2: replay names that shard and exits 6.
    settings = settings_of(env)
    store = artifact_store_from_settings(settings)
    sessions = get_sessionmaker(settings.resolved_database_url)
    with sessions.begin() as s:
        row = s.get(MrpRunRow, run_id)
        assert row is not None and row.run_manifest_digest is not None
        manifest = run_manifest_from_json(store.get_bytes(row.run_manifest_digest))
        manifest.shards[2].output_digest = digest_bytes(b"something else")
        row.run_manifest_digest = store.put_bytes(manifest.to_json())
    proc = mrp(["replay", "--run-id", run_id], env)
    assert proc.returncode == 6, proc.stderr
    assert f"error: replay of {run_id} differs first at shard-000002" in proc.stderr
    failed = doc(proc)["error"]
    assert failed["code"] == "replay_mismatch"
    assert failed["details"]["first_difference"] == "shard-000002"

    missing = mrp(["inspect", "--run-id", "no-such-run"], env)
    assert missing.returncode == 7 and "no MRP run 'no-such-run'" in missing.stderr


def test_run_no_wait_leaves_the_worker_it_started(env: dict[str, str]) -> None:
    proc = mrp(["run", str(EXAMPLES / "invoices.yaml"), "--backend", "threads", "--no-wait"], env)
    assert proc.returncode == 0, proc.stderr
    started = doc(proc)
    assert started["status"] == "running"
    pid = int(re.search(r"worker stays up \(pid (\d+)\)", proc.stderr).group(1))  # type: ignore[union-attr]
    try:
        deadline = time.monotonic() + 120
        while True:
            seen = mrp(["inspect", "--run-id", started["run_id"]], env)
            if seen.returncode == 0 and doc(seen)["run"]["status"] != "running":
                break
            assert time.monotonic() < deadline, seen.stderr
            time.sleep(0.5)
        assert doc(seen)["run"]["status"] == "succeeded"
    finally:
        stop_pid(pid)
    wait_gone_sync([pid], what=f"process {pid} to be gone")
