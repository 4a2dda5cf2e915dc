"""Activities that write Keel's own records (audit trail) to the SQL store.

Each record carries an idempotency key, so a retried activity writes once.
"""

from __future__ import annotations

import asyncio

from sqlalchemy.orm import Session, sessionmaker
from temporalio import activity

from keel.records import GateAuditEvent
from keel.refs import RECORD_GATE_EVENT
from store.records import record_gate_event


class RecordActivities:
    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self._sessions = sessions

    @activity.defn(name=RECORD_GATE_EVENT.name)
    async def gate_event(self, event: GateAuditEvent) -> bool:
        """Write one gate audit event; False if it was already written (a retry)."""
        return await asyncio.to_thread(record_gate_event, self._sessions, event)
