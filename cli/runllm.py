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
import json
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import toolkit
from cli.envelope import CliError
from cli.toolkit import note, output
from keel.rllm.errors import RllmError, RllmErrorPayload
from keel.rllm.failures import USAGE_EXIT_CODE, RunnerFailure, internal_failure, usage_failure

if TYPE_CHECKING:
    from temporalio.client import Client

    from keel.rllm.deps import ResolvedApp
    from keel.rllm.model import RllmProgram
    from keel.settings import Settings
    from services.local import LocalServices

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


def _dump(obj: Any) -> str:
    return toolkit.dumps(obj, pretty=output.human)


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
    from keel.llm import ModelsConfigError
    from store.files import load_models_config

    try:
        return load_models_config(settings.models_config)
    except ModelsConfigError as e:
        raise internal_failure(
            str(e),
            error_type="ModelsConfigError",
            hint="Fix the models config (KEEL_MODELS_CONFIG, default configs/models.yaml).",
        ) from None


# -- input ---------------------------------------------------------------------------


def _parse_text_input(program: RllmProgram, text: str) -> Any:
    """JSON, a YAML mapping of the app's inputs, or else the text itself."""
    import yaml

    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            return json.loads(stripped)
        except ValueError:
            pass
        try:
            return yaml.safe_load(stripped)
        except yaml.YAMLError:
            return text
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    props = program.input_schema.get("properties", {})
    # "Note: read this" is YAML for {"Note": "read this"}: only a mapping of the app's
    # own input names is taken as structured input, anything else is text.
    if isinstance(value, dict) and value and all(k in props for k in value):
        return value
    return text


def read_input(program: RllmProgram, text: str | None, file: Path | None) -> Any:
    """The input as given on the command line (before defaults and the schema check)."""
    import yaml

    if text is not None and file is not None:
        raise usage_failure("give the input with --input or --input-file, not both")
    if file is not None:
        try:
            raw = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise usage_failure(
                f"cannot read the input file {file}: {getattr(e, 'strerror', None) or e}",
                details={"input_file": str(file)},
            ) from None
        suffix = file.suffix.lower()
        try:
            if suffix == ".json":
                return json.loads(raw)
            if suffix in (".yaml", ".yml"):
                return yaml.safe_load(raw)
        except (ValueError, yaml.YAMLError) as e:
            raise usage_failure(
                f"the input file {file} is not valid {suffix[1:].upper()}: {e}",
                details={"input_file": str(file)},
            ) from None
        return _parse_text_input(program, raw)
    if text is None:
        return {}
    return _parse_text_input(program, text)


def checked_input(program: RllmProgram, value: Any) -> dict[str, Any]:
    """The input coerced and checked against ``input_schema`` (defaults filled in)."""
    from keel.rllm.contracts import coerce_input, validate_input

    return validate_input(program, coerce_input(program, value))


# -- validate / inspect ----------------------------------------------------------------


def _model_names(resolved: ResolvedApp, settings: Settings, override: str | None) -> dict[str, str]:
    from keel.rllm.run import resolve_model_name

    models = _models(settings)
    return {
        key: resolve_model_name(p.llm, override, models)
        for key, p in resolved.programs.items()
        if p.needs_llm
    }


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
        if not human:
            typer.echo(_dump(out))
            return
        typer.echo(f"{file}: ok: {root.name} {root.version} (format {root.format_version})")
        for key in resolved.graph.order():
            p = resolved.programs[key]
            model = names.get(
                key, "no model call" if not p.needs_llm else f"{p.llm.provider}/{p.llm.model}"
            )
            typer.echo(f"  {key}: {p.name} {p.version}, model {model}")


def _inspect_tree(resolved: ResolvedApp) -> dict[str, Any]:
    from keel.rllm.render import template_refs

    root = resolved.root
    return {
        "app": {
            "name": root.name,
            "version": root.version,
            "format_version": root.format_version,
            "description": root.description,
            "author": root.author,
            "tags": root.tags,
            "metadata": root.metadata,
            "source_path": root.source_path,
            "source_digest": root.source_digest,
        },
        "llm": {
            "provider": root.llm.provider,
            "model": root.llm.model,
            "llm_params": root.llm_params,
            "max_context_window": root.max_context_window,
            "max_tokens": root.max_tokens,
            "needs_llm": root.needs_llm,
            "recommended_models": [m.litellm_model for m in root.recommended_models],
        },
        "contracts": {
            "input_schema": root.input_schema,
            "output_schema": root.output_schema,
            "llm_output_schema": root.llm_output_schema() if root.needs_llm else None,
            "output_map": root.output_map,
            "output_format": root.output_format,
        },
        "templates": {
            "prompt": root.prompt_template,
            "prompt_variables": sorted({r.name for r in template_refs(root.prompt_template)}),
            "recovery": root.recovery_template,
        },
        "python_blocks": [
            b.model_dump(include={"name", "stage", "inputs", "outputs", "line"})
            for b in root.python_blocks
        ],
        "uses": [u.model_dump() for u in root.uses],
        "graph": {
            "root": resolved.graph.root,
            "order": resolved.graph.order(),
            "digest": resolved.graph.digest(),
            "nodes": {
                k: {
                    "name": n.name,
                    "version": n.version,
                    "needs_llm": n.needs_llm,
                    "llm": f"{n.llm.provider}/{n.llm.model}",
                    "source_digest": n.source_digest,
                }
                for k, n in resolved.graph.nodes.items()
            },
            "edges": [e.model_dump() for e in resolved.graph.edges],
        },
    }


