"""What ``mrp`` wires on this machine around an ``MRPJob`` workflow: compiling a job as
the compile activity would (its files resolved beside the job file, nothing stored;
the MRP-P015 refusal is ``client.mrp.refuse_input_sources``), and
``client.mrp.start_and_wait`` with services on demand (``keel up``, a worker) and a
progress line on stderr.

The compile stays here rather than in ``client/mrp.py``: it reads the operator registry
and resolves inputs with ``activities.mrp``, which ``client`` may not import (the layers
of docs/architecture.md).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli import toolkit
from cli.mrp_text import _progress_line as progress_line_text
from cli.toolkit import note, output

if TYPE_CHECKING:
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
        from client.mrp import HashOnlyStore, refuse_input_sources

        refuse_input_sources(parsed, config.caps)
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


def _progress(settings: Settings, run_id: str) -> Any:
    """``mrp run``'s progress line on stderr (a terminal only), from the workflow's
    ``progress`` query and the run records."""
    from client.mrp import progress_of

    def shown(client: Client, workflow_id: str) -> tuple[Any, Any] | None:
        sessions = toolkit.sessions(settings)
        if not sys.stderr.isatty():
            return None
        status = toolkit.StatusLine()

        async def tick() -> None:
            view, progress = await progress_of(client, sessions, run_id, workflow_id)
            status.show(progress_line_text(view, progress))

        return tick, toolkit.StatusLine.clear

    return shown


async def start_and_wait(
    settings: Settings,
    inp: MRPJobInput,
    job_id: str,
    *,
    wait: bool,
    stay: bool,
    on_dead: Callable[[str], BaseException],
) -> tuple[str, MRPJobResult | None, BaseException | None]:
    """:func:`client.mrp.start_and_wait` with services on demand, saying where it started
    and, on a terminal, showing progress."""
    from client import mrp
    from services.local import LocalServices

    def started(wid: str) -> None:
        if not output.json:
            note(f"Started {wid} (run id {inp.run_id}) on task queue {settings.task_queue!r}")

    return await mrp.start_and_wait(
        LocalServices(settings, note),
        inp,
        job_id,
        task_queue=settings.task_queue,
        wait=wait,
        keep=stay or not wait,
        on_started=started,
        on_dead=on_dead,
        progress=_progress(settings, inp.run_id),
    )
