"""Record the replay histories of a batched collection (patch ``srl-batched-episodes``):
``uv run python -m tests.srl.record_batched``.

The scenario joins ``tests/histories/record.py``'s (same dev server, scripted model,
worker and fixed ids; its module docstring says when to re-record) and writes
``tests/histories/srl_collection_batched.json`` and ``..._batched_last.json``, which
``tests/test_replay.py`` replays with the rest of the corpus. ``--out DIR`` writes
elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import logging
import sys
from pathlib import Path

from client.srl import start_collection, upload_tasks
from keel.srl.steps import CollectionInput
from store.artifacts import artifact_store_from_settings
from tests.histories import HISTORIES_DIR
from tests.histories.record import (
    ID_PREFIX,
    SCENARIOS,
    Ctx,
    Histories,
    expect,
    history_json,
    record,
)
from tests.support.scripted_openai import ScriptedReply
from tests.support.srl import SWAP_ANSWER, divide_tasks, tasks_jsonl

NAME = "srl_batched"


async def srl_batched(ctx: Ctx) -> Histories:
    """A teacher collection of three tasks in batches of two (``srl.episodes``), two tasks
    a run (so it continues as new once), free running; one answer is malformed, so its
    episode takes a second, verified step inside the batch."""
    data = tasks_jsonl(divide_tasks(3))
    digest, count = upload_tasks(artifact_store_from_settings(ctx.settings), data)
    inp = CollectionInput(
        collection=f"{ID_PREFIX}-srl-batched",
        tasks_digest=digest,
        task_count=count,
        source="teacher",
        model="local",
        window=2,
        per_run=2,
        batch=2,
        step_mode="free_running",
    )
    before = ctx.llm.default
    ctx.llm.enqueue(ScriptedReply(content="no tags at all"))
    ctx.llm.default = ScriptedReply(content=SWAP_ANSWER)
    try:
        handle = await start_collection(ctx.client, inp, task_queue=ctx.task_queue)
        result = await handle.result()
    finally:
        ctx.llm.default = before
    t = result.totals
    expect((t.episodes, t.steps, t.verified_steps, t.format_errors) == (3, 4, 3, 1), f"{t}")
    first_run = ctx.client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    first = await history_json(first_run)
    marker = base64.b64encode(b'{"id":"srl-batched-episodes","deprecated":false}').decode()
    expect(marker in first, "the batched-episodes patch marker is recorded")
    expect('"srl.episodes"' in first, "the episodes ran in srl.episodes")
    return {
        "srl_collection_batched": first,
        "srl_collection_batched_last": await history_json(handle),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=HISTORIES_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tests.histories.record").setLevel(logging.INFO)
    SCENARIOS[NAME] = srl_batched
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(record([NAME], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