def _print_inspect(tree: dict[str, Any]) -> None:
    a, llm, c = tree["app"], tree["llm"], tree["contracts"]
    typer.echo(f"{a['name']} {a['version']} (format {a['format_version']}) by {a['author']}")
    typer.echo(f"  {a['description']}")
    if llm["needs_llm"]:
        typer.echo(
            f"model: {llm['provider']}/{llm['model']}  window {llm['max_context_window']}, "
            f"max_tokens {llm['max_tokens']}  params {json.dumps(llm['llm_params'])}"
        )
    else:
        typer.echo("model: none (every output field comes from output_map)")
    if llm["recommended_models"]:
        typer.echo(f"recommended: {', '.join(llm['recommended_models'])}")
    typer.echo("input:")
    _print_schema(c["input_schema"])
    typer.echo("output:")
    _print_schema(c["output_schema"], c["output_map"])
    if tree["templates"]["prompt_variables"]:
        typer.echo(f"prompt variables: {', '.join(tree['templates']['prompt_variables'])}")
    if llm["needs_llm"]:
        typer.echo(f"recovery prompt: {'own' if tree['templates']['recovery'] else 'default'}")
    for b in tree["python_blocks"]:
        typer.echo(
            f"python {b['stage']} block {b['name']} (line {b['line']}): "
            f"{', '.join(b['inputs']) or '-'} -> {', '.join(b['outputs'])}"
        )
    g = tree["graph"]
    if g["edges"]:
        typer.echo("dependency graph:")
        _print_graph(g, g["root"], "  ", set())
        typer.echo(f"run order: {' -> '.join(g['order'])}")


def _print_schema(schema: dict[str, Any], output_map: dict[str, str] | None = None) -> None:
    required = set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        kind = prop.get("type", "any")
        kind = "/".join(kind) if isinstance(kind, list) else kind
        if kind == "array" and isinstance(prop.get("items"), dict):
            kind = f"array of {prop['items'].get('type', 'any')}"
        extra = []
        if name in required:
            extra.append("required")
        if "default" in prop:
            extra.append(f"default {json.dumps(prop['default'])}")
        if output_map and name in output_map:
            extra.append(f"from {output_map[name]}")
        desc = f"  {prop['description']}" if prop.get("description") else ""
        typer.echo(f"  {name}: {kind}{' (' + ', '.join(extra) + ')' if extra else ''}{desc}")


def _print_graph(g: dict[str, Any], key: str, indent: str, seen: set[str]) -> None:
    node = g["nodes"][key]
    typer.echo(
        f"{indent}{key} ({node['name']} {node['version']}, {node['llm'] if node['needs_llm'] else 'no model call'})"
    )
    if key in seen:
        return
    seen.add(key)
    for e in g["edges"]:
        if e["parent"] == key:
            maps = ", ".join(f"{k} <- {v}" for k, v in e["input_map"].items())
            after = f", after {', '.join(e['after'])}" if e["after"] else ""
            typer.echo(
                f"{indent}  as {e['alias']}: exposes {', '.join(e['exposes'])}; {maps}{after}"
            )
            _print_graph(g, e["child"], indent + "    ", seen)


@app.command()
def inspect(file: FileArg, verbose: VerboseOpt = False, json_out: JsonOpt = None) -> None:
    """Show the parsed app: metadata, contracts, templates, blocks, dependency graph."""
    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        tree = _inspect_tree(_load(file))
        if human:
            _print_inspect(tree)
        else:
            typer.echo(_dump(tree))


# -- stats / exectime ------------------------------------------------------------------


