"""``MRPJob`` end to end on the real dev server, with real Ray (local, loopback) and threads.

Operators are the shipped ones plus the test operators in tests/support/mrp_operators
(signed with the dev key; that folder's mrp.yaml is the config). Ray starts once for the
module (in this process, where the worker's activities run) and is shut down at the end.
LLM calls go to the scripted OpenAI-compatible HTTP server.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from keel.digest import digest_bytes
from keel.gates import GateDecision, GateState, gate_workflow_id
from keel.mrp.run import (
    ERROR_COMPILE,
    ERROR_REPLAY_MISMATCH,
    MRPJobInput,
    workflow_id_for,
)
from keel.settings import Settings
from store.artifacts import artifact_store_from_settings
from store.db import get_sessionmaker
from store.mrp_runs import finish_run, get_manifest, get_run, list_shards
from store.records import list_llm_calls
from tests.support.mrp_jobs import run_job
from tests.support.scripted_openai import RecordedRequest, ScriptedOpenAIServer, ScriptedReply
from workers.main import build_worker
from workflows.mrp import MRPJob

REPO = Path(__file__).resolve().parents[3]
TEST_OPERATORS = REPO / "tests" / "support" / "mrp_operators"
TEST_CONFIG = TEST_OPERATORS / "mrp.yaml"


pytestmark = pytest.mark.usefixtures("ray_for_module")


def job_yaml(
    job_id: str,
    items: Sequence[object],
    *,
    map_op: str = "word-count@1.0.0",
    map_params: dict[str, object] | None = None,
    shard_size: int = 2,
    extra: str = "",
    **policy: object,
) -> str:
    policy = {"max_workers": 2, "budget_units": "1000", **policy}
    lines = "".join(f"\n  {k}: {json.dumps(v)}" for k, v in policy.items())
    return f"""
dsl_version: "0.1"
job_id: {job_id}
inputs:
  items: {json.dumps(list(items))}
  shard_size: {shard_size}
map:
  operator: {map_op}
  params: {json.dumps(map_params or {})}
