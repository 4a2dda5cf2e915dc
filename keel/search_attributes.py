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

#: Every one of them, with its kind: registered on each server Keel starts or joins.
SEARCH_ATTRIBUTES: dict[str, str] = {
    GATE_STATUS_ATTRIBUTE: "Keyword",
    GATE_NAME_ATTRIBUTE: "Keyword",
    RUN_ID_ATTRIBUTE: "Keyword",
}
