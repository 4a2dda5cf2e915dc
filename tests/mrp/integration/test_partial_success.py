"""``map.min_success_ratio`` end to end (Temporal dev server, threads backend).

The ``flaky`` test operator fails chosen shards on every attempt (``fail_times`` far above
the retry cap), so the same shards fail in every run. Above the ratio the job succeeds and
reduces over the shards that succeeded, with the same reduce and data-file digests as a run
of only those items; below it the job fails as one failed shard always did. Either way the
run manifest, ``mrp inspect`` and (when produced) the produce audit name every failed shard
and its error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from keel.mrp.run import ERROR_SHARD, MRPJobInput, MRPJobResult
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.mrp_runs import get_manifest, get_run
from tests.support.mrp_jobs import run_job
from workers.main import build_worker

REPO = Path(__file__).resolve().parents[3]
ITEMS = ["alpha beta", "gamma", "delta epsilon zeta", "eta", "theta iota", "kappa"]
FAILING = ["shard-000001", "shard-000004"]


def job(
    job_id: str, items: list[str], state_dir: Path, *, ratio: str | None, failing: list[str]
) -> str:
    ratio_line = f'\n  min_success_ratio: "{ratio}"' if ratio is not None else ""
    params = {"state_dir": str(state_dir), "fail_times": 1000, "only_shards": failing}
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {json.dumps(items)}
  by: item
map:
  operator: flaky@1.0.0
  params: {json.dumps(params)}{ratio_line}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/result.json}}
policy:
  max_workers: 2
  max_shard_retries: 1
  budget_units: "1000"
"""


