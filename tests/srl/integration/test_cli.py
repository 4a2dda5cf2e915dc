"""The ``srl`` CLI as a user runs it (subprocesses), against the session's dev server: no
worker polls the test's task queue, so ``srl collect`` starts one and stops it; output is
JSON because stdout is a pipe."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from temporalio.client import Client

from tests.srl.conftest import EXAMPLE_TASKS, HAND_TASKS, collection_events

REPO = Path(__file__).resolve().parents[3]
SRL = [sys.executable, "-m", "cli.srl"]


@pytest.fixture
def env(tmp_path: Path, temporal_address: str) -> dict[str, str]:
    return {
        **os.environ,
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        "KEEL_TEMPORAL_ADDRESS": temporal_address,
        "KEEL_TASK_QUEUE": f"srl-cli-{uuid.uuid4()}",
        "KEEL_METRICS_PORT": "0",
    }


def srl(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        SRL + args, env=env, capture_output=True, text=True, timeout=240, cwd=REPO
    )


def doc(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_collect_report_export_state(env: dict[str, str], tmp_path: Path) -> None:
    proc = srl(["collect", str(EXAMPLE_TASKS), "--collection", "cli1", "--limit", "4"], env)
    assert proc.returncode == 0, proc.stderr
    result = doc(proc)
    assert result["task_count"] == 4 and result["totals"]["verified_steps"] == 4

    report = srl(["report", "--collection", "cli1", "--out", str(tmp_path / "r.md")], env)
    assert report.returncode == 0, report.stderr
    lines = {(x["language"], x["verified"], x["total"]) for x in doc(report)["lines"]}
    assert lines == {("python", 3, 3), ("javascript", 1, 1)}
    assert (
        "| gold_replay | gold | python | hand | 3 | 3 | 100.0% |" in (tmp_path / "r.md").read_text()
    )

    out = tmp_path / "export"
    exported = srl(["export", "--collection", "cli1", "--out", str(out)], env)
    assert exported.returncode == 0, exported.stderr
    table = pq.read_table(out / "steps.parquet")
    assert table.num_rows == 4
    assert set(table.column("verified").to_pylist()) == {True}
    assert {"reward_total", "step_similarity", "diff_lines", "record_json"} <= set(
        table.column_names
    )
    # A gold replay without an expert set: each completion thinks from its task's
    # instruction (the task file found through the collection's identity).
    rows = table.select(["task_id", "think_source", "think", "completion"]).to_pylist()
    assert {r["think_source"] for r in rows} == {"instruction"}
    for r in rows:
        task = next(t for t in HAND_TASKS if t["task_id"] == r["task_id"])
        assert task["instruction"] in r["think"]
        assert f"<think>{r['think']}</think>" in r["completion"][0]["content"]
    records = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [r["task_id"] for r in records] == ["js-rename", "py-none", "py-rename", "py-swap"]
    assert all(r["schema_version"] == 1 and r["reward"]["verified"] for r in records)

    state = srl(["state", "dump", "py-swap", "--collection", "cli1"], env)
    assert state.returncode == 0, state.stderr
    dumped = doc(state)
    assert dumped["step"] == 1
    swap = next(t for t in HAND_TASKS if t["task_id"] == "py-swap")
    assert dumped["state"]["goals"] == [swap["instruction"]]
    # No expert-derived feedback by default (--expert-feedback): only that the file changed.
    assert dumped["state"]["history"] == ["step 1: applied; the file changed"]


def test_errors_are_the_envelope_with_srl_exit_codes(env: dict[str, str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x"}\n')
    proc = srl(["collect", str(bad), "--collection", "c"], env)
    assert proc.returncode == 8, proc.stderr
    err = doc(proc)["error"]
    assert err["family"] == "srl" and err["type"] == "invalid_input"
    assert "task file line 1: instruction: Field required" in err["message"]
    missing = srl(["report", "--collection", "nothing-here"], env)
    assert missing.returncode == 6 and doc(missing)["error"]["type"] == "not_found"
    usage = srl(["collect", str(bad), "--collection", "c", "--source", "oracle"], env)
    assert usage.returncode == 2 and "--source must be" in usage.stderr
    mode = srl(["collect", str(bad), "--collection", "c", "--step-mode", "expert"], env)
    assert mode.returncode == 2 and "--step-mode must be" in mode.stderr
    for batch, says in (("-1", "greater than or equal to 0"), ("1001", "less than or equal")):
        over = srl(["collect", str(bad), "--collection", "c", "--batch", batch], env)
        assert over.returncode == 2, over.stderr
        err = doc(over)["error"]
        assert err["type"] == "usage"
        assert "'--batch'" in err["message"] and says in err["message"], err


def test_collect_again_reuses_its_steps_and_refuses_another_source(
    env: dict[str, str],
) -> None:
    args = ["collect", str(EXAMPLE_TASKS), "--collection", "cli-again", "--limit", "2"]
    first = srl([*args, "--samples", "2"], env)
    assert first.returncode == 0, first.stderr
    t = doc(first)["totals"]
    assert (t["episodes"], t["steps"], t["reused_steps"]) == (4, 4, 0)

    again = srl([*args, "--samples", "2"], env)
    assert again.returncode == 0, again.stderr
    t = doc(again)["totals"]
    assert (t["episodes"], t["steps"], t["verified_steps"], t["reused_steps"]) == (4, 4, 4, 4)

    other = srl([*args, "--source", "teacher", "--model", "local"], env)
    assert other.returncode == 8, other.stderr
    err = doc(other)["error"]
    assert err["type"] == "invalid_input"
    assert "source 'gold_replay', model ''" in err["message"]
    assert "source 'teacher', model 'local'" in err["message"]


async def test_collect_with_batch_runs_its_episodes_in_srl_episodes(
    env: dict[str, str], client: Client
) -> None:
    """``--batch 2`` over three tasks: two ``srl.episodes`` activities (2 + 1 episodes), no
    child ``SRLEpisode`` workflow, every step verified and recorded."""
    collection = f"cli-batch-{uuid.uuid4().hex[:8]}"
    args = ["collect", str(EXAMPLE_TASKS), "-c", collection, "--limit", "3", "--batch", "2"]
    proc = await asyncio.to_thread(srl, args, env)
    assert proc.returncode == 0, proc.stderr
    t = doc(proc)["totals"]
    assert (t["episodes"], t["steps"], t["verified_steps"], t["failed_episodes"]) == (3, 3, 3, 0)
    types, activities = await collection_events(client, collection)
    assert activities == ["srl.window", "srl.episodes", "srl.episodes"], activities
    assert "EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED" not in types