@app.command()
def stats(
    file: FileArg,
    model: ModelOpt = None,
    verbose: VerboseOpt = False,
    json_out: JsonOpt = None,
) -> None:
    """Recorded run statistics of an app and the apps it uses (per version and model)."""
    from store.rllm_stats import get_stats

    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        settings = toolkit.load_settings()
        sessions = toolkit.sessions(settings)
        apps: list[dict[str, Any]] = []
        for key in reversed(resolved.graph.order()):  # root first
            p = resolved.programs[key]
            rows = get_stats(sessions, p.name, model)
            apps.append(
                {
                    "key": key,
                    "app": p.name,
                    "version": p.version,
                    "stats": [s.model_dump(mode="json") for s in rows],
                }
            )
        out = {"app": resolved.root.name, "model": model, "apps": apps}
        if not human:
            typer.echo(_dump(out))
            return
        for entry in apps:
            typer.echo(f"{entry['key']} ({entry['app']}, file version {entry['version']}):")
            if not entry["stats"]:
                typer.echo("  no recorded runs" + (f" on {model}" if model else ""))
            for s in entry["stats"]:
                typer.echo(
                    f"  v{s['app_version']} on {s['model']}: {s['runs']} runs, "
                    f"{s['successes']} ok, {s['failures']} failed; input compliance "
                    f"{_pct(s['input_compliance_pct'])}, output {_pct(s['output_compliance_pct'])}"
                )
                typer.echo(
                    f"    avg {s['avg_latency_ms']:.0f} ms (model {s['avg_llm_latency_ms']:.0f} ms), "
                    f"tokens {s['avg_prompt_tokens']:.0f} in / {s['avg_completion_tokens']:.0f} out "
                    f"(max out {s['max_completion_tokens']}), {_num(s['ms_per_1k_tokens'])} ms/1k tokens, "
                    f"{s['avg_retries']:.2f} retries, {_num(s['tokens_per_attempt'])} tokens/attempt"
                )


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.0f}%"


