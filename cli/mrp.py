"""``mrp``: compile, run, replay and inspect MRP jobs (Map -> Reduce -> Produce).

``mrp compile job.yaml`` checks a job against ``configs/mrp.yaml`` and writes ``IR.json``,
``manifest.json`` and ``policy_report.json``; ``mrp run job.yaml`` runs it as an ``MRPJob``
workflow on the configured Temporal server, or on the embedded one started on demand
(``keel up`` in the background), with a worker started when none polls the task queue;
``mrp replay --run-id X`` re-runs a finished run from its stored artifacts and compares
every digest; ``mrp inspect --run-id X`` shows a run and downloads its outputs;
``mrp operators`` lists, lints and signs operators (``cli/mrp_operators.py``).

Output: readable text on a terminal, one JSON document on stdout otherwise (``--json``
and ``--text`` force either). Errors are one line each on stderr (``error: ...``), and in
JSON mode also the CLI toolkit's envelope ``{"error": {"family", "type", "code", "message",
"exit_code", "details"}}`` on stdout. Exit codes are in :data:`EXIT_CODES` (declared in
``cli/toolkit.py``; docs/mrp-cli.md).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from cli import mrp_text, toolkit
from cli.mrp_local import compile_job, start_and_wait
from cli.mrp_operators import app as operators_app
from cli.mrp_text import _inspect_text, _result_doc, _result_text
from cli.toolkit import CliFailure, output

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

    from cli.envelope import CliError
    from keel.mrp.run import RunManifest, RunRecord
    from keel.settings import Settings
    from store.artifacts import ArtifactStore


app = typer.Typer(
    help="MRP jobs: compile, run, replay and inspect Map -> Reduce -> Produce jobs "
    "(docs/mrp-quickstart.md).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(operators_app, name="operators")

#: Exit codes (stable; docs/mrp-cli.md), from the toolkit's one table of every family's.
EXIT_CODES = toolkit.EXIT_CODES["mrp"]
EXIT_ERROR = EXIT_CODES["error"]
EXIT_USAGE = EXIT_CODES["usage"]
EXIT_INVALID_JOB = EXIT_CODES["invalid_job"]
EXIT_REFUSED = EXIT_CODES["refused"]
EXIT_RUN_FAILED = EXIT_CODES["run_failed"]
EXIT_REPLAY_MISMATCH = EXIT_CODES["replay_mismatch"]
EXIT_NOT_FOUND = EXIT_CODES["not_found"]

JobArg = Annotated[
    Path,
    typer.Argument(
        help="The job file (YAML, DSL v0.1)", exists=True, dir_okay=False, show_default=False
    ),
]
RunIdOpt = Annotated[str, typer.Option("--run-id", "-r", help="The run id", show_default=False)]
JsonOpt = toolkit.JsonOpt
BackendOpt = Annotated[
    str | None,
    typer.Option("--backend", "-b", help="Map backend: ray (default) or threads"),
]
StayOpt = Annotated[
    bool, typer.Option("--stay", help="Keep a Keel (or worker) this command started running")
]
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out",
        "-o",
        help="Where to write IR.json, manifest.json, policy_report.json "
        "(default: <data dir>/mrp/compiled/<job id>)",
        file_okay=False,
    ),
]
WaitOpt = Annotated[
    bool, typer.Option("--wait/--no-wait", help="Wait for the result (progress on stderr)")
]
WindowOpt = Annotated[
    int | None, typer.Option("--window-size", min=1, help="Shards per map window")
]
NewRunIdOpt = Annotated[str | None, typer.Option("--run-id", help="Run id (default: generated)")]
AllOpt = Annotated[
    bool, typer.Option("--all", help="List every digest, not only the differing ones")
]
DownloadOpt = Annotated[
    Path | None,
    typer.Option(
        "--download", "-d", help="Copy the outputs and manifests into this folder", file_okay=False
    ),
]
ShardsOpt = Annotated[
    int, typer.Option("--shards", min=0, help="Shards to list (text output; JSON lists all)")
]


def _translate(err: BaseException) -> CliError | None:
    """MRP's own exceptions as the CLI reports them (None: not one of them)."""
    from activities.mrp.operators import MrpConfigError
    from keel.mrp.errors import DslError, InputsRefused, RegistryError
    from keel.mrp.policy import PolicyViolation

    if isinstance(err, DslError):
        lines = [issue.render(err.source) for issue in err.issues]
        details = [issue.model_dump() for issue in err.issues]
        return MRP.failure("invalid_job", lines, EXIT_INVALID_JOB, details).error
    if isinstance(err, PolicyViolation):
        return MRP.failure(
            "refused", _violation_lines(err), EXIT_REFUSED, err.report.violations
        ).error
    if isinstance(err, RegistryError | InputsRefused):  # OperatorRefused is a RegistryError
        return MRP.failure("refused", str(err), EXIT_REFUSED).error
    if isinstance(err, MrpConfigError):
        return MRP.failure("config", str(err), EXIT_ERROR).error
    return None