reduce:
  operator: numeric-sum@1.0.0
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out/{job_id}.json}}
policy:{lines}
{extra}
"""


TEXTS = [{"text": f"item {i} says hello world {i % 3}"} for i in range(12)]


async def test_same_job_twice_and_replays_on_both_backends_give_equal_digests(
    client: Client, mrp_settings: Settings
) -> None:
    """Run on threads; run again on Ray (all shards from the checkpoint index); replay on
    Ray and on threads (every shard recomputed): every digest is equal."""
    settings = mrp_settings
    job_id = "wc-determinism"
    yaml_text = job_yaml(job_id, TEXTS)
    async with build_worker(client, settings):
        first = await run_job(
            client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="threads")
        )
        assert first.status == "succeeded", first
        assert (first.counters.total, first.counters.run, first.counters.skipped) == (6, 6, 0)
        second = await run_job(
            client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="ray")
        )
        assert (second.counters.run, second.counters.skipped) == (0, 6)
        on_ray = await run_job(
            client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="ray")
        )
        on_threads = await run_job(
            client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="threads")
        )
    for replay in (on_ray, on_threads):
        assert replay.status == "succeeded" and replay.replay_matched is True
        assert replay.counters.run == 6 and replay.counters.skipped == 0
    digests = first.output_digests
    assert set(digests) == {
        "shards",
        "reduce",
        f"produced:out/{job_id}.json",
        f"produced:out/{job_id}.json.audit.jsonl",
    }
    for other in (second, on_ray, on_threads):
        assert other.output_digests == digests
    # The sink file is what the manifest says, under the run's own output root.
    out = Path(first.output_root or "") / f"out/{job_id}.json"
    assert digest_bytes(out.read_bytes()) == digests[f"produced:out/{job_id}.json"]
    assert json.loads(out.read_text())["data"]["totals"]["items"] == "12"
    sm = get_sessionmaker(settings.resolved_database_url)
    store = artifact_store_from_settings(settings)
    run = get_run(sm, first.run_id)
    assert run is not None and run.status == "succeeded"
    assert run.run_manifest_digest == first.run_manifest_digest
    manifest = get_manifest(sm, store, first.run_id)
    assert manifest is not None and manifest.digest() == first.run_manifest_digest
    assert [s.state for s in manifest.shards] == ["succeeded"] * 6
    assert manifest.output_digests() == digests
    # Ray-run shards ran in Ray worker processes, not in this one.
    assert {s.source for s in list_shards(sm, on_ray.run_id)} == {"computed"}


def by_prompt(req: RecordedRequest) -> ScriptedReply:
    text = str((req.json or {}).get("messages", [{}])[-1].get("content", "")).lower()
    if "loved" in text:
        return ScriptedReply(content=" Positive.", prompt_tokens=40, completion_tokens=2)
    if "awful" in text:
        return ScriptedReply(content="negative", prompt_tokens=40, completion_tokens=1)
    return ScriptedReply(content="neutral", prompt_tokens=40, completion_tokens=1)


async def test_llm_job_on_ray_replays_from_the_cache_without_model_calls(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    reviews = [f"I loved part {i}" if i % 3 == 0 else f"awful part {i}" for i in range(8)]
    with ScriptedOpenAIServer(default=by_prompt) as server:
        models = tmp_path / "models.yaml"
        models.write_text(
            "default: scripted\nmodels:\n  scripted:\n    litellm_model: openai/scripted\n"
            f"    api_base: {server.base_url}\n"
            "    input_cost_per_token: 0.0\n    output_cost_per_token: 0.0\n"
        )
        settings = mrp_settings.model_copy(update={"models_config": models})
        job_id = "sentiment-llm"
        yaml_text = job_yaml(
            job_id,
            reviews,
            map_op="sentiment-label@1.0.0",
            shard_size=2,
            egress=["llm"],
            budget_usd="1",
        )
        async with build_worker(client, settings):
            first = await run_job(
                client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="ray")
            )
            calls = len(server.chat_requests)
            replay = await run_job(
                client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="threads")
            )
    assert first.status == "succeeded", first
    assert calls == 8 and first.cost.llm_calls == 8 and first.cost.llm_cached == 0
    assert replay.replay_matched is True and replay.output_digests == first.output_digests
    assert len(server.chat_requests) == calls  # the replay made no model call
    assert replay.cost.llm_calls == 8 and replay.cost.llm_cached == 8
    out = json.loads((Path(first.output_root or "") / f"out/{job_id}.json").read_text())
    assert out["data"]["totals"]["counts.positive"] == "3"
    assert out["data"]["totals"]["counts.negative"] == "5"


async def test_llm_job_writes_each_model_call_to_llm_calls_and_none_for_cache_hits(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    """MRP's model calls go through the gateway's recording path: one ``llm_calls`` row per
    real call (made in Ray worker processes here), with model, tokens and cost; a replay
    answered from the cache adds none."""
    reviews = ["I loved it", "awful", "awful again", "I loved that too"]
    with ScriptedOpenAIServer(default=by_prompt) as server:
        models = tmp_path / "models.yaml"
        models.write_text(
            "default: scripted\nmodels:\n  scripted:\n    litellm_model: openai/scripted\n"
            f"    api_base: {server.base_url}\n"
            "    input_cost_per_token: 0.0\n    output_cost_per_token: 0.0\n"
        )
        settings = mrp_settings.model_copy(update={"models_config": models})
        job_id = "sentiment-llm-calls"
        yaml_text = job_yaml(
            job_id, reviews, map_op="sentiment-label@1.0.0", egress=["llm"], budget_usd="1"
        )
        async with build_worker(client, settings):
            first = await run_job(
                client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="ray")
            )
            assert first.status == "succeeded", first
            replay = await run_job(
                client, settings, job_id, MRPJobInput(replay_of=first.run_id, backend="threads")
            )
    assert replay.replay_matched is True
    sm = get_sessionmaker(settings.resolved_database_url)
    rows = list_llm_calls(sm, workflow_id=workflow_id_for(job_id, first.run_id))
    assert len(rows) == len(server.chat_requests) == 4
    assert {(r.model_name, r.litellm_model, r.status) for r in rows} == {
        ("scripted", "openai/scripted", "ok")
    }
    # by_prompt: 40 prompt tokens each; "loved" answers take 2 completion tokens, others 1.
    assert sorted((r.prompt_tokens, r.completion_tokens, r.total_tokens) for r in rows) == [
        (40, 1, 41),
        (40, 1, 41),
        (40, 2, 42),
        (40, 2, 42),
    ]
    assert len({r.call_key for r in rows}) == 4
    assert [r.cost_usd for r in rows] == [0.0] * 4  # priced by the config, not unknown
    assert list_llm_calls(sm, workflow_id=workflow_id_for(job_id, replay.run_id)) == []
    assert len(list_llm_calls(sm)) == 4


APPROVAL = """
approval:
  gate: publish
  approvers: [bob]
  expires_in_s: {expires}
