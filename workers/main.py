"""The Keel worker: every workflow and activity on task queue ``keel``.

What it registers comes from the families registry (``workers/families.py``, the worker's
half of ``keel/families.py``): one entry per family, nothing listed here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.worker import Plugin, Worker

from keel.search_attributes import SEARCH_ATTRIBUTES
from keel.settings import Settings
from workers.families import activity_callables, worker_plugins, workflow_classes

log = logging.getLogger(__name__)

#: The workflow classes of Keel's families when this module was imported (the replayer's
#: and the benches'); a worker built later reads the registry again (workers/families.py).
WORKFLOWS: Sequence[type] = tuple(workflow_classes())


def plugins() -> list[Plugin]:
    """The worker's (and a replayer's) plugins: each family's (LangGraph, with the design
    graph), fresh ones each call."""
    return worker_plugins()


def build_activities(settings: Settings) -> list[Any]:
    """Every family's activity callables bound to their real clients, built from settings
    (workers/families.py)."""
    return activity_callables(settings)


def build_worker(
    client: Client,
    settings: Settings,
    *,
    task_queue: str | None = None,
    max_cached_workflows: int = 1000,
    extra_workflows: Sequence[type] = (),
) -> Worker:
    """A worker for every Keel workflow and activity (and ``extra_workflows``: the benches
    run their floor workflows in the same worker process)."""
    return Worker(
        client,
        task_queue=task_queue or settings.task_queue,
        workflows=[*workflow_classes(), *extra_workflows],
        activities=build_activities(settings),
        activity_executor=ThreadPoolExecutor(max_workers=8),
        max_cached_workflows=max_cached_workflows,
        plugins=plugins(),
    )


async def ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register Keel's search attributes on clusters that lack them (the dev server has them)."""
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {k: v for k, v in SEARCH_ATTRIBUTES.items() if k not in resp.custom_attributes}
    if not missing:
        return
    kinds = {
        "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
        "KeywordList": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD_LIST,
    }
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=namespace,
            search_attributes={k: kinds[v] for k, v in missing.items()},
        )
    )
    log.info("registered search attributes %s", sorted(missing))
