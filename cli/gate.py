"""``keel gates``: approval gates from a terminal (list, show, approve, reject, comment).

Every family's human decision point is an ``ApprovalGate`` workflow; these commands talk
to it through ``client/gate.py``, as the API's ``/gates`` routes do, so an approver can
work without the console or an API token. Like the other CLIs they act with the
worker's trust: ``--as`` (or ``$KEEL_USER``, or the login name) is who decides, and the
gate's own rules still hold (a requester cannot approve their own gate; a gate that
names its approvers takes no one else). Output: text on a terminal, JSON otherwise
(``--json``/``--text``); errors in the toolkit's envelope, with exit codes in
``EXIT_CODES["gate"]``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from cli import toolkit
from cli.toolkit import note

if TYPE_CHECKING:
    from temporalio.client import Client

    from cli.envelope import CliError
    from keel.gates import GateState

T = TypeVar("T")

app = typer.Typer(
    help="Approval gates: list, show, approve, reject, comment (docs/console.md).",
    no_args_is_help=True,
)

JsonOpt = toolkit.JsonOpt
AsOpt = Annotated[
    str | None,
    typer.Option("--as", help="Act as this user (default: $KEEL_USER, else the login name)"),
]
GateArg = Annotated[str, typer.Argument(help="The gate id, e.g. design/p1/ds1/gate/plan-r1")]


def _translate(err: BaseException) -> CliError | None:
    from client.gate import GateNotFound, GateNotRunning
    from keel.gates import GateRefusal

    if isinstance(err, GateNotFound):
        return GATE.failure("not_found", str(err), hint="see `keel gates list`").error
    if isinstance(err, GateRefusal):
        code = "closed" if err.code == "gate_closed" else "refused"
        return GATE.failure(code, err.message, details={"refusal": err.code}).error
    if isinstance(err, GateNotRunning):
        return GATE.failure("closed", str(err)).error
    if isinstance(err, FileExistsError):
        return GATE.failure("refused", str(err)).error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
GATE = toolkit.Family("gate", _translate)


def _with_client(work: Callable[[Client], Awaitable[T]]) -> T:
    """``work(client)`` on the configured Temporal server (never starts one: a gate waits
    on a server that runs)."""
    from services.local import LocalServices

    settings = toolkit.load_settings()

    async def go() -> T:
        services = LocalServices(settings, note)
        try:
            return await work(await services.connect(start=False))
        finally:
            await asyncio.to_thread(services.stop, True)

    return asyncio.run(go())


def _state_text(st: GateState) -> str:
    lines = [f"{st.gate_id}: {st.status.value}"]
    if st.subject:
        lines.append(f"  subject    {st.subject}")
    lines.append(f"  requester  {st.requester}")
    lines.append(f"  approvers  {', '.join(st.approvers) or '(anyone with the approver role)'}")
    if st.decided_by:
        decided = f"  decided by {st.decided_by}"
        lines.append(decided + (f": {st.decision_comment}" if st.decision_comment else ""))
    for c in st.comments:
        lines.append(f"  comment    {c.actor}: {c.comment}")
    return "\n".join(lines)


@app.command("list")
def list_(
    status: Annotated[str, typer.Option(help="pending, approved, rejected or expired")] = "pending",
    limit: Annotated[int, typer.Option(min=1, max=500)] = 100,
    json_out: JsonOpt = None,
) -> None:
    """Gates with a status (pending by default), newest first."""
    from client import gate as gates
    from keel.gates import GateStatus

    GATE.mode(json_out)
    with GATE.reported():
        try:
            wanted = GateStatus(status)
        except ValueError:
            known = ", ".join(s.value for s in GateStatus)
            GATE.fail("usage", f"no gate status {status!r} ({known})")
        page = _with_client(lambda client: gates.list_gates(client, wanted, limit=limit))
        rows = page.gates
        text = "\n".join(
            f"{r.gate_id}  {r.status}  requested by {r.requester or '?'}"
            + (f"  expires {r.expires_at:%Y-%m-%d %H:%M}" if r.expires_at else "")
            + (f"\n    {r.subject}" if r.subject else "")
            for r in rows
        )
        GATE.emit(
            {"gates": [r.model_dump(mode="json") for r in rows]},
            text or f"no {wanted.value} gates",
        )


@app.command()
def show(gate_id: GateArg, json_out: JsonOpt = None) -> None:
    """One gate: its status, who may decide it, its decision and comments."""
    from client import gate as gates

    GATE.mode(json_out)
    with GATE.reported():
        st = _with_client(lambda client: gates.state(client, gate_id))
        GATE.emit(st.model_dump(mode="json"), _state_text(st))


def _decide(gate_id: str, decision: str, comment: str, as_user: str | None) -> None:
    from client import gate as gates
    from keel.gates import GateDecision

    actor = toolkit.user(as_user)
    decision_in = GateDecision(decision=decision, actor=actor, comment=comment)  # type: ignore[arg-type]

    async def work(client: Client) -> GateState:
        await gates.describe(client, gate_id)  # not found: its own error, not "closed"
        return await gates.decide(client, gate_id, decision_in)

    st = _with_client(work)
    GATE.emit(st.model_dump(mode="json"), _state_text(st))


@app.command()
def approve(
    gate_id: GateArg,
    comment: Annotated[str, typer.Option(help="Why (kept in the gate's audit trail)")] = "",
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Approve a pending gate."""
    GATE.mode(json_out)
    with GATE.reported():
        _decide(gate_id, "approve", comment, as_user)


@app.command()
def reject(
    gate_id: GateArg,
    comment: Annotated[str, typer.Option(help="Why (a design round takes it as input)")] = "",
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Reject a pending gate."""
    GATE.mode(json_out)
    with GATE.reported():
        _decide(gate_id, "reject", comment, as_user)


@app.command()
def comment(
    gate_id: GateArg,
    text: Annotated[str, typer.Argument(help="The comment")],
    as_user: AsOpt = None,
    json_out: JsonOpt = None,
) -> None:
    """Comment on a pending gate."""
    from client import gate as gates
    from keel.gates import GateComment

    GATE.mode(json_out)
    with GATE.reported():
        if not text.strip():
            GATE.fail("usage", "an empty comment")
        entry = GateComment(actor=toolkit.user(as_user), comment=text)

        async def work(client: Client) -> GateState:
            await gates.describe(client, gate_id)
            return await gates.comment(client, gate_id, entry)

        st = _with_client(work)
        GATE.emit(st.model_dump(mode="json"), _state_text(st))
