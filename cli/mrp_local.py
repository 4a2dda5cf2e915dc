"""What ``mrp`` does on this machine before and around an ``MRPJob`` workflow:
compiling a job as the compile activity would (its files resolved beside the job file,
nothing stored), and starting the workflow with services on demand (``keel up``, a
worker) and watching it with a progress line on stderr.

These are use cases rather than translation; they wait here for ``client/mrp.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli import toolkit
from cli.mrp_text import _progress_line as progress_line_text
from cli.toolkit import note, output

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker
    from temporalio.client import Client

    from keel.mrp.run import MRPJobInput, MRPJobResult
    from keel.settings import Settings


def compile_job(settings: Settings, job: Path, text: str) -> Any:
    """Compile ``job`` against the configured registry and caps (files resolved beside it)."""
    from activities.mrp.operators import load_mrp_config
    from keel.mrp.dsl import parse_job

    source = str(job)
    parsed = parse_job(text, source)
    config = load_mrp_config(settings)
    files = None
    slices = None
    if parsed.spec.inputs.files is not None:
        from activities.mrp.inputs import resolve_inputs
        from keel.mrp.errors import InputsRefused
        from keel.mrp.policy import input_source_findings
        from keel.problems import at_path

        refused = input_source_findings(parsed.spec.inputs, config.caps)
        if refused:
            path, message = refused[0]
            line = parsed.line(path)
            where = at_path(path, line)
            raise InputsRefused(f"MRP-P015 input source not allowed{where}: {message}")
        # As the compile activity does, files beside the job file; nothing is stored.
        inputs = resolve_inputs(
            parsed.spec.inputs,
            base_dir=str(job.resolve().parent),
            settings=settings,
            caps=config.caps,
            store=HashOnlyStore(),  # type: ignore[arg-type]
            base_path=job.resolve().parent,
        )
        files, slices = inputs.files, inputs.slices
    return config.compile_job(text, resolved_files=files, record_slices=slices, source=source)


class HashOnlyStore:
    """Stand-in artifact store for ``mrp compile``: digests file bytes, keeps nothing."""

    def put_bytes(self, data: bytes) -> str:
        from keel.digest import digest_bytes

        return digest_bytes(data)


async def _watch(
    client: Client,
    sessions: sessionmaker[Session],
    run_id: str,
    workflow_id: str,
    services: Any,
    show: bool,
    on_dead: Callable[[str], BaseException],
) -> None:
    """Beside the result wait: progress on stderr (terminal only), from the workflow's
    ``progress`` query and the run records; fails when a service this command started
    dies."""
    from client.mrp import job_view, running_cost

    handle = client.get_workflow_handle(workflow_id)
    status = toolkit.StatusLine()

    async def progress_line() -> None:
        progress: dict[str, Any] | None = None
        with contextlib.suppress(Exception):
            progress = await handle.query("progress", result_type=dict)
        view = await job_view(None, sessions, run_id)
        if view is not None and view.status == "running":
            view.cost = await asyncio.to_thread(running_cost, sessions, run_id, view.cost)
        status.show(progress_line_text(view, progress))

    await toolkit.watch_services(
        services,
        on_dead=on_dead,
        tick=progress_line if show else None,
    )


async def start_and_wait(
    settings: Settings,
    inp: MRPJobInput,
    job_id: str,
    *,
    wait: bool,
    stay: bool,
    on_dead: Callable[[str], BaseException],
) -> tuple[str, MRPJobResult | None, BaseException | None]:
    """Start ``MRPJob`` (services on demand) and, with ``wait``, its result or failure;
    ``on_dead(why)`` is raised when a service this command started dies."""
    from temporalio.client import WorkflowFailureError

    from client.mrp import start_job
    from keel.mrp.run import workflow_id_for
    from services.local import LocalServices

    services = LocalServices(settings, note)
    keep = stay or not wait
    try:
        client = await services.connect()
        wid = workflow_id_for(job_id, inp.run_id)
        handle = await start_job(client, inp, workflow_id=wid, task_queue=settings.task_queue)
        if not output.json:
            note(f"Started {wid} (run id {inp.run_id}) on task queue {settings.task_queue!r}")
        await services.ensure_worker(wid, "mrp-worker.log")
        if not wait:
            return wid, None, None
        sessions = toolkit.sessions(settings)
        show = sys.stderr.isatty()
        try:
            result = await toolkit.wait_watching(
                handle.result(), _watch(client, sessions, inp.run_id, wid, services, show, on_dead)
            )
        except WorkflowFailureError as err:
            return wid, None, err
        finally:
            if show:
                toolkit.StatusLine.clear()
        return wid, result, None
    finally:
        await asyncio.to_thread(services.stop, keep)
