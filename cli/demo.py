"""``keel demo``: the main job end to end, then every family's examples, each step printed.

The demo narrates what it runs (one line per step) and returns the checks that failed;
``keel demo`` (``cli/keel.py``) starts and stops the services around it."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cli.toolkit import sessions
from keel.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from keel.demo_checks import ValueCheck


async def _run_demo(settings: Settings) -> None:
    from client.temporal import connect
    from keel.demo import DEMO_WORKFLOW_TYPE, DemoInput, DemoResult
    from keel.gates import gate_workflow_id

    client = await connect(settings)
    approver = next(t for t in settings.api_tokens if "approver" in t.roles)
    wid = f"demo/{uuid.uuid4().hex[:12]}"
    handle = await client.start_workflow(
        DEMO_WORKFLOW_TYPE,
        DemoInput(),
        id=wid,
        task_queue=settings.task_queue,
        result_type=DemoResult,
    )
    typer.echo(f"1. Started workflow {wid} (KeelDemo)")
    typer.echo("2. Asking the local model for a draft (llm.complete activity) ...")
    gate_id = gate_workflow_id(wid, "publish")
    await _approve_through_api(settings, approver, handle, wid, gate_id)
    result = await handle.result()
    _say_demo_result(settings, result, wid, gate_id)
    failed = await _run_rllm_examples(client, settings)
    failed += await _run_mrp_examples(client, settings)
    failed += await _run_srl_example(client, settings)
    failed += await _run_design_example(client, settings)
    if failed:
        raise RuntimeError("the demo's checks failed:\n  " + "\n  ".join(failed))
    typer.echo("All checks passed.")


async def _approve_through_api(
    settings: Settings, approver: Any, handle: Any, wid: str, gate_id: str
) -> None:
    """Wait for the demo's gate to open; approve it through the HTTP API as ``approver``."""
    import httpx

    base = f"http://127.0.0.1:{settings.api_port}"
    headers = {"Authorization": f"Bearer {approver.token.get_secret_value()}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as http:
        gate = await _wait_for_gate(http, handle, wid, gate_id)
        typer.echo(f"3. Gate opened: {gate_id}\n   {gate['subject']}")
        resp = await http.post(
            f"/gates/{gate_id}/approve",
            json={"comment": "approved by the demo"},
            headers={"Idempotency-Key": f"demo-{wid}"},
        )
        resp.raise_for_status()
        typer.echo(f"4. Approved through the API as {approver.actor} (POST /gates/.../approve)")


async def _wait_for_gate(http: Any, handle: Any, wid: str, gate_id: str) -> Any:
    """The gate as GET /gates/{id} answers once it is open (at most 10 minutes); fails
    with the workflow's own error when the LLM step failed for good."""
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

    from client.temporal import cause_chain

    deadline = time.monotonic() + 600
    while True:
        resp = await http.get(f"/gates/{gate_id}")
        if resp.status_code == 200:
            return resp.json()
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            # The LLM step failed for good (e.g. no model server): say why, don't wait.
            try:
                await handle.result()
            except WorkflowFailureError as err:
                # The innermost cause (the activity's own error) says what broke.
                cause = cause_chain(err)[-1]
                raise RuntimeError(f"the demo workflow {wid} failed: {cause}") from None
        if time.monotonic() > deadline:
            raise RuntimeError(f"gate {gate_id} did not open in 10 minutes: {resp.text}")
        await asyncio.sleep(0.25)


def _say_demo_result(settings: Settings, result: Any, wid: str, gate_id: str) -> None:
    from services.up import console_link, ui_link

    typer.echo(f"5. Workflow completed: published={result.published}")
    typer.echo(f"   draft: {result.draft!r}")
    typer.echo(
        f"   model {result.llm.model_name}: {result.llm.usage.total_tokens} tokens, "
        f"{result.llm.latency_ms:.0f} ms"
    )
    typer.echo("Where to look in the Temporal Web UI:")
    typer.echo(f"   {ui_link(settings, wid)}")
    typer.echo(f"   {ui_link(settings, gate_id)}")
    typer.echo(
        f"The Keel console (design sessions, approval inbox, runs): {console_link(settings)}"
    )


RLLM_DEMO_TEXT = (
    "Temporal is a durable execution platform. A workflow keeps its state when a worker "
    "crashes, and it resumes on another worker from the last recorded step. Teams use it "
    "to run long business processes and AI pipelines reliably."
)


async def _run_rllm_examples(client: Any, settings: Settings) -> list[str]:
    """The three example ``.rllm`` apps on the local model, as ``RllmApp`` workflows.

    Each output is validated again against its app's ``output_schema`` and checked for
    what the input implies (:data:`keel.demo_checks.CONTENT_RULES`: the summary names
    something from the input, each keyword is a short phrase of words of the input, ...);
    each model call of the recovery loop is printed. Returns the checks that failed.
    """
    from temporalio.client import WorkflowFailureError

    from client.rllm import failure_payload, start_run
    from keel.demo_checks import CONTENT_RULES, attempt_lines, content_problems, schema_problems
    from keel.rllm.run import RllmRunInput, workflow_id_for
    from keel.rllm.schema import apply_defaults
    from services.up import ui_link
    from store.files import bundle_files, load_rllm

    examples = Path(__file__).resolve().parent.parent / "examples"
    typer.echo("6. .rllm apps on the local model (RllmApp workflows, as `runllm run` runs them)")
    typer.echo(f"   input text: {RLLM_DEMO_TEXT!r}")
    failed: list[str] = []
    for name in ("summary.rllm", "extract_keywords.rllm", "compose_summary_keywords.rllm"):
        program = load_rllm(examples / name)
        wid = workflow_id_for(Path(name).stem, str(uuid.uuid4()))
        inp = RllmRunInput(path=name, files=bundle_files(examples / name), input=RLLM_DEMO_TEXT)
        handle = await start_run(client, inp, workflow_id=wid, task_queue=settings.task_queue)
        try:
            r = await handle.result()
        except WorkflowFailureError as err:
            payload, _ = failure_payload(err, workflow_id=wid)
            raise RuntimeError(
                f"the example {name} failed: {payload.error_type}: {payload.message}"
            ) from None
        calls = len(r.attempts) + sum(len(c.attempts) for c in r.children.values())
        retries = r.retries + sum(c.retries for c in r.children.values())
        typer.echo(f"   examples/{name} -> {json.dumps(r.output, ensure_ascii=False)}")
        typer.echo(
            f"      {calls} model call(s), {retries} recovery retries, "
            f"{r.usage.total_tokens} tokens, {r.total_latency_ms:.0f} ms; {ui_link(settings, wid)}"
        )
        for line in attempt_lines(r.attempts):
            typer.echo(f"      {line}")
        for alias, child in r.children.items():
            for line in attempt_lines(child.attempts):
                typer.echo(f"      {alias} ({child.app}): {line}")
        inputs = apply_defaults(program.input_schema, {"text": RLLM_DEMO_TEXT})
        bad_schema = schema_problems(r.output, program.output_schema)
        bad_content = content_problems(program.name, r.output, inputs)
        typer.echo(
            "      output_schema: "
            + ("matches" if not bad_schema else f"{len(bad_schema)} problem(s)")
            + f"; content ({CONTENT_RULES.get(program.name, 'no content check')}): "
            + ("holds" if not bad_content else f"{len(bad_content)} problem(s)")
        )
        failed += [f"examples/{name}: output does not match output_schema: {p}" for p in bad_schema]
        failed += [f"examples/{name}: content check failed: {p}" for p in bad_content]
    return failed


SRL_EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "srl" / "tasks.jsonl"
#: The demo's floor for the teacher's well-formed share (6 of 6 measured with structured
#: output; 0 of 6 before it: docs/srl-collect.md).
SRL_DEMO_MIN_WELL_FORMED = 0.9


async def _run_srl_example(client: Any, settings: Settings) -> list[str]:
    """A small SRL collection: the local model as the teacher on six refactoring tasks,
    then the gold actions replayed as the expert source; both precisions, honestly."""
    from client.srl import upload_tasks
    from store.artifacts import artifact_store_from_settings

    typer.echo("8. SRL collection on examples/srl/tasks.jsonl (SRLCollection, as `srl collect`)")
    digest, count = upload_tasks(artifact_store_from_settings(settings), SRL_EXAMPLE.read_bytes())
    failed: list[str] = []
    run = uuid.uuid4().hex[:8]
    for source, model in (("teacher", "local"), ("gold_replay", "")):
        collection = f"demo-{source.replace('_', '-')}-{run}"
        failed += await _srl_collection(client, settings, collection, source, model, digest, count)
    return failed


async def _srl_collection(
    client: Any,
    settings: Settings,
    collection: str,
    source: str,
    model: str,
    digest: str,
    count: int,
) -> list[str]:
    """One demo collection of ``source``: its precision lines and totals printed; returns
    the checks that failed."""
    from client.srl import start_collection
    from keel.srl.steps import CollectionInput
    from keel.srl.trajectory import precision_lines
    from services.up import ui_link
    from store.srl_steps import list_steps

    inp = CollectionInput(
        collection=collection,
        tasks_digest=digest,
        task_count=count,
        source=source,  # type: ignore[arg-type]
        model=model,
        # One step a task: each example task is solved by one action (the gold replay
        # verifies every one in one), and a second try on the small model doubled
        # the demo's longest step (49 s of its 121 s, measured).
        max_steps=1,
        window=3,
        # Room for a whole JSON-form answer (the step schema's bounds): a cut one
        # is recorded as truncated.
        max_tokens=512,
    )
    handle = await start_collection(client, inp, task_queue=settings.task_queue)
    t = (await handle.result()).totals
    rows = await asyncio.to_thread(list_steps, sessions(settings), collection)
    for line in precision_lines(rows):
        typer.echo(
            f"   {line.source} {line.model} {line.language}: {line.verified}/{line.total} verified"
        )
    well_formed = (t.steps - t.format_errors) / t.steps if t.steps else 0.0
    verified = t.verified_steps / t.steps if t.steps else 0.0
    typer.echo(
        f"   {collection}: {t.steps} steps, {well_formed:.0%} well-formed "
        f"({t.format_errors} malformed), {verified:.0%} verified "
        f"({t.verified_steps}; {t.sandbox_failures} sandbox failures); "
        f"{ui_link(settings, handle.id)}"
    )
    return _srl_checks(source, t, len(rows), well_formed, count)


def _srl_checks(source: str, t: Any, rows: int, well_formed: float, count: int) -> list[str]:
    """A demo collection's checks that failed: a row per step, no failed episode, ..."""
    failed: list[str] = []
    if rows != t.steps or t.failed_episodes:
        failed.append(f"SRL {source}: {rows} rows for {t.steps} steps, {t}")
    # The embedded model answers in the step's JSON form by construction (structured
    # output): fewer well-formed answers is a regression. Its verified share is the
    # small model's skill, printed, never a failure.
    if source == "teacher" and well_formed < SRL_DEMO_MIN_WELL_FORMED:
        failed.append(
            f"SRL teacher: {well_formed:.0%} of answers well-formed, "
            f"below {SRL_DEMO_MIN_WELL_FORMED:.0%}"
        )
    if source == "gold_replay" and t.verified_episodes != count:
        failed.append(f"SRL gold replay verified {t.verified_episodes} of {count} tasks")
    return failed


#: The demo's decision set, as a guided intake form: the embedded model is too small to
#: extract constraints from free text reliably, and the form skips the model.
DESIGN_DEMO_FORM: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "low",
    "data_classification": "internal",
    "workload_types": ["batch"],
    "throughput": {"data_gb_per_day": 200},
    "compliance": ["gdpr"],
}


