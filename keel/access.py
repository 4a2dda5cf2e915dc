"""Who may read a run or a gate through the API: its owner, the approvers of its gates, admin.

The API records a :class:`RunAccess` in the memo of each workflow it starts (``.rllm``
runs, MRP jobs, gates) under :data:`ACCESS_MEMO`. A memo is written atomically with the
start, so no run exists without its owner; it needs no search attribute registered on the
namespace; it comes back with ``describe()`` and with each ``list_workflows`` row, which
the read routes fetch anyway; and workflow code cannot change it later. A run without it
(started by ``runllm``, ``mrp run`` or ``temporal workflow start``) has no API owner, so
only ``admin`` reads it over the API.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

ACCESS_MEMO = "keel_access"
#: The signal (no argument) that has a run or gate set ``KeelReaders`` from its own memo.
READERS_SIGNAL = "keel_refresh_readers"
ADMIN_ROLE = "admin"
APPROVER_ROLE = "approver"


class RunAccess(BaseModel):
    """Who started a run and who decides its gates (the memo :data:`ACCESS_MEMO`).

    ``approvers`` lists the actors named on the run's gates; ``any_approver`` is set when a
    gate names none, so that any caller with the approver role may decide it (and read it).
    """

    model_config = ConfigDict(extra="ignore")

    owner: str = Field(min_length=1, max_length=256)
    approvers: list[str] = Field(default_factory=list)
    any_approver: bool = False


def access_for(owner: str, gates: Iterable[list[str]] = ()) -> RunAccess:
    """The access record of a run ``owner`` starts with gates naming these approver lists
    (an empty list: any approver)."""
    approvers: list[str] = []
    any_approver = False
    for names in gates:
        if not names:
            any_approver = True
        approvers += [n for n in names if n not in approvers]
    return RunAccess(owner=owner, approvers=approvers, any_approver=any_approver)


def may_read(access: RunAccess | None, actor: str, roles: frozenset[str]) -> bool:
    """Whether the caller ``actor`` with ``roles`` may read the run ``access`` describes."""
    if ADMIN_ROLE in roles:
        return True
    if access is None:
        return False
    if actor == access.owner or actor in access.approvers:
        return True
    return access.any_approver and APPROVER_ROLE in roles


#: The reader that stands for "any caller with the approver role" (a gate naming no approver).
ANY_APPROVER_READER = f"role:{APPROVER_ROLE}"


#: User names that go into ``KeelReaders`` as they are; any other is hex-encoded.
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._@+-]{1,200}")


def user_reader(actor: str) -> str:
    """The reader value of user ``actor``: ``user:<name>`` (prefixed, so no user name reads
    as a role), or ``userx:<hex of its UTF-8>`` for a name with any other character. A
    visibility store may not take every character in a query literal (SQLite's full-text
    index of KeywordList values fails on a quote or a backslash), so such names never
    reach one; the two prefixes keep the encodings apart."""
    if _PLAIN_NAME.fullmatch(actor):
        return f"user:{actor}"
    return f"userx:{actor.encode().hex()}"


def readers_of(access: RunAccess) -> list[str]:
    """The values of the ``KeelReaders`` search attribute for a run with ``access``: the
    same callers :func:`may_read` admits (``admin`` aside, who needs no value)."""
    readers = [user_reader(access.owner)]
    readers += [user_reader(a) for a in access.approvers if user_reader(a) not in readers]
    if access.any_approver:
        readers.append(ANY_APPROVER_READER)
    return readers


def reader_terms(actor: str, roles: frozenset[str]) -> list[str] | None:
    """The ``KeelReaders`` values a caller's rows carry, any one of which admits a row;
    None for ``admin``, who reads every row (those without the attribute too)."""
    if ADMIN_ROLE in roles:
        return None
    terms = [user_reader(actor)]
    if APPROVER_ROLE in roles:
        terms.append(ANY_APPROVER_READER)
    return terms
