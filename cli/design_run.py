"""``design run``'s own part: its options, its input, and following a started decision
set's events (answering its questions on a terminal) until it ends."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.design_family import DESIGN
from cli.design_text import _cmd, event_line
from cli.toolkit import note

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker
    from temporalio.client import Client

    from keel.design.steps import DesignEvent, DesignInput
    from keel.settings import Settings

#: How often ``design run`` asks for new events.
POLL_S = 0.5


def read_input(requirements: str | None, file: Path | None, intake: Path | None) -> Any:
    text = requirements or ""
    if file is not None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError as e:
            DESIGN.fail("invalid_input", f"cannot read {file}: {e.strerror or e}")
    form = None
    if intake is not None:
        try:
            form = json.loads(intake.read_text(encoding="utf-8"))
        except OSError as e:
            DESIGN.fail("invalid_input", f"cannot read {intake}: {e.strerror or e}")
        except json.JSONDecodeError as e:
            DESIGN.fail("invalid_input", f"{intake} is not JSON: {e}")
        if not isinstance(form, dict):
            DESIGN.fail(
                "invalid_input", f"{intake} must hold a JSON object of Constraint Schema fields"
            )
    return text, form


def with_sample(
    form: dict[str, Any] | None,
    sample: Path | None,
    task: str | None,
    target: str | None,
    time_column: str | None,
) -> dict[str, Any] | None:
    """The intake form with its ``data`` made from the user's sample file (CSV or
    Parquet; issue 38 §2): the generated pipeline's features, training and smoke follow
    its columns. No sample: the form as it is."""
    if sample is None:
        if task is not None or target is not None or time_column is not None:
            DESIGN.fail("usage", "--task, --target and --time-column describe a --sample file")
        return form
    from client.design_sample import SampleError, form_with_sample

    if task is None:
        DESIGN.fail("usage", "--sample needs --task (classification, regression, ...)")
    try:
        return form_with_sample(
            form or {}, sample, task=task, target=target, time_column=time_column
        )
    except (SampleError, ValueError) as e:
        DESIGN.fail("invalid_input", str(e))


async def _follow(
    client: Client, sm: sessionmaker[Session], services: Any, inp: DesignInput, interactive: bool
) -> DesignEvent:
    """Print each event of the decision set as it comes; the last (run-complete or
    run-error)."""
    from temporalio.service import RPCError

    from client.design import events_since

    project, ds = inp.project, inp.decision_set
    after = -1
    last: DesignEvent | None = None
    while True:
        dead = services.dead()
        if dead:
            DESIGN.fail("error", dead)
        try:
            page = await events_since(client, sm, project, ds, after)
        except RPCError:
            # A run whose first task no worker has taken yet cannot answer its query.
            await asyncio.sleep(POLL_S)
            continue
        for e in page.events:
            note(event_line(e, project, ds))
            if e.type == "questions":
                await _questions(client, project, ds, interactive=interactive, actor=inp.requester)
            after, last = e.seq, e
        if page.done:
            # The running run's query may already have given run-complete: then the
            # finished page has nothing after it.
            if last is None:
                DESIGN.fail("not_found", f"no decision set {ds!r} in project {project!r}")
            return last
        await asyncio.sleep(POLL_S)


async def _questions(
    client: Client, project: str, ds: str, *, interactive: bool, actor: str
) -> None:
    """Show the open questions and how to answer them; on a terminal, ask them."""
    from client import design_cases as cases
    from client.design import status
    from keel.design.steps import DesignAnswers

    st = await status(client, project, ds)
    if st is None or not st.questions:
        return
    for q in st.questions:
        choices = f" [{' | '.join(q.choices)}]" if q.choices else ""
        note(f"    ? {q.field}: {q.text}{choices}")
    example = [f"{q.field}=..." for q in st.questions]
    note(f"    answer with: {_cmd('design', 'answer', project, ds)} {' '.join(example)}")
    if not interactive:
        return
    values: dict[str, Any] = {}
    for q in st.questions:
        raw = await asyncio.to_thread(input, f"{q.field}? ")
        if raw.strip():
            values[q.field] = parse_value(raw.strip())
    if values:
        await cases.answer(client, project, ds, DesignAnswers(answers=values, actor=actor))


def parse_value(raw: str) -> Any:
    """A value given on the command line: JSON when it parses, else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


async def start_and_follow(
    settings: Settings, sm: sessionmaker[Session], inp: DesignInput, *, detach: bool, stay: bool
) -> DesignEvent | None:
    from client import design_cases as cases
    from services.local import LocalServices

    services = LocalServices(settings, note)
    try:
        client = await services.connect()
        handle = await cases.start(client, inp, task_queue=settings.task_queue)
        note(f"Started {handle.id}")
        await services.ensure_worker(handle.id, "design-worker.log")
        if detach:
            return None
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
        return await _follow(client, sm, services, inp, interactive)
    finally:
        await asyncio.to_thread(services.stop, stay or detach)


RequirementsOpt = Annotated[
    str | None, typer.Option("--requirements", "-r", help="The requirements as free text")
]
FileOpt = Annotated[
    Path | None, typer.Option("--file", "-f", help="Read the requirements from this file")
]
IntakeOpt = Annotated[
    Path | None,
    typer.Option(help="Guided mode: a JSON file of Constraint Schema fields (no model)"),
]
PreviousOpt = Annotated[str | None, typer.Option(help="Iterate on this (approved) decision set")]
NewSetOpt = Annotated[
    str | None,
    typer.Option("--decision-set", "-d", help="The new decision set's id (default ds<N>)"),
]
GenerateOpt = Annotated[
    bool, typer.Option("--generate/--no-generate", help="Run codegen and the validators")
]
ApproverOpt = Annotated[
    list[str] | None, typer.Option("--approver", help="Who may decide the gate (repeat)")
]
ValidatorOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--validator",
        help="Run only this validator (repeat; default: every one). The others are "
        "reported not_run: for quick rounds, not for what ships",
    ),
]
RequireApprovalOpt = Annotated[
    bool,
    typer.Option(
        "--require-approval/--no-require-approval",
        help="Open the gate every round; with --no-..., only when policy fails or the "
        "cost rose over the threshold",
    ),
]
SampleOpt = Annotated[
    Path | None,
    typer.Option(help="A sample of your data (.csv or .parquet): the pipeline follows its columns"),
]
TaskOpt = Annotated[
    str | None,
    typer.Option(help="With --sample: classification, regression, forecasting or retrieval"),
]
TargetOpt = Annotated[str | None, typer.Option(help="With --sample: the column to predict")]
TimeColumnOpt = Annotated[
    str | None, typer.Option(help="With --sample: the column that dates each record")
]
ModelOpt = Annotated[str, typer.Option(help="Intake model (configs/models.yaml)")]
DetachOpt = Annotated[bool, typer.Option("--detach", help="Start it and return")]
StayOpt = Annotated[bool, typer.Option("--stay", help="Keep services this started")]
