"""``KeelReaders`` set by a workflow on itself, for runs started before the attribute.

``keel migrate-search-attributes`` signals :data:`keel.access.READERS_SIGNAL` to each open
Keel run and gate that lacks ``KeelReaders``: Temporal lets only the workflow itself set a
search attribute on a running execution. The handler takes no argument: it derives the
readers from the workflow's own access memo (written by the API at start, which no one can
change later), or a gate's own request, so the signal cannot grant anyone a read.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from keel.access import ACCESS_MEMO, RunAccess, readers_of
    from keel.search_attributes import READERS_ATTRIBUTE

READERS_KEY = SearchAttributeKey.for_keyword_list(READERS_ATTRIBUTE)


def upsert_readers(fallback: RunAccess | None = None) -> None:
    """Set ``KeelReaders`` from this workflow's access memo (else ``fallback``); nothing
    when it has neither (a run only ``admin`` reads)."""
    try:
        access = workflow.memo_value(ACCESS_MEMO, None, type_hint=RunAccess)
    except (ValueError, TypeError):
        access = None
    access = access or fallback
    if access is not None:
        workflow.upsert_search_attributes([READERS_KEY.value_set(readers_of(access))])