async def _run_design_example(client: Any, settings: Settings) -> list[str]:
    """One decision set through ``DesignPipeline``: the guided form, no gate (policy
    passes and there is no previous set), the template renderer's repository and the
    validators, counted passed, failed and not run apart. Every validator is required
    (Keel has no optional ones), so one that failed or did not run fails the demo with
    its reason from the stored report. Returns the checks that failed."""
    from cli.design import user
    from client.design import start_design
    from keel.demo_checks import tally_validators
    from keel.design.steps import DesignInput
    from services.up import ui_link
    from store.design import create_project, submit_decision_set

    typer.echo("9. Design pipeline on a guided intake form (DesignPipeline, as `design run`)")
    project, ds, owner = f"demo-{uuid.uuid4().hex[:8]}", "ds1", user()
    sm = sessions(settings)
    await asyncio.to_thread(create_project, sm, project, owner=owner, name="keel demo")
    await asyncio.to_thread(submit_decision_set, sm, project, ds)
    inp = DesignInput(
        project=project,
        decision_set=ds,
        requester=owner,
        intake=DESIGN_DEMO_FORM,
        require_approval=False,
    )
    started = time.monotonic()
    handle = await start_design(client, inp, task_queue=settings.task_queue)
    r = await handle.result()
    elapsed = time.monotonic() - started
    checks = ", ".join(f"{k} {v}" for k, v in r.validation.items())
    policy = r.policy.overall if r.policy else "-"
    cost = f"${r.cost.monthly_usd:,.2f}/month" if r.cost else "-"
    typer.echo(
        f"   {project}/{ds}: {r.status}, version {r.version}, "
        f"{len(r.plan.choices) if r.plan else 0} capabilities, {cost}, policy {policy}; "
        f"{r.file_count} files generated in {elapsed:.0f}s"
    )
    typer.echo(f"      validators: {checks}")
    tally = tally_validators(r.validation, await asyncio.to_thread(_validator_reasons, settings, r))
    typer.echo(f"      validators: {tally.line} (every validator the pipeline runs is required)")
    typer.echo(
        f"      `design show {project} {ds}`, `design download {project} {ds}`; "
        f"{ui_link(settings, handle.id)}"
    )
    failed: list[str] = []
    if r.status != "completed" or not r.archive_digest:
        failed.append(f"design {project}/{ds} ended {r.status}")
    failed += [f"design {project}/{ds}: {problem}" for problem in tally.problems]
    return failed


