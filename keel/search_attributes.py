"""Keel's custom search attributes: the names workflows upsert and clients query by.

They live apart from the family models so that code which only needs the names (starting
a dev server, registering them on a cluster) imports no models: ``runllm run`` used to
import all of ``keel.mrp`` (about 0.1 s) for one string.
"""

from __future__ import annotations

#: An approval gate's status (``pending``, ``approved``, ...).
GATE_STATUS_ATTRIBUTE = "KeelGateStatus"
#: An approval gate's name.
GATE_NAME_ATTRIBUTE = "KeelGateName"
#: An MRP run's run id, so a run id finds its workflow id in one visibility query.
RUN_ID_ATTRIBUTE = "KeelMrpRunId"

#: Who may read a workflow through the API (a KeywordList): ``user:<name>`` for its owner
#: (a gate's requester) and each approver it names, ``role:approver`` when a gate names none
#: (:func:`keel.access.readers_of`). Set at start, so ``GET /gates`` and ``GET /runs`` ask
#: visibility for the caller's rows instead of walking everyone's.
READERS_ATTRIBUTE = "KeelReaders"

#: Every one of them, with its kind: registered on each server Keel starts or joins.
SEARCH_ATTRIBUTES: dict[str, str] = {
    GATE_STATUS_ATTRIBUTE: "Keyword",
    GATE_NAME_ATTRIBUTE: "Keyword",
    RUN_ID_ATTRIBUTE: "Keyword",
    READERS_ATTRIBUTE: "KeywordList",
}
