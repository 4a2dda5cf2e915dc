"""A collection run's history grows by a few events per episode, so even the largest run
(``MAX_PER_RUN`` episodes before continue-as-new) stays under Temporal's 10k-event
guidance and 10,000 tasks are many small runs."""

from __future__ import annotations

import uuid

from temporalio.client import Client
from temporalio.worker import Worker

from client.srl import start_collection, upload_tasks
from keel.settings import Settings
from keel.srl.steps import MAX_PER_RUN, CollectionInput
from store.artifacts import artifact_store_from_settings
from tests.srl.conftest import HAND_TASKS, tasks_jsonl


async def test_events_per_episode_keep_the_largest_run_under_10k_events(
    client: Client, settings: Settings, worker: Worker
) -> None:
    tasks = [{**HAND_TASKS[i % 6], "task_id": f"t{i}"} for i in range(24)]
    digest, count = upload_tasks(artifact_store_from_settings(settings), tasks_jsonl(tasks))
    inp = CollectionInput(
        collection=f"size-{uuid.uuid4().hex[:8]}", tasks_digest=digest, task_count=count,
        window=8, per_run=12,
    )  # fmt: skip
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    result = await handle.result()
    assert result.totals.verified_steps == 24
    first = client.get_workflow_handle(handle.id, run_id=handle.first_execution_run_id)
    events = [e async for e in first.fetch_history_events()]
    per_episode = len(events) / 12
    # Measured: 74 events for 12 episodes (start initiated, started, completed, and the
    # workflow tasks around completions, shared between episodes ending together); 103
    # since the run keeps its progress memo (one upsert as each episode ends, patch
    # keel-progress-memo): 8.6 an episode, 8,633 at MAX_PER_RUN.
    assert per_episode <= 9, f"{len(events)} events for 12 episodes"
    assert per_episode * MAX_PER_RUN + 50 < 10_000
