"""A workflow's memo as a type, read from its description or a visibility row (no RPC):
one rule for every reader, a memo that is missing or of another shape reads as None."""

from __future__ import annotations

from typing import Any, TypeVar

from keel.access import ACCESS_MEMO, RunAccess

T = TypeVar("T")


async def memo_of(wf: Any, key: str, type_hint: type[T]) -> T | None:
    """Memo ``key`` of ``wf`` (a ``WorkflowExecutionDescription`` or a visibility row) as
    ``type_hint``; None when it has none, or one that does not read as ``type_hint``."""
    try:
        value = await wf.memo_value(key, None, type_hint=type_hint)
    except (ValueError, TypeError):
        return None
    return value if isinstance(value, type_hint) else None


async def access_memo_of(wf: Any) -> RunAccess | None:
    """Who may read ``wf`` as the API recorded it (``keel.access``), None without a record."""
    return await memo_of(wf, ACCESS_MEMO, RunAccess)
