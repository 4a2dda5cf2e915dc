"""``keel migrate-search-attributes``: ``KeelReaders`` on open runs and gates started
before it existed.

Temporal lets only a workflow set its own search attributes, so this lists the open Keel
runs and gates (one visibility query, walked once: an operator's one-off, not a read path)
and signals each one that lacks ``KeelReaders`` with :data:`keel.access.READERS_SIGNAL`;
the workflow sets the attribute from its own access memo (a gate: else its request), so
the signal grants no one a read. A run without a memo (started outside the API) stays
``admin``'s only. Closed workflows cannot be changed and stay ``admin``'s only in lists.
"""

from __future__ import annotations

from temporalio.client import Client

from client.temporal import READERS_KEY, quoted
from keel.access import READERS_SIGNAL
from keel.families import reader_types


async def migrate_readers(
    client: Client, *, dry_run: bool = False, task_queue: str | None = None
) -> list[str]:
    """Signal every open Keel run and gate without ``KeelReaders`` (on ``task_queue``, when
    given) to set it; the ids it signalled (with ``dry_run``: would signal)."""
    # The families whose runs answer the signal (``answers_readers`` in keel/families.py).
    types = ", ".join(f'"{t}"' for t in reader_types())
    query = f'ExecutionStatus = "Running" AND WorkflowType IN ({types})'
    if task_queue:
        query += f" AND TaskQueue = {quoted(task_queue)}"
    ids: list[str] = []
    async for wf in client.list_workflows(query):
        if wf.typed_search_attributes.get(READERS_KEY) is not None:
            continue
        if not dry_run:
            await client.get_workflow_handle(wf.id, run_id=wf.run_id).signal(READERS_SIGNAL)
        ids.append(wf.id)
    return ids