#: The toolkit's wrapper for this CLI (failures, output, entry point).
MRP = toolkit.Family("mrp", _translate, bad_settings="config", unavailable="unavailable")


def _violation_lines(e: Any, source: str | None = None) -> list[str]:
    """``job.yaml:26: MRP-P001 max_workers over cap at policy.max_workers: ...``."""
    from keel.problems import at_path, located

    lines = []
    for v in e.report.violations:
        finding = f"{v.rule_id} {v.title}{at_path(v.path)}: {v.message}"
        lines.append(located(finding, source or "", v.line))
    return lines


def _artifacts(settings: Settings) -> ArtifactStore:
    from store.artifacts import artifact_store_from_settings

    return artifact_store_from_settings(settings)


def _stored_run(
    run_id: str,
) -> tuple[Settings, sessionmaker[Session], ArtifactStore, RunRecord]:
    """Settings, store handles and the run's record; fails not_found for an unknown run id."""
    from store.mrp_runs import get_run

    settings = toolkit.load_settings()
    sessions = toolkit.sessions(settings)
    store = _artifacts(settings)
    record = get_run(sessions, run_id)
    if record is None:
        MRP.fail(
            "not_found",
            f"no MRP run {run_id!r} in {settings.resolved_database_url}",
            EXIT_NOT_FOUND,
        )
    return settings, sessions, store, record


def _start_mode(json_out: bool | None, backend: str | None) -> None:
    """The output mode, then ``--backend`` checked (before anything starts)."""
    MRP.mode(json_out)
    if backend not in (None, "ray", "threads"):
        MRP.fail_now("usage", f"--backend must be ray or threads, not {backend!r}", EXIT_USAGE)


def _read_job(job: Path) -> str:
    try:
        return job.read_text(encoding="utf-8")
    except OSError as e:
        MRP.fail("not_found", f"cannot read {job}: {e.strerror or e}", EXIT_INVALID_JOB)


# -- compile -------------------------------------------------------------------------------


def _refuse(e: Any, job: Path, out_dir: Path) -> NoReturn:
    """A policy refusal: its report written to ``out_dir``, each violation one line."""
    from keel.digest import canonical_json

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "policy_report.json").write_bytes(canonical_json(e.report))
    lines = _violation_lines(e, str(job))
    lines.append(f"policy report written to {out_dir / 'policy_report.json'}")
    MRP.fail("refused", lines, EXIT_REFUSED, [v.model_dump() for v in e.report.violations])


