"""``design``: MLOps design pipelines from the command line (docs/design-cli.md).

``design new`` creates a project, ``design run`` notes a decision set, starts its
``DesignPipeline`` on the configured Temporal server (or the embedded one, started on
demand, with a worker) and follows its events, one line each; ``design answer`` and
``design approve`` answer its questions and decide its gate from another terminal;
``design show``, ``design diff`` and ``design download`` read what the pipeline stored.
Output, errors and exit codes follow the CLI toolkit (``cli/toolkit.py``): text on a
terminal, one JSON document otherwise, ``{"error": {...}}`` on failure; the live event
lines go to stderr.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit
from cli.design_text import _cmd, _diff_text, _view_text, event_line
from cli.toolkit import note

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker
    from temporalio.client import Client

    from cli.envelope import CliError
    from keel.design.steps import DesignEvent, DesignInput
    from keel.settings import Settings


app = typer.Typer(
    help="MLOps design pipelines: requirements to a reviewed plan and a generated, "
    "validated repository (docs/design-cli.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

EXIT_CODES = toolkit.EXIT_CODES["design"]
#: The exit code of each end a pipeline can reach (its ``run-complete`` status).
OUTCOME_EXIT = {
    "completed": EXIT_CODES["ok"],
    "rejected": EXIT_CODES["rejected"],
    "expired": EXIT_CODES["expired"],
    "not_covered": EXIT_CODES["not_covered"],
    "validation_failed": EXIT_CODES["validation_failed"],
}
#: How often ``design run`` asks for new events.
POLL_S = 0.5

JsonOpt = toolkit.JsonOpt
ProjectArg = Annotated[str, typer.Argument(help="The project id")]
DecisionSetArg = Annotated[str, typer.Argument(help="The decision set id")]
AsOpt = Annotated[
    str | None,
    typer.Option("--as", help="Act as this user (default: $KEEL_USER, else the login name)"),
]


def _translate(err: BaseException) -> CliError | None:
    from pydantic import ValidationError
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import WorkflowAlreadyStartedError

    from client.design import DecisionSetNotFound
    from client.temporal import cause_chain
    from keel.gates import GateRefusal
    from keel.problems import problem_lines
    from store.design import DecisionSetExists, NotYours

    if isinstance(err, DecisionSetNotFound):
        return DESIGN.failure("not_found", str(err)).error
    if isinstance(err, NotYours | DecisionSetExists | WorkflowAlreadyStartedError):
        return DESIGN.failure("conflict", str(err)).error
    if isinstance(err, WorkflowUpdateFailedError):
        return DESIGN.failure("refused", str(cause_chain(err)[-1])).error
    if isinstance(err, GateRefusal):  # the round's gate refused the decision (client/gate.py)
        return DESIGN.failure("refused", err.message).error
    if isinstance(err, ValidationError):
        return DESIGN.failure("invalid_input", problem_lines(err, root="")).error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
DESIGN = toolkit.Family("design", _translate)


def user(explicit: str | None = None) -> str:
    """Who the CLI acts as (``toolkit.user``; ``design`` when no login name is known)."""
    return toolkit.user(explicit, fallback="design")


def _owned_project(sm: sessionmaker[Session], project: str, actor: str) -> dict[str, Any]:
    from store.design import project_row

    row = project_row(sm, project)
    if row is None:
        DESIGN.fail(
            "not_found", f"no project {project!r}", hint=f"create it with `design new {project}`"
        )
    if row["owner_id"] != actor:
        DESIGN.fail("conflict", f"project {project!r} belongs to {row['owner_id']}, not {actor}")
    return row


async def _with_client(settings: Settings, work: Any) -> Any:
    """``await work(client)`` on the configured server. Never starts one: these commands
    answer or read a running decision set, and none runs on a server that is down."""
    from services.local import LocalServices

    services = LocalServices(settings, note)
    try:
        return await work(await services.connect(start=False))
    finally:
        await asyncio.to_thread(services.stop, True)


async def _running_status(client: Client, project: str, ds: str, what: str) -> Any:
    """The ``status`` of a running decision set; not_found (saying why) otherwise."""
    from client import design as design_client
    from client.temporal import describe_or_none, status_name
    from keel.design.steps import WORKFLOW_TYPE, workflow_id

    desc = await describe_or_none(client, workflow_id(project, ds), WORKFLOW_TYPE)
    if desc is None:
        DESIGN.fail("not_found", f"no decision set {project}/{ds} has run")
    if status_name(desc) != "running":
        DESIGN.fail("not_found", f"{project}/{ds} has {what}: the run is {status_name(desc)}")
    return await design_client.status(client, project, ds)


# -- new -----------------------------------------------------------------------------------


@app.command()
def new(
    project: ProjectArg,
    name: Annotated[str, typer.Option(help="A display name (default: the id)")] = "",
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Create a project owned by you."""
    from keel.ids import SHORT_ID_RE
    from store.design import create_project

    DESIGN.mode(json_out)
    with DESIGN.reported():
        if not SHORT_ID_RE.match(project):
            DESIGN.fail(
                "usage", f"a project id is letters, digits, '.', '_' and '-', not {project!r}"
            )
        owner = user(as_user)
        sm = toolkit.sessions(toolkit.load_settings())
        created = create_project(sm, project, owner=owner, name=name)
        DESIGN.emit(
            {"project": project, "owner": owner, "created": created},
            f"{project}: {'created' if created else 'exists already'} (owner {owner}); "
            f"start a decision set with `design run {project} --requirements '...'`",
        )