def inspect(settings: Settings, run_id: str, *json_flag: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KEEL_DATA_DIR": str(settings.data_dir), "KEEL_METRICS_PORT": "0"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.mrp",
            "inspect",
            "--run-id",
            run_id,
            "--shards",
            "1",
            *json_flag,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def check_inspect_names_failed_shards(settings: Settings, run_id: str) -> None:
    """``mrp inspect`` lists every failed shard and why, beyond the --shards limit."""
    text = inspect(settings, run_id, "--text")
    assert text.returncode == 0, text.stderr
    assert f"failed shards {len(FAILING)}" in text.stdout
    for shard in FAILING:
        assert (
            f"{shard} after 2 attempts: operator flaky@1.0.0: FlakyFailure: {shard}: planned failure 2 of 1000"
            in text.stdout
        )
    doc: dict[str, Any] = json.loads(inspect(settings, run_id, "--json").stdout)
    assert [f["shard_id"] for f in doc["failed_shards"]] == FAILING
    assert all("planned failure" in f["error"] for f in doc["failed_shards"])


async def test_min_success_ratio_above_the_failed_share_reduces_over_the_rest(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    settings = mrp_settings
    async with build_worker(client, settings):
        partial = await run_job(
            client,
            settings,
            "partial-ok",
            MRPJobInput(
                job_yaml=job("partial-ok", ITEMS, tmp_path / "a", ratio="0.6", failing=FAILING),
                backend="threads",
            ),
        )
        # The same job with only the items of the shards that succeeded, none failing.
        kept = [item for i, item in enumerate(ITEMS) if f"shard-{i:06d}" not in FAILING]
        only: MRPJobResult = await run_job(
            client,
            settings,
            "partial-only",
            MRPJobInput(
                job_yaml=job("partial-only", kept, tmp_path / "b", ratio=None, failing=[]),
                backend="threads",
            ),
        )
    if partial.status != "succeeded":
        from store.mrp_runs import list_shards

        rows = list_shards(get_sessionmaker(settings.resolved_database_url), partial.run_id)
        raise AssertionError(
            [(r.shard_id, r.state, r.attempts, r.error) for r in rows], partial.cost
        )
    assert partial.counters.failed == 2 and partial.counters.total == 6
    assert partial.message == (
        "2 of 6 shards failed (shard-000001, shard-000004); 4 succeeded, min_success_ratio 0.6: "
        "reduced over the shards that succeeded"
    )
    # Deterministic: the reduce over the 4 shards that succeeded, in shard order, is the
    # reduce of a run of only those 4 items, and so is the data file.
    assert only.status == "succeeded" and only.counters.failed == 0
    assert partial.reduce_digest == only.reduce_digest
    assert (
        partial.output_digests["produced:out/result.json"]
        == only.output_digests["produced:out/result.json"]
    )
    data = json.loads((Path(partial.output_root or "") / "out/result.json").read_text())
    assert data["data"]["shards"] == 4

    # The run's record: every shard's state, the failed ones with their error.
    sm = get_sessionmaker(settings.resolved_database_url)
    manifest = get_manifest(sm, artifact_store_from_settings(settings), partial.run_id)
    assert manifest is not None and manifest.status == "succeeded"
    assert [s.shard_id for s in manifest.failed_shards()] == FAILING
    assert all("planned failure 2 of 1000" in (s.error or "") for s in manifest.failed_shards())
    assert [s.state for s in manifest.shards].count("succeeded") == 4

    # The produce audit names every failed shard and why.
    audit = (Path(partial.output_root or "") / "out/result.json.audit.jsonl").read_text()
    [record] = [json.loads(line) for line in audit.splitlines()]
    assert [(f["shard_id"], f["attempts"]) for f in record["failed_shards"]] == [
        (s, 2) for s in FAILING
    ]
    assert all("FlakyFailure" in f["error"] for f in record["failed_shards"])
    # A complete run's audit has no such key (audit logs of old jobs are unchanged).
    only_audit = (Path(only.output_root or "") / "out/result.json.audit.jsonl").read_text()
    assert "failed_shards" not in only_audit

    check_inspect_names_failed_shards(settings, partial.run_id)

    # A replay fails the same shards and reproduces every digest, the audit with its
    # errors too (the flaky operator counts attempts on disk: start its count afresh).
    shutil.rmtree(tmp_path / "a")
    async with build_worker(client, settings):
        replay = await run_job(
            client, settings, "partial-ok", MRPJobInput(replay_of=partial.run_id, backend="threads")
        )
    assert replay.status == "succeeded" and replay.replay_matched is True
    assert replay.output_digests["reduce"] == partial.output_digests["reduce"]


@pytest.mark.parametrize("ratio", ["0.8", None], ids=["ratio-0.8", "default-1"])
async def test_min_success_ratio_below_the_failed_share_fails_the_job(
    client: Client, mrp_settings: Settings, tmp_path: Path, ratio: str | None
) -> None:
    """4 of 6 succeeded is under 0.8, and under the default 1: the job fails, nothing is
    reduced or produced, and inspect names the failed shards."""
    settings = mrp_settings
    job_id = f"partial-low-{'default' if ratio is None else 'ratio'}"
    async with build_worker(client, settings):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client,
                settings,
                job_id,
                MRPJobInput(
                    job_yaml=job(job_id, ITEMS, tmp_path, ratio=ratio, failing=FAILING),
                    backend="threads",
                ),
            )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_SHARD
    run_id = cause.details[-1]["run_id"]  # type: ignore[index]
    if ratio is not None:
        assert cause.message == (
            "2 of 6 shards failed (shard-000001, shard-000004); 4 succeeded, "
            "min_success_ratio 0.8 needs more (see mrp inspect for each shard's error)"
        )
    else:
        # Today's behaviour, unchanged: the first failed shard fails its window, and so the job.
        assert cause.message.startswith("shard shard-00000") and "planned failure" in str(cause)
    sm = get_sessionmaker(settings.resolved_database_url)
    run = get_run(sm, run_id)
    assert run is not None and run.status == "failed" and run.reduce_digest is None
    manifest = get_manifest(sm, artifact_store_from_settings(settings), run_id)
    assert manifest is not None and manifest.produced == []
    if ratio is not None:
        # Every shard ran (none was stopped early): the failed ones are named with why.
        assert [s.shard_id for s in manifest.failed_shards()] == FAILING
        check_inspect_names_failed_shards(settings, run_id)