def _validator_reasons(settings: Settings, r: Any) -> dict[str, str]:
    """Each validator's summary (why it failed or did not run) from the design run's
    stored validation report; empty when the run stored none."""
    from store.artifacts import artifact_store_from_settings

    if not r.validation_digest:
        return {}
    report = artifact_store_from_settings(settings).get_json(r.validation_digest)
    return {str(x["name"]): str(x.get("summary", "")) for x in report.get("results", [])}


MRP_EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "mrp"


async def _run_mrp_examples(
    client: Any,
    settings: Settings,
    examples: Path = MRP_EXAMPLES,
    names: tuple[str, ...] = ("wordcount", "sentiment", "invoices"),
) -> list[str]:
    """The three example MRP jobs (examples/mrp) as ``MRPJob`` workflows on Ray.

    A pure example's produced values (read back from its output file) are compared with
    examples/mrp/expected/<name>.json, worked out from the inputs apart from Keel's code
    (examples/mrp/expected/derive.py); its output digests are checked against
    examples/mrp/golden.json as well, a regression check. The LLM example has no expected
    values or golden digests (a model's answers depend on the CPU llama.cpp was built
    for): how many replies had a label word is printed, every review must have a row, and
    a replay of the run, answering from the run's own LLM cache, must reproduce every
    digest. Returns the checks that failed.
    """
    from keel.mrp.dsl import parse_job
    from keel.mrp.run import MRPJobInput

    golden = json.loads((examples / "golden.json").read_text())
    failed: list[str] = []
    typer.echo("7. MRP jobs (MRPJob workflows on Ray, as `mrp run` runs them)")
    for name in names:
        job = examples / f"{name}.yaml"
        text = job.read_text()
        spec = parse_job(text, job.name).spec
        inp = MRPJobInput(job_yaml=text, source=job.name, base_dir=str(examples))
        r = await _mrp_run(client, settings, spec.job_id, inp)
        ok, check = await _mrp_digest_check(client, settings, spec.job_id, r, golden.get(name))
        if not ok:
            failed.append(f"examples/mrp/{job.name}: {check}")
        values = _mrp_values(examples, name, spec, r)
        if values is not None:
            failed += [f"examples/mrp/{job.name}: {d}" for d in _first(values.differences)]
        _say_mrp_example(settings, job.name, spec.job_id, r, check, values)
    return failed