@app.command("compile")
def compile_cmd(job: JobArg, out: OutDirOpt = None, json_out: JsonOpt = None) -> None:
    """Check a job and write its IR, manifest and policy report; refusals name rule and line."""
    from keel.mrp.dsl import parse_job
    from keel.mrp.policy import PolicyViolation

    MRP.mode(json_out)
    with MRP.reported():
        settings = toolkit.load_settings()
        text = _read_job(job)
        job_id = parse_job(text, str(job)).spec.job_id
        out_dir = out or settings.data_dir / "mrp" / "compiled" / job_id
        try:
            result = compile_job(settings, job, text)
        except PolicyViolation as e:
            _refuse(e, job, out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        files = {
            "IR.json": result.ir_json(),
            "manifest.json": result.manifest_json(),
            "policy_report.json": result.policy_report_json(),
        }
        for name, data in files.items():
            (out_dir / name).write_bytes(data)
        doc = mrp_text.compile_doc(result, out_dir, list(files))
        MRP.emit(doc, mrp_text.compile_text(doc))


# -- run -----------------------------------------------------------------------------------


def _services_died(why: str) -> CliFailure:
    return MRP.failure("unavailable", why, EXIT_ERROR)


def _run_failure(err: BaseException, workflow_id: str) -> CliFailure:
    from client.mrp import failure_of
    from keel.mrp.run import ERROR_COMPILE, ERROR_REPLAY_MISMATCH, ERROR_REPLAY_SOURCE

    kind, message = failure_of(err)
    first = message.strip().splitlines() or [""]
    if kind == ERROR_COMPILE:
        lines = [ln.strip() for ln in message.splitlines()[1:] if ln.strip()] or first
        return MRP.failure(
            "refused", lines, EXIT_REFUSED, {"type": kind, "workflow_id": workflow_id}
        )
    if kind == ERROR_REPLAY_MISMATCH:
        return MRP.failure("replay_mismatch", first[0], EXIT_REPLAY_MISMATCH, {"type": kind})
    if kind == ERROR_REPLAY_SOURCE:
        return MRP.failure("not_found", first[0], EXIT_NOT_FOUND, {"type": kind})
    return MRP.failure(
        "run_failed",
        f"run {workflow_id} failed: {kind}: {first[0]}",
        EXIT_RUN_FAILED,
        {"type": kind, "message": message, "workflow_id": workflow_id},
    )


@app.command()
def run(
    job: JobArg,
    backend: BackendOpt = None,
    wait: WaitOpt = True,
    window_size: WindowOpt = None,
    run_id: NewRunIdOpt = None,
    stay: StayOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Run a job as an MRPJob workflow; checks it locally first (as 'mrp compile')."""
    from client.mrp import refuse_oversized
    from keel.mrp.run import MRPJobInput

    _start_mode(json_out, backend)
    with MRP.reported():
        settings = toolkit.load_settings()
        text = _read_job(job)
        inp = MRPJobInput(
            job_yaml=text,
            source=job.name,
            base_dir=str(job.resolve().parent),
            run_id=run_id or uuid.uuid4().hex[:16],
            backend=backend,  # type: ignore[arg-type]
            window_size=window_size,
            requester=_requester(),
        )
        refuse_oversized(inp)  # before compiling all of what could never start
        compiled = compile_job(settings, job, text)  # fail fast, before any server starts
        job_id = compiled.ir.job_id
        wid, result, err = asyncio.run(
            start_and_wait(settings, inp, job_id, wait=wait, stay=stay, on_dead=_services_died)
        )
        if err is not None:
            raise _run_failure(err, wid)
        if result is None:
            doc = {"run_id": inp.run_id, "workflow_id": wid, "job_id": job_id, "status": "running"}
            MRP.emit(
                doc,
                f"{job_id}: started run {inp.run_id} (workflow {wid}); follow it with "
                f"`mrp inspect --run-id {inp.run_id}`",
            )
            return
        MRP.emit(_result_doc(result), _result_text(result))
        if result.status != "succeeded":
            raise typer.Exit(EXIT_RUN_FAILED)


def _requester() -> str:
    import getpass

    try:
        return getpass.getuser() or "mrp"
    except Exception:
        return "mrp"


# -- replay --------------------------------------------------------------------------------


def _replay_verdict(doc: dict[str, Any], err: BaseException | None, wid: str) -> None:
    """Fails replay_mismatch at the first digest that differs, or as the run failed (the
    comparison is the error's details in JSON mode)."""
    differing = [r for r in doc["digests"] if not r["same"]]
    if differing:
        first = differing[0]
        MRP.fail(
            "replay_mismatch",
            f"replay of {doc['run_id']} differs first at {first['what']}: original "
            f"{first['original']}, replay {first['replay']}",
            EXIT_REPLAY_MISMATCH,
            doc,
        )
    if err is not None:
        failure = _run_failure(err, wid)
        failure.details = doc
        raise failure


@app.command()
def replay(
    run_id: RunIdOpt,
    backend: BackendOpt = None,
    all_rows: AllOpt = False,
    stay: StayOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Re-run a finished run from its stored artifacts and compare every output digest.

    LLM answers come from the request-digest cache (no model call). Exits 6 naming the
    first digest that differs.
    """
    from client.mrp import replay_input
    from store.mrp_runs import get_manifest

    _start_mode(json_out, backend)
    with MRP.reported():
        settings, sessions, store, record = _stored_run(run_id)
        original = get_manifest(sessions, store, run_id)
        if original is None:
            _not_finished(run_id, record)
        inp = replay_input(record, backend, _requester())  # type: ignore[arg-type]
        new_id = inp.run_id
        wid, result, err = asyncio.run(
            start_and_wait(
                settings, inp, record.job_id, wait=True, stay=stay, on_dead=_services_died
            )
        )
        rows = original.replay_comparison(get_manifest(sessions, store, new_id))
        doc = mrp_text.replay_doc(run_id, new_id, wid, rows)
        if not output.json:
            typer.echo(mrp_text.replay_text(doc, all_rows))
        _replay_verdict(doc, err, wid)
        if output.json:
            MRP.emit(doc, "")
        if result is not None and result.status != "succeeded":
            raise typer.Exit(EXIT_RUN_FAILED)


# -- inspect -------------------------------------------------------------------------------


def _download(manifest: RunManifest, store: ArtifactStore, dest: Path) -> list[dict[str, Any]]:
    """:func:`client.mrp.download_outputs`, its refusals as this CLI reports them."""
    from client.mrp import OutputCorrupted, OutputMissing, download_outputs

    try:
        return download_outputs(manifest, store, dest)
    except OutputMissing as e:
        MRP.fail("not_found", str(e), EXIT_NOT_FOUND)
    except OutputCorrupted as e:
        MRP.fail("corrupted", str(e), EXIT_ERROR)


def _not_finished(run_id: str, record: RunRecord) -> NoReturn:
    MRP.fail("not_found", f"run {run_id} has not finished (status {record.status})", EXIT_NOT_FOUND)


@app.command()
def inspect(
    run_id: RunIdOpt,
    download: DownloadOpt = None,
    shards: ShardsOpt = 20,
    json_out: JsonOpt = None,
) -> None:
    """Show a run: manifest, phase timings, per-shard status, cost; download its outputs."""
    from keel.mrp.ir import manifest_from_json
    from store.mrp_runs import get_manifest, list_shards

    MRP.mode(json_out)
    with MRP.reported():
        _, sessions, store, record = _stored_run(run_id)
        run_manifest = get_manifest(sessions, store, run_id)
        compile_manifest = (
            manifest_from_json(store.get_bytes(record.manifest_digest))
            if record.manifest_digest
            else None
        )
        rows = list_shards(sessions, run_id)
        downloaded = None
        if download is not None:
            if run_manifest is None:
                _not_finished(run_id, record)
            downloaded = _download(run_manifest, store, download)
        doc = mrp_text.inspect_doc(record, compile_manifest, run_manifest, rows, downloaded)
        MRP.emit(
            doc,
            _inspect_text(
                record,
                compile_manifest,
                run_manifest,
                rows,
                doc["shard_states"],
                shards,
                downloaded,
            ),
        )


def main(argv: list[str] | None = None) -> None:
    MRP.main(app, argv)


if __name__ == "__main__":
    main()