"""


async def _gate_started(client: Client, gate_id: str) -> WorkflowHandle:
    handle = client.get_workflow_handle(gate_id)
    for _ in range(300):
        try:
            await handle.describe()
            return handle
        except RPCError:
            import asyncio

            await asyncio.sleep(0.1)
    raise AssertionError(f"gate {gate_id} never started")


async def test_rejected_gate_ends_the_job_without_writing_the_sink(
    client: Client, mrp_settings: Settings
) -> None:
    settings = mrp_settings
    job_id = "gated-reject"
    yaml_text = job_yaml(job_id, TEXTS[:4], extra=APPROVAL.format(expires=600))
    run_id = f"r-{uuid.uuid4().hex[:10]}"
    wid = workflow_id_for(job_id, run_id)
    async with build_worker(client, settings):
        handle = await client.start_workflow(
            MRPJob.run,
            MRPJobInput(job_yaml=yaml_text, backend="threads", run_id=run_id, requester="alice"),
            id=wid,
            task_queue=settings.task_queue,
        )
        gate = await _gate_started(client, gate_workflow_id(wid, "publish"))
        state = await gate.execute_update(
            "decide",
            GateDecision(decision="reject", actor="bob", comment="no"),
            result_type=GateState,
        )
        assert state.status == "rejected"
        result = await handle.result()
    assert result.status == "rejected" and "bob" in result.message
    assert result.reduce_digest is not None and result.produced == []
    assert not (settings.data_dir / "mrp" / "output" / job_id / run_id).exists()
    run = get_run(get_sessionmaker(settings.resolved_database_url), run_id)
    assert run is not None and run.status == "rejected"


async def test_expired_gate_ends_the_job_without_writing_the_sink(
    client: Client, mrp_settings: Settings
) -> None:
    settings = mrp_settings
    job_id = "gated-expire"
    yaml_text = job_yaml(job_id, TEXTS[:4], extra=APPROVAL.format(expires=1))
    async with build_worker(client, settings):
        result = await run_job(
            client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="threads")
        )
    assert result.status == "expired" and result.produced == []
    assert not (settings.data_dir / "mrp" / "output" / job_id / result.run_id).exists()


async def test_operator_code_that_no_longer_matches_its_pin_is_refused_at_compile(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    # A copy of the test operators where flaky's code changed after it was signed.
    ops = tmp_path / "ops"
    for name in ("flaky", "slow", "expensive"):
        shutil.copytree(
            TEST_OPERATORS / name, ops / name, ignore=shutil.ignore_patterns("__pycache__")
        )
    with open(ops / "flaky" / "agent.py", "a") as f:
        f.write("\n# edited after signing\n")
    config = TEST_CONFIG.read_text().replace("  - .\n", f"  - {ops}\n")
    (tmp_path / "mrp.yaml").write_text(
        config.replace("../../../operators", str(REPO / "operators"))
    )
    settings = mrp_settings.model_copy(update={"mrp_config": tmp_path / "mrp.yaml"})
    job_id = "pin-mismatch"
    yaml_text = job_yaml(
        job_id, ["a", "b"], map_op="flaky@1.0.0", map_params={"state_dir": str(tmp_path / "s")}
    )
    async with build_worker(client, settings):
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client, settings, job_id, MRPJobInput(job_yaml=yaml_text, backend="threads")
            )
        # A policy violation is refused the same way, naming its rule.
        too_wide = job_yaml("too-wide", ["a"], max_workers=999)
        with pytest.raises(WorkflowFailureError) as policy:
            await run_job(
                client, settings, "too-wide", MRPJobInput(job_yaml=too_wide, backend="threads")
            )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_COMPILE
    assert "flaky@1.0.0" in cause.message and "code_mismatch" in cause.message
    assert not (tmp_path / "s").exists()  # the operator never ran
    pcause = policy.value.cause
    assert isinstance(pcause, ApplicationError) and pcause.type == ERROR_COMPILE
    assert "max_workers" in pcause.message
    assert pcause.details and pcause.details[0]["kind"] == "policy"  # type: ignore[index]


async def test_file_inputs_evaluation_failure_and_a_replay_mismatch(
    client: Client, mrp_settings: Settings, tmp_path: Path
) -> None:
    """Files resolved under base_dir; an evaluator under min_score stops before produce; a
    replay against a run record whose shard digest differs names that shard."""
    settings = mrp_settings
    data = tmp_path / "in"
    (data / "docs").mkdir(parents=True)
    for i in range(3):
        (data / "docs" / f"f{i}.txt").write_text(f"file {i} has words " * (i + 1))
    (data / "docs" / "skip.md").write_text("not matched")
    job_id = "files-eval"
    yaml_text = f"""
