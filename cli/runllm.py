"""``runllm``: run ``.rllm`` apps like scripts, as durable ``RllmApp`` workflows.

``runllm run app.rllm --input-file in.yaml`` checks the app and the input locally, then
runs it on the configured Temporal server, or on the embedded one started on demand
(``keel up`` in the background, stopped afterwards), with a worker started when none
polls the task queue. ``validate``, ``inspect``, ``stats`` and ``exectime`` need no
server and import neither Temporal nor LiteLLM, so they start fast.

Output: one JSON document on stdout by default; human-readable text with ``--verbose``
or when stdout is a terminal (``--json`` forces JSON). Every failure is one
``RllmErrorPayload`` on stdout (the same JSON document a success would have been) with
a one-line summary on stderr, and the exit code of its class (docs/rllm-errors.md); the
CLI toolkit (``cli/toolkit.py``) carries it as the ``details`` of its ``CliError``.
Reference: docs/runllm-cli.md.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import runllm_text, toolkit
from cli.envelope import CliError
from cli.runllm_input import checked_input, read_input
from cli.toolkit import note, output
from keel.rllm.errors import RllmError, RllmErrorPayload
from keel.rllm.failures import USAGE_EXIT_CODE, RunnerFailure, internal_failure, usage_failure

if TYPE_CHECKING:
    from temporalio.client import Client

    from keel.rllm.deps import ResolvedApp
    from keel.settings import Settings

app = typer.Typer(
    help="Run .rllm apps (typed single-shot LLM programs) as durable Temporal workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

FileArg = Annotated[Path, typer.Argument(help="The .rllm file", dir_okay=False, show_default=False)]
VerboseOpt = Annotated[
    bool, typer.Option("--verbose", "-v", help="Human-readable output with details")
]
JsonOpt = toolkit.JsonOpt
InputOpt = Annotated[
    str | None,
    typer.Option("--input", "-i", help="The input: JSON, YAML, or plain text for a one-string app"),
]
InputFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--input-file",
        "-f",
        help="Read the input from a file (.json, .yaml/.yml; any other file is plain text; - is stdin)",
        dir_okay=False,
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        help="A model name from the models config, or a LiteLLM model string "
        "(openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, hosted_vllm/...)",
    ),
]


# ``run``'s own options.
MaxRetriesOpt = Annotated[
    int | None,
    typer.Option(
        "--max-retries", min=0, max=10, help="Recovery retries after the first answer (default 2)"
    ),
]
AutoPullOpt = Annotated[
    bool,
    typer.Option("--ollama-auto-pull", help="Pull missing Ollama models (KEEL_OLLAMA_AUTO_PULL)"),
]
OutputOnlyOpt = Annotated[
    bool, typer.Option("--output-only", help="Print only the app's output object")
]
TimeoutOpt = Annotated[
    float | None, typer.Option("--timeout", min=1, help="Fail the run after this many seconds")
]
StayOpt = Annotated[
    bool, typer.Option("--stay", help="Keep an embedded Keel this command started running")
]


def _dump(obj: Any) -> str:
    return toolkit.dumps(obj, pretty=output.human)


def _answer(doc: Any, human: bool, text: Callable[[], str]) -> None:
    """A command's answer: ``text()`` for people, else the document as JSON."""
    typer.echo(text() if human else _dump(doc))


def _error(payload: RllmErrorPayload, code: int) -> CliError:
    """A failure as the toolkit reports it: the payload on stdout, one summary line (and
    the hint, for people) on stderr."""
    return CliError(
        family="rllm",
        type=payload.error_code,
        message=payload.message,
        exit_code=code,
        details=payload.model_dump(mode="json"),
        lines=[f"{payload.error_type}: {payload.message}"],
        hint=payload.recovery_hint,
    )


def _translate(err: BaseException) -> CliError | None:
    """``.rllm`` errors and runner failures as their payloads (None: neither)."""
    if isinstance(err, RllmError):
        return _error(err.to_payload(), err.exit_code)
    if isinstance(err, RunnerFailure):
        return _error(err.payload, err.exit_code)
    if isinstance(err, toolkit.SettingsInvalid):
        failure = internal_failure(
            str(err),
            error_type="SettingsError",
            hint="Fix the KEEL_* environment variables (or .env) named in the message.",
        )
        return _error(failure.payload, failure.exit_code)
    return None


def _unexpected(err: BaseException) -> CliError:
    failure = internal_failure(
        f"{type(err).__name__}: {err}",
        error_type=type(err).__name__,
        details={"exception": type(err).__name__},
    )
    return _error(failure.payload, failure.exit_code)


#: The toolkit's wrapper for ``runllm``: failures are ``RllmErrorPayload`` documents.
RLLM = toolkit.Family(
    "rllm",
    _translate,
    bad_settings=None,  # _translate: an internal-error payload, as every .rllm failure
    unavailable=None,
    usage=lambda message: _error(usage_failure(message).payload, USAGE_EXIT_CODE),
    unexpected=_unexpected,
)


def _load(path: Path) -> ResolvedApp:
    from store.files import load_rllm_app

    return load_rllm_app(path)


def _models(settings: Settings) -> Any:
    from client.rllm import models_config

    return models_config(settings)


