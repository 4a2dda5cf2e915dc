"""Activities that write Keel's own records (audit trail) to the SQL store.

Each record carries an idempotency key, so a retried activity writes once.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity

from keel.records import GateAuditEvent
from keel.refs import RECORD_GATE_EVENT
from store.records import GateRowsNowait, record_gate_event


class RecordActivities:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions
        self._nowait = GateRowsNowait(sessions)

    @activity.defn(name=RECORD_GATE_EVENT.name)
    async def gate_event(self, event: GateAuditEvent) -> bool:
        """Write one gate audit event; False if it was already written (a retry).

        The gate answers a decision once its row is written (a local activity of the
        answering workflow task): on SQLite the row is written right here, on the event
        loop, unless another writer holds the lock; otherwise, and on PostgreSQL, in a
        thread (store.records.GateRowsNowait).
        """
        written = self._nowait.write(event)
        if written is not None:
            return written
        return await asyncio.to_thread(record_gate_event, self._sessions, event)