# -- run -----------------------------------------------------------------------------------


def _read_input(requirements: str | None, file: Path | None, intake: Path | None) -> Any:
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


async def _follow(
    client: Client,
    sm: sessionmaker[Session],
    services: Any,
    project: str,
    ds: str,
    *,
    interactive: bool,
    actor: str,
) -> DesignEvent:
    """Print each event of the decision set as it comes; the last (run-complete or
    run-error)."""
    from temporalio.service import RPCError

    from client.design import events_since

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
                await _questions(client, project, ds, interactive=interactive, actor=actor)
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
    from client.design import answer, status
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
        await answer(client, project, ds, DesignAnswers(answers=values, actor=actor))


def parse_value(raw: str) -> Any:
    """A value given on the command line: JSON when it parses, else the string."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


async def _run(
    settings: Settings, inp: DesignInput, *, detach: bool, stay: bool
) -> DesignEvent | None:
    from client.design import start_design
    from services.local import LocalServices

    sm = toolkit.sessions(settings)
    services = LocalServices(settings, note)
    try:
        client = await services.connect()
        handle = await start_design(client, inp, task_queue=settings.task_queue)
        note(f"Started {handle.id}")
        await services.ensure_worker(handle.id, "design-worker.log")
        if detach:
            return None
        interactive = sys.stdin.isatty() and sys.stderr.isatty()
        return await _follow(
            client,
            sm,
            services,
            inp.project,
            inp.decision_set,
            interactive=interactive,
            actor=inp.requester,
        )
    finally:
        await asyncio.to_thread(services.stop, stay or detach)


@app.command()
def run(
    project: ProjectArg,
    requirements: Annotated[
        str | None, typer.Option("--requirements", "-r", help="The requirements as free text")
    ] = None,
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="Read the requirements from this file")
    ] = None,
    intake: Annotated[
        Path | None,
        typer.Option(help="Guided mode: a JSON file of Constraint Schema fields (no model)"),
    ] = None,
    previous: Annotated[
        str | None, typer.Option(help="Iterate on this (approved) decision set")
    ] = None,
    decision_set: Annotated[
        str | None,
        typer.Option("--decision-set", "-d", help="The new decision set's id (default ds<N>)"),
    ] = None,
    generate: Annotated[
        bool, typer.Option("--generate/--no-generate", help="Run codegen and the validators")
    ] = True,
    approver: Annotated[
        list[str] | None, typer.Option("--approver", help="Who may decide the gate (repeat)")
    ] = None,
    require_approval: Annotated[
        bool,
        typer.Option(
            "--require-approval/--no-require-approval",
            help="Open the gate every round; with --no-..., only when policy fails or the "
            "cost rose over the threshold",
        ),
    ] = True,
    model: Annotated[str, typer.Option(help="Intake model (configs/models.yaml)")] = "",
    detach: Annotated[bool, typer.Option("--detach", help="Start it and return")] = False,
    stay: Annotated[bool, typer.Option("--stay", help="Keep services this started")] = False,
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Start a decision set and follow its events until it ends."""
    from keel.design.steps import DesignInput
    from store.design import decision_sets_of, submit_decision_set

    DESIGN.mode(json_out)
    with DESIGN.reported():
        if sum(x is not None for x in (requirements, file)) > 1:
            DESIGN.fail("usage", "give the requirements once: --requirements or --file")
        text, form = _read_input(requirements, file, intake)
        if not text.strip() and form is None and previous is None:
            DESIGN.fail("usage", "give --requirements, --file, --intake or --previous")
        settings = toolkit.load_settings()
        sm = toolkit.sessions(settings)
        actor = user(as_user)
        _owned_project(sm, project, actor)
        known = decision_sets_of(sm, project)
        if previous is not None and not any(d["id"] == previous for d in known):
            DESIGN.fail("not_found", f"project {project!r} has no decision set {previous!r}")
        ds = decision_set or f"ds{len(known) + 1}"
        inp = DesignInput(
            project=project,
            decision_set=ds,
            requester=actor,
            requirements=text,
            intake=form,
            previous_decision_set=previous,
            model=model,
            approvers=approver or [],
            require_approval=require_approval,
            generate=generate,
        )
        submit_decision_set(sm, project, ds, parent=previous)
        last = asyncio.run(_run(settings, inp, detach=detach, stay=stay))
        if last is None:
            DESIGN.emit(
                {"project": project, "decision_set": ds, "status": "running"},
                f"{project}/{ds}: started; follow it with `design show {project} {ds}`",
            )
            return
        p = last.payload
        if last.type == "run-error":
            DESIGN.emit(
                {"project": project, "decision_set": ds, "status": "failed", "error": p},
                f"{project}/{ds}: failed: {p.get('message')}",
            )
            raise typer.Exit(EXIT_CODES["run_failed"])
        status = p.get("status", "completed")
        doc = {
            "project": project,
            "decision_set": ds,
            "status": status,
            "version": p.get("version"),
            "archive_digest": p.get("archive_digest"),
        }
        text_out = f"{project}/{ds}: {status}, version {p.get('version')}"
        if p.get("archive_digest"):
            failing = " (archive fails validation)" if status == "validation_failed" else ""
            text_out += f"; {_cmd('design', 'download', project, ds)}{failing}"
        DESIGN.emit(doc, text_out)
        code = OUTCOME_EXIT.get(status, EXIT_CODES["run_failed"])
        if code:
            raise typer.Exit(code)


