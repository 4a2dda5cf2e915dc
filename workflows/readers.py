"""What a run keeps about itself for lists to read: ``KeelReaders`` (set by a workflow on
itself, for runs started before the attribute) and its progress memo.

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
    from keel.progress import PROGRESS_MEMO, RunProgress
    from keel.search_attributes import READERS_ATTRIBUTE

#: Runs from before it keep no progress memo: their histories have no memo upserts.
PROGRESS_MEMO_PATCH = "keel-progress-memo"

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


class ProgressMemo:
    """A run's progress memo (:data:`keel.progress.PROGRESS_MEMO`), for ``GET /runs``.

    :meth:`show` upserts the memo when the progress changed since the last upsert (one
    ``WorkflowPropertiesModified`` event each, at a step boundary; no workflow task of its
    own: the command goes out with the task's others). Runs whose history began before
    patch ``keel-progress-memo`` never upsert, so their histories replay; :meth:`start`
    asks the patch once, at the first command of the run.
    """

    def __init__(self) -> None:
        self._on = False
        self._last: RunProgress | None = None

    def start(self) -> None:
        """Ask the patch (once per run, before the run's first command)."""
        self._on = workflow.patched(PROGRESS_MEMO_PATCH)

    def show(self, progress: RunProgress) -> None:
        if not self._on or progress == self._last:
            return
        self._last = progress
        workflow.upsert_memo({PROGRESS_MEMO: progress})
