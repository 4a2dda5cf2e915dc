"""A job too big to start is refused with the way out, not by the server after it passed.

Temporal refuses a start whose input is over 2 MiB ("Blob data size exceeds limit"), while
the DSL admits job files up to 16 MiB: a job with a long inline ``inputs.items`` passed
every check and then failed to start. ``client.mrp.refuse_oversized`` (the API's
``job_input`` and ``mrp run``) now refuses it first, naming ``inputs.files``. On the real
dev server: the premise, the largest input the limit admits starting, and the refusals.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from cli.mrp import EXIT_INVALID_JOB
from client.mrp import job_input, start_job
from keel.mrp.errors import DslError
from keel.mrp.run import MAX_JOB_INPUT_BYTES, MRPJobInput, workflow_id_for
from keel.settings import Settings
from tests.support.mrp_jobs import items_job_yaml

REPO = Path(__file__).resolve().parents[3]
ITEM = 30_000  # characters an item: a document to process, not a word


def job_text(job_id: str, items: int, last: int = ITEM) -> str:
    listed: list[object] = ["a" * ITEM] * (items - 1) + ["a" * last]
    return items_job_yaml(
        job_id, "word-count@1.0.0", {}, items, listed=listed, max_workers=2, budget_units="1000"
    )


def size(text: str, run_id: str = "") -> int:
    inp = MRPJobInput(job_yaml=text, source="job.yaml", run_id=run_id)
    return len(inp.model_dump_json().encode())


def largest_admitted(job_id: str, run_id: str) -> str:
    """The job of this shape whose input is the largest the limit admits (to the byte)."""
    items = MAX_JOB_INPUT_BYTES // ITEM
    while size(job_text(job_id, items), run_id) < MAX_JOB_INPUT_BYTES:
        items += 1
    lo, hi = 0, ITEM
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size(job_text(job_id, items, mid), run_id) <= MAX_JOB_INPUT_BYTES:
            lo = mid
        else:
            hi = mid - 1
    text = job_text(job_id, items, lo)
    assert size(text, run_id) == MAX_JOB_INPUT_BYTES
    return text


async def test_the_server_refuses_a_start_over_its_payload_limit(
    client: Client, settings: Settings
) -> None:
    """The premise: the limit is the server's, not Keel's taste."""
    text = job_text("too-big", 80)
    assert size(text) > 2 * 1024 * 1024
    with pytest.raises(RPCError, match="size exceeds limit"):
        await start_job(
            client,
            MRPJobInput(job_yaml=text, source="job.yaml", run_id="r1"),
            workflow_id=workflow_id_for("too-big", f"r-{uuid.uuid4().hex[:8]}"),
            task_queue=settings.task_queue,
        )


async def test_the_largest_admitted_job_starts_and_one_more_byte_is_refused(
    client: Client, settings: Settings
) -> None:
    run_id = f"edge-{uuid.uuid4().hex[:8]}"
    text = largest_admitted("edge", run_id)
    inp, job_id, _ = job_input(text, "job.yaml", "", run_id=run_id)
    handle = await start_job(
        client, inp, workflow_id=workflow_id_for(job_id, run_id), task_queue=settings.task_queue
    )
    try:
        assert (await handle.describe()).status is not None  # started: the server took it
    finally:
        await handle.terminate("test: only the start was checked")

    over = text.replace('["a', '["aa', 1)  # one byte more
    assert size(over, run_id) == MAX_JOB_INPUT_BYTES + 1
    with pytest.raises(DslError) as refused:
        job_input(over, "job.yaml", "", run_id=run_id)
    message = str(refused.value)
    assert "inputs.files" in message and f"{MAX_JOB_INPUT_BYTES:,}" in message


def test_mrp_run_refuses_it_before_starting_anything(tmp_path: Path) -> None:
    """``mrp run`` checks the job's size first: before compiling it, before any server."""
    job = tmp_path / "big.yaml"
    job.write_text(job_text("too-big", 80), encoding="utf-8")
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        # Nothing listens here: a run that tried to start would fail another way.
        "KEEL_TEMPORAL_ADDRESS": "127.0.0.1:9",
        "KEEL_METRICS_PORT": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "cli.mrp", "run", str(job), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == EXIT_INVALID_JOB, proc.stderr
    out = proc.stdout + proc.stderr
    assert "inputs.files" in out and "a Temporal payload may carry" in out, out
    assert not (tmp_path / "keel" / "temporal").exists()