def _num(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def prompt_tokens_for(program: RllmProgram, value: dict[str, Any]) -> int | None:
    """Estimated prompt tokens of the root app for an input (None without a model call).

    Pre-block outputs are not known before the run: each is taken to be as long as the
    block's inputs together (a cleaning block keeps the text's size). Child outputs read
    by the template are left out.
    """
    from keel.rllm.contracts import render_prompt, template_variables
    from keel.rllm.estimate import estimate_prompt_tokens

    if not program.needs_llm:
        return None
    pre: dict[str, Any] = {}
    scope = dict(value)
    for block in program.pre_blocks:
        guess = " ".join(
            v if isinstance(v, str) else json.dumps(v)
            for n in block.inputs
            if (v := scope.get(n)) is not None
        )
        for out in block.outputs:
            pre[out] = guess
        scope.update(pre)
    return estimate_prompt_tokens(
        render_prompt(program, template_variables(program, value, pre_outputs=pre))
    )


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
    from store.rllm_stats import predict_exectime

    human = not RLLM.mode(json_out, verbose=verbose)
    with RLLM.reported():
        resolved = _load(file)
        settings = toolkit.load_settings()
        tokens = None
        if input_text is not None or input_file is not None:
            value = checked_input(resolved.root, read_input(resolved.root, input_text, input_file))
            tokens = prompt_tokens_for(resolved.root, value)
        pred = predict_exectime(
            toolkit.sessions(settings),
            resolved,
            _models(settings),
            model=model,
            prompt_tokens=tokens,
        )
        out = {**pred.model_dump(mode="json"), "prompt_tokens": tokens}
        if not human:
            typer.echo(_dump(out))
            return
        total = out["predicted_ms"]
        typer.echo(
            f"{pred.app}: "
            + (f"about {total / 1000:.2f} s" if total is not None else "no prediction")
            + (f" for a prompt of ~{tokens} tokens" if tokens is not None else "")
        )
        for part in out["parts"]:
            ms = part["predicted_ms"]
            typer.echo(
                f"  {part['key']}: {part['app']} v{part['app_version']} on {part['model']}: "
                + (
                    f"{ms:.0f} ms from {part['runs']} runs ({part['basis']})"
                    if ms is not None
                    else "no recorded runs"
                )
            )
        if out["missing"]:
            typer.echo(f"run these first: {', '.join(out['missing'])}")


# -- run -------------------------------------------------------------------------------


async def _watch(
    client: Client, workflow_id: str, services: LocalServices, show_pulls: bool
) -> None:
    """Runs beside the result wait: starts a worker when none picks the run up, fails when
    a service we started dies, prints pulls.

    The worker check runs here rather than before the wait: with a worker up, the result
    usually arrives before the check's first describe would have, so a run pays nothing
    for it (bench/cli_latency.py).
    """
    from keel.rllm.ollama import OLLAMA_ENSURE, OllamaProgress

    await services.ensure_worker(workflow_id, "runllm-worker.log")
    handle = client.get_workflow_handle(workflow_id)
    last = ""

    async def pull_progress() -> None:
        nonlocal last
        desc = await handle.describe()
        for pa in desc.raw_description.pending_activities:
            if pa.activity_type.name != OLLAMA_ENSURE.name:
                continue
            if not pa.heartbeat_details.payloads:
                continue
            [raw] = await client.data_converter.decode(pa.heartbeat_details.payloads, [dict])
            line = OllamaProgress.model_validate(raw).line()
            if line != last:
                note(f"ollama: {line}")
                last = line

    await toolkit.watch_services(
        services,
        on_dead=lambda why: internal_failure(why, error_type="WorkerExited"),
        tick=pull_progress if show_pulls else None,
    )


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
    from temporalio.client import WorkflowFailureError

    from client.rllm import failure_payload, start_run
    from keel.rllm.run import RllmRunInput, workflow_id_for
    from store.files import bundle_files

    inp = RllmRunInput(
        path=file.name,
        files=bundle_files(file),
        input=value,
        model=model,
        max_retries=max_retries,
        ollama_auto_pull=auto_pull,
    )
    from services.local import LocalServices, ServiceUnavailable

    services = LocalServices(settings, note=note)
    try:
        try:
            client = await services.connect()
        except ServiceUnavailable as e:
            raise internal_failure(
                str(e),
                error_type="ServiceUnavailable",
                details={"address": settings.resolved_temporal_address},
                hint="Start the server named in the message, or unset KEEL_TEMPORAL_ADDRESS "
                "to use the embedded one (keel up).",
            ) from None
        wid = workflow_id_for(resolved.root.name, str(uuid.uuid4()))
        handle = await start_run(
            client,
            inp,
            workflow_id=wid,
            task_queue=settings.task_queue,
            timeout=timedelta(seconds=timeout_s) if timeout_s else None,
        )
        if output.human:
            note(f"Started {wid} on task queue {settings.task_queue!r}")
        try:
            return wid, await toolkit.wait_watching(
                handle.result(), _watch(client, wid, services, auto_pull)
            )
        except WorkflowFailureError as err:
            payload, code = failure_payload(err, workflow_id=wid)
            raise RunnerFailure(payload, code) from None
    finally:
        await asyncio.to_thread(services.stop, stay)


def _print_result(wid: str, result: Any, settings: Settings, verbose: bool) -> None:
    r = result
    attempts = len(r.attempts)
    head = f"{r.app} {r.version}" + (f" on {r.model}" if r.model else "")
    typer.echo(
        f"{head}: ok after {attempts} attempt{'s' if attempts != 1 else ''} "
        f"({r.retries} retr{'ies' if r.retries != 1 else 'y'}), {r.usage.total_tokens} tokens, "
        f"model {r.llm_latency_ms:.0f} ms, total {r.total_latency_ms:.0f} ms"
    )
    typer.echo(json.dumps(r.output, indent=2, ensure_ascii=False))
    if verbose:
        _print_attempts(r, "")
        typer.echo(f"workflow {wid}")
        if not settings.temporal_address:
            from services.up import ui_link

            typer.echo(f"  {ui_link(settings, wid)}  (while keel up runs)")


def _print_attempts(r: Any, indent: str) -> None:
    for a in r.attempts:
        state = "ok" if a.ok else "invalid"
        typer.echo(
            f"{indent}attempt {a.attempt} ({a.model_name}): {state}, "
            f"{a.usage.prompt_tokens}+{a.usage.completion_tokens} tokens, {a.latency_ms:.0f} ms"
        )
        for e in a.errors:
            typer.echo(f"{indent}  - {e}")
    for alias, child in r.children.items():
        typer.echo(
            f"{indent}uses {alias}: {child.app} {child.version}: {len(child.attempts)} attempts, "
            f"{child.usage.total_tokens} tokens"
        )
        _print_attempts(child, indent + "  ")


@app.command()
def run(
    file: FileArg,
    input_text: InputOpt = None,
    input_file: InputFileOpt = None,
    model: ModelOpt = None,
    max_retries: Annotated[
        int | None,
        typer.Option(
            "--max-retries",
            min=0,
            max=10,
            help="Recovery retries after the first answer (default 2)",
        ),
    ] = None,
    ollama_auto_pull: Annotated[
        bool,
        typer.Option(
            "--ollama-auto-pull", help="Pull missing Ollama models (KEEL_OLLAMA_AUTO_PULL)"
        ),
    ] = False,
    output_only: Annotated[
        bool, typer.Option("--output-only", help="Print only the app's output object")
    ] = False,
    timeout: Annotated[
        float | None, typer.Option("--timeout", min=1, help="Fail the run after this many seconds")
    ] = None,
    stay: Annotated[
        bool, typer.Option("--stay", help="Keep an embedded Keel this command started running")
    ] = False,
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
            _print_result(wid, result, settings, verbose)
            if verbose:
                note(f"runllm: {time.monotonic() - start:.2f} s wall")
        else:
            typer.echo(_dump({"workflow_id": wid, **result.model_dump(mode="json")}))


def main(argv: list[str] | None = None) -> None:
    RLLM.main(app, argv)


if __name__ == "__main__":
    main()
