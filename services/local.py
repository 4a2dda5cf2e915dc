"""A Temporal client with a worker behind it, for CLI commands that run workflows.

``mrp run`` (and ``mrp replay``) need no manual step: with no server configured and
none answering on the embedded address, they start ``keel up`` in the background
(:func:`services.up.start_up_in_background`); with a server but no worker picking up the run
they started, they start one ``keel worker``. What they started is stopped afterwards unless
the caller keeps it (``--stay``, or a run that is not waited for).
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.processes import ManagedProcess, ServiceError, port_open, stop_pid
from services.up import keel_process, read_state, start_up_in_background

if TYPE_CHECKING:
    from temporalio.client import Client

    from keel.settings import Settings


class ServiceUnavailable(RuntimeError):
    """Temporal (or a worker for it) cannot be reached or started; the message says why."""


def reachable(address: str) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        return port_open(int(port), host or "127.0.0.1")
    except (ValueError, OSError):
        return False


@dataclass
class LocalServices:
    """What one command started: ``keel up`` and/or one worker; :meth:`stop` ends them."""

    settings: Settings
    note: Callable[[str], None]
    up: subprocess.Popen[bytes] | None = None
    worker: ManagedProcess | None = None
    _client: Client | None = field(default=None, repr=False)

    def dead(self) -> str | None:
        """Why a service this command started is gone, or None."""
        if self.worker is not None and not self.worker.running():
            return f"the worker this command started exited (log {self.worker.log_path})"
        if self.up is not None and self.up.poll() is not None:
            return (
                f"the keel up this command started exited (log {self.settings.data_dir / 'up.log'})"
            )
        return None

    async def connect(self, *, start: bool = True) -> Client:
        """A client for the configured server, or the embedded one (``keel up`` started in
        the background when nothing answers on its address, unless ``start`` is False: a
        command that only reads or answers a run has nothing to do on a server it would
        have to start, since no run can be there)."""
        from client.temporal import connect

        settings = self.settings
        address = settings.resolved_temporal_address
        if not reachable(address):
            if settings.temporal_address:
                raise ServiceUnavailable(
                    f"the Temporal server at {address} (KEEL_TEMPORAL_ADDRESS) does not answer"
                )
            if not start:
                raise ServiceUnavailable(
                    f"no Temporal server at {address}, so nothing runs there; "
                    "start Keel with `keel up`"
                )
            self.note(f"No Temporal server at {address}; starting Keel (keel up) ...")
            try:
                self.up = await asyncio.to_thread(start_up_in_background, settings)
            except ServiceError:
                raise ServiceUnavailable(
                    f"keel up did not start (log {settings.data_dir / 'up.log'})"
                ) from None
        try:
            client = await connect(settings)
        except Exception as e:
            raise ServiceUnavailable(f"cannot connect to Temporal at {address}: {e}") from None
        self._client = client
        return client

    async def ensure_worker(
        self, workflow_id: str, log_name: str = "cli-worker.log", wait_s: float = 3.0
    ) -> None:
        """Start one ``keel worker`` unless a worker picks up ``workflow_id``'s first
        workflow task within ``wait_s`` seconds; at once when no worker polls the queue.

        An empty poller list is proof enough that no worker runs; a listed poller is
        not, since Temporal keeps listing a worker for minutes after it stopped: then
        the run is watched for a worker picking it up.
        """
        from temporalio.api.enums.v1 import PendingWorkflowTaskState
        from temporalio.client import WorkflowExecutionStatus

        if self.up is not None or self._client is None or read_state(self.settings):
            return  # keel up runs its own worker (it may still be starting)
        handle = self._client.get_workflow_handle(workflow_id)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (wait_s if await self._polled() else 0.0)
        while loop.time() < deadline:
            desc = await handle.describe()
            task = desc.raw_description.pending_workflow_task
            picked_up = task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED
            if desc.status != WorkflowExecutionStatus.RUNNING or picked_up:
                return
            if (desc.history_length or 0) > 2:  # started, scheduled, then a worker acted
                return
            await asyncio.sleep(0.1)
        settings = self.settings
        log = settings.data_dir / "logs" / log_name
        self.note(
            f"No worker picked up the run on task queue {settings.task_queue!r}; "
            f"starting one (log {log}) ..."
        )
        self.worker = keel_process("worker", log)
        self.worker.start()

    async def _polled(self) -> bool:
        """Whether any worker polls (or polled lately) the task queue for workflow tasks."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
        from temporalio.service import RPCError

        assert self._client is not None
        try:
            desc = await self._client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self._client.namespace,
                    task_queue=TaskQueue(name=self.settings.task_queue),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                )
            )
        except RPCError:  # a refused call: watch the run instead
            return True
        return bool(desc.pollers)

    def stop(self, stay: bool = False) -> None:
        """Stop what this command started; with ``stay`` leave it running and say how to stop it."""
        if stay:
            if self.up is not None:
                self.note("Keel stays up; stop it with `keel down`.")
            if self.worker is not None:
                self.note(f"The worker stays up (pid {self.worker.pid}); stop it with kill.")
            return
        if self.worker is not None:
            self.worker.stop()
        if self.up is not None:
            stop_pid(self.up.pid, 30)
            with contextlib.suppress(Exception):
                self.up.wait(timeout=30)