dsl_version: "0.1"
job_id: {job_id}
inputs: {{files: ["docs/*.txt"], by: item}}
map: {{operator: word-count@1.0.0}}
reduce: {{operator: numeric-sum@1.0.0}}
evaluator:
  operator: rules-check@1.0.0
  params: {{rules: [{{path: totals.items, op: "==", value: 3}}, {{path: totals.words, op: ">", value: 1000}}]}}
  min_score: "1"
produce:
  operator: json-writer@1.0.0
  sink: {{kind: json, destination: out.json}}
policy: {{max_workers: 2, budget_units: "100"}}
"""
    async with build_worker(client, settings):
        result = await run_job(
            client,
            settings,
            job_id,
            MRPJobInput(job_yaml=yaml_text, base_dir=str(data), backend="threads"),
        )
        assert result.status == "evaluation_failed" and result.produced == []
        assert result.evaluation is not None and result.evaluation.score == Decimal("0.5")
        assert result.counters.run == 3
        sm = get_sessionmaker(settings.resolved_database_url)
        store = artifact_store_from_settings(settings)
        manifest = get_manifest(sm, store, result.run_id)
        assert manifest is not None
        assert sorted(manifest.input_file_digests) == ["docs/f0.txt", "docs/f1.txt", "docs/f2.txt"]
        blob = store.get_bytes(manifest.input_file_digests["docs/f1.txt"])
        assert blob == (data / "docs" / "f1.txt").read_bytes()
        # The history's compile result names the files' digests as one stored object, not
        # inline (100 bytes a file there, and again in finalise's input).
        history = await client.get_workflow_handle(
            workflow_id_for(job_id, result.run_id)
        ).fetch_history()
        compiled = [
            json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
            for e in history.events
            if e.HasField("activity_task_completed_event_attributes")
            and "input_files_digest"
            in e.activity_task_completed_event_attributes.result.payloads[0].data.decode()
        ]
        assert len(compiled) == 1 and compiled[0]["input_file_digests"] == {}
        assert store.get_json(compiled[0]["input_files_digest"]) == manifest.input_file_digests
        assert not (settings.data_dir / "mrp" / "output" / job_id / result.run_id).exists()

        # Make the stored record of shard 1 disagree with what recomputing it gives.
        shards = list(manifest.shards)
        shards[1] = shards[1].model_copy(update={"output_digest": store.put_json({"tampered": 1})})
        forged = manifest.model_copy(update={"shards": shards})
        finish_run(sm, forged, store.put_bytes(forged.to_json()))
        with pytest.raises(WorkflowFailureError) as info:
            await run_job(
                client, settings, job_id, MRPJobInput(replay_of=result.run_id, backend="threads")
            )
    cause = info.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ERROR_REPLAY_MISMATCH
    assert f"replay of run {result.run_id} differs at shard-000001" in cause.message
