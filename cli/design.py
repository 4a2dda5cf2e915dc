"""``design``: MLOps design pipelines from the command line (docs/design-cli.md).

``design new`` creates a project, ``design run`` notes a decision set, starts its
``DesignPipeline`` on the configured Temporal server (or the embedded one, started on
demand, with a worker) and follows its events, one line each; ``design answer`` and
``design approve`` answer its questions and decide its gate from another terminal;
``design show``, ``design diff`` and ``design download`` read what the pipeline stored.
Output, errors and exit codes follow the CLI toolkit (``cli/toolkit.py``): text on a
terminal, one JSON document otherwise, ``{"error": {...}}`` on failure; the live event
lines go to stderr.

Each command parses its arguments, calls the use case the API calls too
(``client/design_cases.py``, ``client/design_files.py``, ``client/design_view.py``) and
prints its result, or its refusal in the CLI's words (``cli/design_text.refusal``).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit
from cli.design_family import DESIGN, EXIT_CODES, OUTCOME_EXIT, Call, command, with_client
from cli.design_family import user as user
from cli.design_run import (
    ApproverOpt,
    DetachOpt,
    FileOpt,
    GenerateOpt,
    IntakeOpt,
    ModelOpt,
    NewSetOpt,
    PreviousOpt,
    RequireApprovalOpt,
    RequirementsOpt,
    SampleOpt,
    StayOpt,
    TargetOpt,
    TaskOpt,
    TimeColumnOpt,
    ValidatorOpt,
    parse_value,
    read_input,
    start_and_follow,
    with_sample,
)
from cli.design_text import _diff_text, _view_text, run_end
from cli.toolkit import note

if TYPE_CHECKING:
    from temporalio.client import Client


app = typer.Typer(
    help="MLOps design pipelines: requirements to a reviewed plan and a generated, "
    "validated repository (docs/design-cli.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JsonOpt = toolkit.JsonOpt
ProjectArg = Annotated[str, typer.Argument(help="The project id")]
DecisionSetArg = Annotated[str, typer.Argument(help="The decision set id")]
AsOpt = Annotated[
    str | None,
    typer.Option("--as", help="Act as this user (default: $KEEL_USER, else the login name)"),
]


# -- new -----------------------------------------------------------------------------------


@app.command()
def new(
    project: ProjectArg,
    name: Annotated[str, typer.Option(help="A display name (default: the id)")] = "",
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Create a project owned by you."""
    from client import design_cases as cases

    with command(json_out, as_user) as c:
        created = cases.create_project(c.sm, project, owner=c.actor, name=name)
        DESIGN.emit(
            {"project": project, "owner": c.actor, "created": created},
            f"{project}: {'created' if created else 'exists already'} (owner {c.actor}); "
            f"start a decision set with `design run {project} --requirements '...'`",
        )


# -- run -----------------------------------------------------------------------------------