async def _mrp_run(client: Any, settings: Settings, job_id: str, inp: Any) -> Any:
    """``inp`` as an ``MRPJob`` under a new run id, and its result."""
    from temporalio.client import WorkflowFailureError

    from client.mrp import failure_of, start_job
    from keel.mrp.run import workflow_id_for

    run_id = uuid.uuid4().hex[:16]
    wid = workflow_id_for(job_id, run_id)
    handle = await start_job(
        client,
        inp.model_copy(update={"run_id": run_id}),
        workflow_id=wid,
        task_queue=settings.task_queue,
    )
    try:
        return await handle.result()
    except WorkflowFailureError as err:
        kind, message = failure_of(err)
        raise RuntimeError(f"the MRP job {wid} failed: {kind}: {message}") from None


async def _mrp_digest_check(
    client: Any, settings: Settings, job_id: str, r: Any, golden: dict[str, str] | None
) -> tuple[bool, str]:
    """Golden digests (a pure example) or a replay's (the LLM example): ok, and the line."""
    from keel.mrp.run import MRPJobInput

    if golden is not None:
        ok = r.output_digests == golden
        return ok, "matches golden.json" if ok else "DIFFERS from golden.json"
    replay = await _mrp_run(
        client, settings, job_id, MRPJobInput(replay_of=r.run_id, llm_replay_only=True)
    )
    ok = replay.replay_matched is True and replay.output_digests == r.output_digests
    return ok, (
        f"replay {replay.run_id} matched every digest"
        if ok
        else f"replay {replay.run_id} DIFFERS from the run"
    )