# -- validate / inspect ----------------------------------------------------------------


def _model_names(resolved: ResolvedApp, settings: Settings, override: str | None) -> dict[str, str]:
    from client.rllm import model_names

    return model_names(resolved, _models(settings), override)


@app.command()
def validate(
    file: FileArg,
    models: Annotated[
        bool,
        typer.Option(help="Also check each app's model against the models config"),
    ] = True,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Check a file, everything it uses, its llm_params and contracts (no server needed)."""
    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        root = resolved.root
        names = _model_names(resolved, toolkit.load_settings(), None) if models else {}
        out = {
            "ok": True,
            "app": root.name,
            "version": root.version,
            "format_version": root.format_version,
            "files": resolved.graph.order(),
            "graph_digest": resolved.graph.digest(),
            "models": names,
        }
        _answer(out, human, lambda: runllm_text.validate_text(file, resolved, names))


@app.command()
def inspect(file: FileArg, verbose: VerboseOpt = False, json_out: JsonOpt = None) -> None:
    """Show the parsed app: metadata, contracts, templates, blocks, dependency graph."""
    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        tree = runllm_text.inspect_tree(_load(file))
        _answer(tree, human, lambda: runllm_text.inspect_text(tree))


# -- stats / exectime ------------------------------------------------------------------


@app.command()
def stats(
    file: FileArg,
    model: ModelOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Recorded run statistics of an app and the apps it uses (per version and model)."""
    from client.rllm import app_stats

    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        settings = toolkit.load_settings()
        apps = app_stats(toolkit.sessions(settings), resolved, model)
        out = {"app": resolved.root.name, "model": model, "apps": apps}
        _answer(out, human, lambda: runllm_text.stats_text(apps, model))


@app.command()
def exectime(
    file: FileArg,
    model: ModelOpt = None,
    input_text: InputOpt = None,
    input_file: InputFileOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Predict a run's wall time from recorded stats, summed over the apps it uses."""
    from client.rllm import predicted_exectime

    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        settings = toolkit.load_settings()
        value = None
        if input_text is not None or input_file is not None:
            value = checked_input(resolved.root, read_input(resolved.root, input_text, input_file))
        out = predicted_exectime(
            toolkit.sessions(settings), resolved, _models(settings), model=model, value=value
        )
        _answer(out, human, lambda: runllm_text.exectime_text(out))


# -- run -------------------------------------------------------------------------------


async def _run_workflow(
    settings: Settings,
    resolved: ResolvedApp,
    file: Path,
    value: Any,
    *,
    model: str | None,
    max_retries: int | None,
    auto_pull: bool,
    timeout_s: float | None,
    stay: bool,
) -> tuple[str, Any]:
    """:func:`client.rllm.run_and_wait` with services on demand; says where it started
    and each line of a model pull on stderr."""
    from client.rllm import run_and_wait, run_input
    from services.local import LocalServices, ServiceUnavailable

    inp = run_input(file, value, model=model, max_retries=max_retries, auto_pull=auto_pull)
    services = LocalServices(settings, note=note)

    async def connect() -> Client:
        try:
            return await services.connect()
        except ServiceUnavailable as e:
            raise internal_failure(
                str(e),
                error_type="ServiceUnavailable",
                details={"address": settings.resolved_temporal_address},
                hint="Start the server named in the message, or unset KEEL_TEMPORAL_ADDRESS "
                "to use the embedded one (keel up).",
            ) from None

    def started(wid: str) -> None:
        if output.human:
            note(f"Started {wid} on task queue {settings.task_queue!r}")

    return await run_and_wait(
        services,
        connect,
        inp,
        app_name=resolved.root.name,
        task_queue=settings.task_queue,
        timeout_s=timeout_s,
        keep=stay,
        on_started=started,
        on_pull=(lambda line: note(f"ollama: {line}")) if auto_pull else None,
    )


@app.command()
def run(
    file: FileArg,
    input_text: InputOpt = None,
    input_file: InputFileOpt = None,
    model: ModelOpt = None,
    max_retries: MaxRetriesOpt = None,
    ollama_auto_pull: AutoPullOpt = False,
    output_only: OutputOnlyOpt = False,
    timeout: TimeoutOpt = None,
    stay: StayOpt = False,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Run an app on an input and print its output (a durable RllmApp workflow)."""
    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        value = read_input(resolved.root, input_text, input_file)
        checked_input(resolved.root, value)  # fail fast, before any server starts
        settings = toolkit.load_settings()
        start = time.monotonic()
        wid, result = asyncio.run(
            _run_workflow(
                settings,
                resolved,
                file,
                value,
                model=model,
                max_retries=max_retries,
                auto_pull=ollama_auto_pull or settings.ollama_auto_pull,
                timeout_s=timeout,
                stay=stay,
            )
        )
        if output_only:
            typer.echo(_dump(result.output))
        elif human:
            typer.echo(runllm_text.result_text(wid, result, settings, verbose))
            if verbose:
                note(f"runllm: {time.monotonic() - start:.2f} s wall")
        else:
            typer.echo(_dump({"workflow_id": wid, **result.model_dump(mode="json")}))


def main(argv: list[str] | None = None) -> None:
    RLLM.main(app, argv)


if __name__ == "__main__":
    main()