# -- answer, approve -----------------------------------------------------------------------


@app.command()
def answer(
    project: ProjectArg,
    decision_set: DecisionSetArg,
    values: Annotated[
        list[str], typer.Argument(help="field=value (the value is JSON when it parses)")
    ],
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Answer the open questions of a running decision set."""
    from client import design as design_client
    from keel.design.steps import DesignAnswers

    DESIGN.mode(json_out)
    with DESIGN.reported():
        answers: dict[str, Any] = {}
        for item in values:
            field, sep, raw = item.partition("=")
            if not sep or not field:
                DESIGN.fail("usage", f"an answer is field=value, not {item!r}")
            answers[field.strip()] = parse_value(raw)
        settings = toolkit.load_settings()
        actor = user(as_user)

        async def work(client: Client) -> Any:
            await _running_status(client, project, decision_set, "no open questions")
            return await design_client.answer(
                client, project, decision_set, DesignAnswers(answers=answers, actor=actor)
            )

        st = asyncio.run(_with_client(settings, work))
        DESIGN.emit(
            {"project": project, "decision_set": decision_set, "status": st.model_dump()},
            f"{project}/{decision_set}: answered {', '.join(sorted(answers))}; phase {st.phase}",
        )


@app.command()
def approve(
    project: ProjectArg,
    decision_set: DecisionSetArg,
    reject: Annotated[bool, typer.Option("--reject", help="Reject the plan instead")] = False,
    comment: Annotated[
        str, typer.Option(help="Why; a rejection's comment is the next planner round's input")
    ] = "",
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Decide the open gate of a decision set (approve, or --reject with a comment)."""
    from client import design as design_client

    DESIGN.mode(json_out)
    with DESIGN.reported():
        settings = toolkit.load_settings()
        actor = user(as_user)

        async def work(client: Client) -> Any:
            st = await _running_status(client, project, decision_set, "no open gate")
            if st.phase != "waiting_for_approval" or not st.plan_round:
                DESIGN.fail(
                    "not_found", f"{project}/{decision_set} has no open gate (phase {st.phase})"
                )
            gate = await design_client.decide(
                client,
                project,
                decision_set,
                st.plan_round,
                "reject" if reject else "approve",
                actor=actor,
                comment=comment,
            )
            return st.plan_round, gate

        plan_round, gate = asyncio.run(_with_client(settings, work))
        DESIGN.emit(
            {
                "project": project,
                "decision_set": decision_set,
                "round": plan_round,
                "gate": gate.model_dump(mode="json"),
            },
            f"{project}/{decision_set}: gate plan-r{plan_round} {gate.status.value} by {actor}",
        )


# -- show, diff, download ------------------------------------------------------------------


@app.command()
def show(
    project: Annotated[
        str | None, typer.Argument(help="A project (none: your projects)", show_default=False)
    ] = None,
    decision_set: Annotated[
        str | None, typer.Argument(help="A decision set (none: the project's)", show_default=False)
    ] = None,
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Your projects, a project's decision sets, or one decision set (status, cost,
    policy, validation)."""
    from client import design as design_client
    from store.design import SUBMITTED, decision_sets_of, projects_of

    DESIGN.mode(json_out)
    with DESIGN.reported():
        settings = toolkit.load_settings()
        sm = toolkit.sessions(settings)
        actor = user(as_user)
        if project is None:
            rows = projects_of(sm, actor)
            doc = [
                {"project": r["id"], "name": r["name"], "created_at": r["created_at"].isoformat()}
                for r in rows
            ]
            text = "\n".join(f"{r['project']}  {r['name']}" for r in doc) or "no projects"
            DESIGN.emit({"owner": actor, "projects": doc}, text)
            return
        _owned_project(sm, project, actor)
        if decision_set is None:
            rows = decision_sets_of(sm, project)
            if any(d["status"] == SUBMITTED for d in rows):
                rows = _true_statuses(settings, sm, project, rows)
            sets = [
                {
                    **d,
                    "created_at": d["created_at"].isoformat(),
                    "updated_at": d["updated_at"].isoformat(),
                }
                for d in rows
            ]
            text = "\n".join(
                f"{d['id']}  {d['status']}  v{d['version']}"
                + (f"  (from {d['parent_id']})" if d["parent_id"] else "")
                for d in sets
            )
            DESIGN.emit({"project": project, "decision_sets": sets}, text or "no decision sets")
            return
        view = design_client.decision_set_view(sm, project, decision_set)
        if view["status"] == SUBMITTED:
            from services.local import ServiceUnavailable

            async def live(client: Client) -> Any:
                from temporalio.service import RPCError

                # Not persisted: the run's status (running, failed, ...) is the true one.
                [row] = await design_client.true_statuses(
                    client, sm, project, [{"id": decision_set, "status": SUBMITTED}]
                )
                view["status"] = row["status"]
                try:
                    return await asyncio.wait_for(
                        design_client.status(client, project, decision_set), 10
                    )
                except (RPCError, TimeoutError) as e:
                    note(f"the run does not answer its status query: {e}")
                    return None

            try:
                st = asyncio.run(_with_client(settings, live))
            except ServiceUnavailable as e:
                note(f"no live status: {e}")
                st = None
            view["live"] = None if st is None else st.model_dump(mode="json")
        DESIGN.emit(view, _view_text(view))


def _true_statuses(
    settings: Any, sm: Any, project: str, rows: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``rows`` with each set not yet persisted given its run's status (running, failed,
    ...); as stored, with a note, when Temporal cannot be asked."""
    from client import design as design_client
    from services.local import ServiceUnavailable

    async def ask(client: Client) -> list[dict[str, Any]]:
        return await design_client.true_statuses(client, sm, project, rows)

    try:
        found: list[dict[str, Any]] = asyncio.run(_with_client(settings, ask))
    except ServiceUnavailable as e:
        note(f"no run statuses: {e}")
        return rows
    return found


@app.command()
def diff(
    project: ProjectArg,
    decision_set: DecisionSetArg,
    against: Annotated[
        str | None,
        typer.Option(
            "--against",
            help="Compare with this decision set of the project (default: the previous one)",
        ),
    ] = None,
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """The Change Summary of a decision set against its previous one (or --against
    another): files, state, the Terraform resources added, removed and changed (per
    module instance, so per capability and region) and the cost lines that changed."""
    from client import design as design_client
    from store.artifacts import artifact_store_from_settings

    DESIGN.mode(json_out)
    with DESIGN.reported():
        settings = toolkit.load_settings()
        sm = toolkit.sessions(settings)
        _owned_project(sm, project, user(as_user))
        d = design_client.load_diff(
            sm,
            artifact_store_from_settings(settings),
            settings.design_repos_dir,
            project,
            decision_set,
            against,
        )
        DESIGN.emit(d.model_dump(mode="json"), _diff_text(d))


@app.command()
def download(
    project: ProjectArg,
    decision_set: DecisionSetArg,
    out: Annotated[
        Path | None, typer.Option("--output", "-o", help="The zip (default <project>-<ds>.zip)")
    ] = None,
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Write the decision set's generated repository as a zip."""
    from store.artifacts import artifact_store_from_settings
    from store.design import stored_view

    DESIGN.mode(json_out)
    with DESIGN.reported():
        settings = toolkit.load_settings()
        sm = toolkit.sessions(settings)
        _owned_project(sm, project, user(as_user))
        stored = stored_view(sm, project, decision_set)
        digest = stored.archive["digest"] if stored.archive else None
        if not digest:
            DESIGN.fail(
                "not_found",
                f"{project}/{decision_set} has no repository (not finished, or run with "
                "--no-generate)",
            )
        data = artifact_store_from_settings(settings).get_bytes(digest)
        target = out or Path(f"{project}-{decision_set}.zip")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        failed = stored.failed_validators or []
        DESIGN.emit(
            {
                "path": str(target),
                "bytes": len(data),
                "digest": digest,
                "validation": "failed" if failed else "passed",
                "failed_validators": failed,
            },
            f"wrote {target} ({len(data):,} bytes)"
            + (f"; its tree FAILED validation: {', '.join(failed)}" if failed else ""),
        )


def main(argv: list[str] | None = None) -> None:
    DESIGN.main(app, argv)


if __name__ == "__main__":
    main()