def _mrp_values(examples: Path, name: str, spec: Any, r: Any) -> ValueCheck | None:
    """A succeeded run's produced values checked: against examples/mrp/expected (the
    pure examples), or a row and a label tally per review (sentiment)."""
    from keel.demo_checks import compare_invoices, compare_wordcount, sentiment_tally

    compare: dict[str, Callable[[Any, Any], ValueCheck]] = {
        "wordcount": lambda out, want: compare_wordcount(out["data"], want),
        "invoices": compare_invoices,
    }
    if r.status == "succeeded" and name in compare:
        want = json.loads((examples / "expected" / f"{name}.json").read_text())
        values = compare[name](_produced_value(r), want)
        values.line += f" (examples/mrp/expected/{name}.json)"
        return values
    if r.status == "succeeded" and name == "sentiment":
        return sentiment_tally(_produced_value(r)["data"], len(spec.inputs.items or []))
    return None


def _say_mrp_example(
    settings: Settings, job: str, job_id: str, r: Any, check: str, values: ValueCheck | None
) -> None:
    from keel.mrp.run import workflow_id_for
    from services.up import ui_link

    c = r.counters
    typer.echo(
        f"   examples/mrp/{job}: {r.status}, {c.total} shards ({c.run} run, "
        f"{c.skipped} from checkpoints), {r.cost.units} units, "
        f"{r.cost.llm_calls} LLM calls ({r.cost.llm_cached} cached); {check}"
    )
    if values is not None:
        typer.echo(f"      {values.line}")
    typer.echo(f"      reduce {r.reduce_digest}")
    for key, digest in r.output_digests.items():
        if key.startswith("produced:") and not key.endswith(".audit.jsonl"):
            typer.echo(f"      {key.removeprefix('produced:')} {digest}")
    wid = workflow_id_for(job_id, r.run_id)
    typer.echo(f"      run {r.run_id}: `mrp inspect --run-id {r.run_id}`; {ui_link(settings, wid)}")


def _first(lines: list[str], most: int = 10) -> list[str]:
    """At most ``most`` of ``lines``, then one saying how many more there were."""
    more = len(lines) - most
    return lines[:most] + ([f"... and {more} more"] if more > 0 else [])


def _produced_value(r: Any) -> Any:
    """The value an MRP run produced, read back from its one data file under the run's
    output root (JSON as parsed, Parquet as a list of row dicts). The bytes must still have
    the digest the run recorded, so it is the file the golden digests speak of."""
    from keel.digest import digest_bytes

    data = [f for f in r.produced if not f.path.endswith(".audit.jsonl")]
    if len(data) != 1 or r.output_root is None:
        raise RuntimeError(f"MRP run {r.run_id}: expected one output file, got {r.produced}")
    path = Path(r.output_root) / data[0].path
    raw = path.read_bytes()
    if digest_bytes(raw) != data[0].digest:
        raise RuntimeError(f"MRP run {r.run_id}: {path} no longer has digest {data[0].digest}")
    if path.suffix == ".parquet":
        import io

        import pyarrow.parquet as pq

        return pq.read_table(io.BytesIO(raw)).to_pylist()
    return json.loads(raw)