@app.command()
def run(
    project: ProjectArg,
    requirements: RequirementsOpt = None,
    file: FileOpt = None,
    intake: IntakeOpt = None,
    sample: SampleOpt = None,
    task: TaskOpt = None,
    target: TargetOpt = None,
    time_column: TimeColumnOpt = None,
    previous: PreviousOpt = None,
    decision_set: NewSetOpt = None,
    generate: GenerateOpt = True,
    approver: ApproverOpt = None,
    require_approval: RequireApprovalOpt = True,
    validator: ValidatorOpt = None,
    model: ModelOpt = "",
    detach: DetachOpt = False,
    stay: StayOpt = False,
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Start a decision set and follow its events until it ends."""
    from client import design_cases as cases
    from keel.design.steps import DesignOptions

    with command(json_out, as_user) as c:
        if sum(x is not None for x in (requirements, file)) > 1:
            DESIGN.fail("usage", "give the requirements once: --requirements or --file")
        text, form = read_input(requirements, file, intake)
        form = with_sample(form, sample, task, target, time_column)
        if not text.strip() and form is None and previous is None:
            DESIGN.fail("usage", "give --requirements, --file, --intake or --previous")
        cases.owned_project(c.sm, project, c.actor)
        options = DesignOptions(
            requirements=text, intake=form, previous_decision_set=previous, model=model,
            approvers=approver or [], require_approval=require_approval, generate=generate,
            validators=validator,
        )  # fmt: skip
        inp = cases.new_decision_set(
            c.sm, c.settings, project, options,
            requester=c.actor, decision_set=decision_set, numbered=True,
        )  # fmt: skip
        last = asyncio.run(start_and_follow(c.settings, c.sm, inp, detach=detach, stay=stay))
        doc, text_out = run_end(project, inp.decision_set, last)
        DESIGN.emit(doc, text_out)
        if doc["status"] != "running":
            code = OUTCOME_EXIT.get(doc["status"], EXIT_CODES["run_failed"])
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
    from client import design_cases as cases
    from keel.design.steps import DesignAnswers

    with command(json_out, as_user, what="no open questions") as c:
        answers: dict[str, Any] = {}
        for item in values:
            field, sep, raw = item.partition("=")
            if not sep or not field:
                DESIGN.fail("usage", f"an answer is field=value, not {item!r}")
            answers[field.strip()] = parse_value(raw)
        given = DesignAnswers(answers=answers, actor=c.actor)

        async def work(client: Client) -> Any:
            return await cases.answer(client, project, decision_set, given)

        _, st = asyncio.run(with_client(c.settings, work))
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
    from client import design_cases as cases
    from keel.gates import GateDecision

    with command(json_out, as_user, what="no open gate") as c:
        decision = GateDecision(
            decision="reject" if reject else "approve", actor=c.actor, comment=comment
        )

        async def work(client: Client) -> Any:
            return await cases.decide(client, project, decision_set, decision)

        st, gate = asyncio.run(with_client(c.settings, work))
        DESIGN.emit(
            {
                "project": project,
                "decision_set": decision_set,
                "round": st.plan_round,
                "gate": gate.model_dump(mode="json"),
            },
            f"{project}/{decision_set}: gate plan-r{st.plan_round} {gate.status.value} "
            f"by {c.actor}",
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
    policy, validation, repair rounds, the model of each node)."""
    from client import design_cases as cases

    with command(json_out, as_user) as c:
        if project is None:
            _show_projects(c)
            return
        cases.owned_project(c.sm, project, c.actor)
        if decision_set is None:
            _show_sets(c, project)
        else:
            _show_one(c, project, decision_set)


def _show_projects(c: Call) -> None:
    from client import design_cases as cases

    doc = [
        {"project": r["id"], "name": r["name"], "created_at": r["created_at"].isoformat()}
        for r in cases.projects(c.sm, c.actor)
    ]
    text = "\n".join(f"{r['project']}  {r['name']}" for r in doc) or "no projects"
    DESIGN.emit({"owner": c.actor, "projects": doc}, text)


def _show_sets(c: Call, project: str) -> None:
    from client import design_cases as cases

    rows = cases.decision_sets(c.sm, project)
    if cases.unsettled(rows):
        rows = _asked(c, "no run statuses", rows, lambda cl: _true(cl, c, project, rows))
    sets = [
        {**d, "created_at": d["created_at"].isoformat(), "updated_at": d["updated_at"].isoformat()}
        for d in rows
    ]
    text = "\n".join(
        f"{d['id']}  {d['status']}  v{d['version']}"
        + (f"  (from {d['parent_id']})" if d["parent_id"] else "")
        for d in sets
    )
    DESIGN.emit({"project": project, "decision_sets": sets}, text or "no decision sets")


async def _true(client: Client, c: Call, project: str, rows: list[dict[str, Any]]) -> Any:
    from client import design as design_client

    return await design_client.true_statuses(client, c.sm, project, rows)


def _show_one(c: Call, project: str, ds: str) -> None:
    from client import design_cases as cases
    from client.design import decision_set_view
    from store.artifacts import artifact_store_from_settings

    # The artifact store gives the view the smoke of the last validation (its report).
    view = decision_set_view(c.sm, project, ds, artifacts=artifact_store_from_settings(c.settings))
    if cases.unsettled([view]):
        # Not persisted: the run's status (running, failed, ...) is the true one.
        async def ask(client: Client) -> Any:
            return await cases.run_state(
                client, c.sm, project, ds, {"id": ds, "status": view["status"]}
            )

        state = _asked(c, "no live status", None, ask)
        if state is not None:
            if state.unanswered:
                note(state.unanswered)
            view["status"] = state.row["status"]
        live = state.live if state is not None else None
        view["live"] = None if live is None else live.model_dump(mode="json")
    DESIGN.emit(view, _view_text(view))


def _asked(c: Call, without: str, default: Any, work: Any) -> Any:
    """``work(client)`` on the configured server; ``default``, with a note, when it
    cannot be asked."""
    from services.local import ServiceUnavailable

    try:
        return asyncio.run(with_client(c.settings, work))
    except ServiceUnavailable as e:
        note(f"{without}: {e}")
        return default


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
    from client import design_cases as cases
    from client.design import load_diff
    from store.artifacts import artifact_store_from_settings

    with command(json_out, as_user) as c:
        cases.owned_project(c.sm, project, c.actor)
        artifacts = artifact_store_from_settings(c.settings)
        repos = c.settings.design_repos_dir
        d = load_diff(c.sm, artifacts, repos, project, decision_set, against)
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
    from client import design_cases as cases
    from client import design_files as files
    from store.artifacts import artifact_store_from_settings

    with command(json_out, as_user) as c:
        cases.owned_project(c.sm, project, c.actor)
        archive = files.archive_of(c.sm, project, decision_set)
        data = artifact_store_from_settings(c.settings).get_bytes(archive.digest)
        target = out or Path(f"{project}-{decision_set}.zip")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        failed = archive.failed_validators
        DESIGN.emit(
            {
                "path": str(target),
                "bytes": len(data),
                "digest": archive.digest,
                "validation": archive.validation,
                "failed_validators": failed,
            },
            f"wrote {target} ({len(data):,} bytes)"
            + (f"; its tree FAILED validation: {', '.join(failed)}" if failed else ""),
        )


def main(argv: list[str] | None = None) -> None:
    DESIGN.main(app, argv)


if __name__ == "__main__":
    main()
