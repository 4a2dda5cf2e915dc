"""Compiler: deterministic IR and manifest, serialisation, schema checks, file inputs."""

from __future__ import annotations

import json
import random

import pytest

from keel.digest import canonical_json, digest_bytes, digest_json
from keel.mrp import (
    CompileResult,
    DslError,
    FileRef,
    checkpoint_key,
    compile_job,
    ir_from_json,
    manifest_from_json,
    verify_manifest,
)
from keel.mrp.ir import shard_id
from keel.mrp.normalize import derive_job_seed, shard_seed
from tests.mrp.unit.mrp_jobs import job_text, load_caps, load_registry

REGISTRY = load_registry()
CAPS = load_caps()
WORDCOUNT = job_text("valid/wordcount.yaml")


def compile_text(text: str, **kwargs: object) -> CompileResult:
    return compile_job(text, REGISTRY, CAPS, **kwargs)  # type: ignore[arg-type]


def test_same_yaml_compiles_to_identical_bytes():
    a, b = compile_text(WORDCOUNT), compile_text(WORDCOUNT)
    assert a.ir_json() == b.ir_json()
    assert a.manifest_json() == b.manifest_json()
    assert a.policy_report_json() == b.policy_report_json()


def test_reordered_keys_comments_and_flow_style_do_not_change_digests():
    a = compile_text(WORDCOUNT)
    b = compile_text(job_text("valid/wordcount_reordered.yaml"))
    assert a.ir.digest() == b.ir.digest()
    assert a.manifest.digest() == b.manifest.digest()
    assert a.ir_json() == b.ir_json()


def test_ir_shape_for_wordcount():
    ir = compile_text(WORDCOUNT).ir
    assert [t.item_count for t in ir.map_tasks] == [2, 2, 1]
    assert [t.shard_id for t in ir.map_tasks] == ["shard-000000", "shard-000001", "shard-000002"]
    assert ir.reduce.shard_count == 3 and ir.reduce.input_order == "shard_index"
    assert ir.evaluate is None and ir.approval is None
    assert ir.produce.sink.destination == "out/wordcount.json"
    assert ir.limits.max_workers == 4 and ir.limits.egress == []
    assert ir.operators["map"].params == {"lowercase": True}
    # 3 shards x 0.5 + reduce 1 + produce 1 units; USD at 0.001 per unit.
    assert str(ir.budget.estimate.units) == "3.500000"
    assert str(ir.budget.estimate.usd) == "0.003500"
    assert str(ir.budget.limits.units) == "4.200000"  # 120% of the estimate, under budget
    for t in ir.map_tasks:
        assert t.seed == shard_seed(ir.job_seed, t.input_digest)
        assert t.checkpoint_key == checkpoint_key(t.operator_digest, t.input_digest, t.seed)
        assert t.operator_digest == ir.operators["map"].operator_digest


def test_job_seed_follows_its_definition():
    ir = compile_text(WORDCOUNT).ir
    assert ir.job_seed == derive_job_seed(
        "0.1",
        "wordcount-demo",
        ir.inputs_digest,
        {"map": "tokens-count@1.0.0", "produce": "json-writer@1.0.0", "reduce": "sum-counts@1.0.0"},
    )
    assert len({ir.reduce.seed, ir.produce.seed, ir.job_seed}) == 3


def test_shard_inputs_are_named_by_their_digests():
    result = compile_text(WORDCOUNT)
    assert set(result.shard_inputs) == {t.input_digest for t in result.ir.map_tasks}
    for digest, shard_input in result.shard_inputs.items():
        assert digest_json(shard_input.canonical()) == digest
        assert digest_bytes(canonical_json(shard_input.canonical())) == digest
    first = result.shard_inputs[result.ir.map_tasks[0].input_digest]
    assert first.items == [
        {"id": 1, "text": "The soup was cold"},
        {"id": 2, "text": "Great service and kind staff"},
    ]


def test_ir_and_manifest_round_trip_and_verify():
    result = compile_text(job_text("valid/sentiment.yaml"))
    ir = ir_from_json(result.ir_json())
    manifest = manifest_from_json(result.manifest_json())
    assert ir == result.ir and manifest == result.manifest
    assert ir.to_json() == result.ir_json()
    verify_manifest(ir, manifest)
    assert manifest.ir_digest == digest_bytes(result.ir_json())
    assert manifest.policy_report_digest == digest_bytes(result.policy_report_json())
    assert json.loads(result.manifest_json())["seeds"]["shards"] == [t.seed for t in ir.map_tasks]


def test_manifest_of_another_ir_is_refused():
    a = compile_text(WORDCOUNT)
    b = compile_text(WORDCOUNT.replace("lowercase: true", "lowercase: false"))
    with pytest.raises(ValueError, match="manifest names IR"):
        verify_manifest(a.ir, b.manifest)
    # Same IR digest but another input's seeds: a forged or mixed-up manifest.
    c = compile_text(WORDCOUNT.replace("Too loud", "Too quiet"))
    forged = a.manifest.model_copy(update={"seeds": c.manifest.seeds})
    with pytest.raises(ValueError, match=r"disagree on seeds\.job"):
        verify_manifest(a.ir, forged)


def test_manifest_records_operators_and_provenance():
    manifest = compile_text(job_text("valid/sentiment.yaml")).manifest
    assert [(o.role, o.ref) for o in manifest.operators] == [
        ("evaluate", "judge@1.0.0"),
        ("map", "llm-sentiment@2.1.0"),
        ("produce", "parquet-writer@1.0.0"),
        ("reduce", "mean-score@1.0.0"),
    ]
    spec = REGISTRY.get("judge@1.0.0")
    judge = manifest.operators[0]
    assert judge.code_digest == spec.code_digest and judge.spec_digest == spec.spec_digest()
    assert not judge.signed
    assert manifest.seeds.evaluate is not None
    assert manifest.dsl_version == "0.1" and manifest.ir_version == "mrp-ir/0.1"


def test_sentiment_ir_carries_evaluator_approval_and_egress():
    ir = compile_text(job_text("valid/sentiment.yaml")).ir
    assert ir.evaluate is not None and str(ir.evaluate.min_score) == "0.9"
    assert ir.approval is not None and ir.approval.approvers == ["alice", "bob"]
    assert ir.limits.egress == ["llm"]
    assert ir.operators["map"].egress == ["llm"]
    # 4 map shards x 2 + 3 other steps = 11 units; LLM: 2,000 map tokens at $0.002/1k
    # plus 6,000 judge tokens at $0.01/1k = $0.064; units at $0.001 add $0.011.
    assert str(ir.budget.estimate.usd) == "0.075000"
    assert str(ir.budget.limits.usd) == "0.090000"


def test_changing_params_changes_operator_digest_and_checkpoint_keys_only():
    a = compile_text(WORDCOUNT).ir
    b = compile_text(WORDCOUNT.replace("lowercase: true", "lowercase: false")).ir
    assert a.operators["map"].operator_digest != b.operators["map"].operator_digest
    assert [t.seed for t in a.map_tasks] == [t.seed for t in b.map_tasks]
    assert [t.input_digest for t in a.map_tasks] == [t.input_digest for t in b.map_tasks]
    assert not {t.checkpoint_key for t in a.map_tasks} & {t.checkpoint_key for t in b.map_tasks}


def test_changing_an_input_item_changes_every_seed():
    # Seeds derive from the inputs digest, as the plan fixes; so does every checkpoint key.
    a = compile_text(WORDCOUNT).ir
    b = compile_text(WORDCOUNT.replace("Too loud", "Too quiet")).ir
    assert a.inputs_digest != b.inputs_digest
    assert a.map_tasks[0].input_digest == b.map_tasks[0].input_digest
    assert a.map_tasks[0].seed != b.map_tasks[0].seed


def test_identical_shards_share_seed_and_checkpoint():
    text = WORDCOUNT.replace('{id: 3, text: "Too loud"}', '{id: 1, text: "The soup was cold"}')
    text = text.replace("shard_size: 2", "by: item")
    result = compile_text(text)
    t0, t2 = result.ir.map_tasks[0], result.ir.map_tasks[2]
    assert t0.checkpoint_key == t2.checkpoint_key
    assert len(result.shard_inputs) == 4  # five tasks, one payload shared


def test_items_are_checked_against_the_map_input_schema():
    text = WORDCOUNT.replace('{id: 4, text: "Would come back"}', '{id: "4", words: "x"}')
    with pytest.raises(DslError) as info:
        compile_text(text, source="wc.yaml")
    got = {(i.path, i.line, i.message) for i in info.value.issues}
    prefix = "does not match the tokens-count@1.0.0 input schema: "
    assert got == {
        ("inputs.items[3]", 10, prefix + "'text' is a required property"),
        ("inputs.items[3].id", 10, prefix + "'4' is not of type 'integer'"),
    }


def test_params_are_checked_against_the_params_schema():
    text = job_text("valid/sentiment.yaml").replace(
        'params: {rubric: "Labels match the text"}', "params: {rubric: 3}"
    )
    with pytest.raises(DslError) as info:
        compile_text(text)
    [issue] = info.value.issues
    assert (issue.path, issue.line) == ("evaluator.params.rubric", 18)
    assert issue.message == "3 is not of type 'string'"


FILES = [
    FileRef(path="data/reviews/b.jsonl", digest=digest_bytes(b"b"), size_bytes=1),
    FileRef(path="data/extra.jsonl", digest=digest_bytes(b"extra"), size_bytes=5),
    FileRef(path="data/reviews/a.jsonl", digest=digest_bytes(b"a"), size_bytes=1),
]


def test_file_inputs_compile_in_path_order_whatever_the_listing_order():
    text = job_text("valid/files.yaml")
    results = []
    for seed in range(3):
        listing = FILES + FILES[:1]  # a file matched by two globs is listed twice
        random.Random(seed).shuffle(listing)
        results.append(compile_text(text, resolved_files=listing))
    assert len({r.ir.digest() for r in results}) == 1
    ir = results[0].ir
    assert [results[0].shard_inputs[t.input_digest].files[0].path for t in ir.map_tasks] == [  # type: ignore[index]
        "data/extra.jsonl",
        "data/reviews/a.jsonl",
        "data/reviews/b.jsonl",
    ]


def test_file_inputs_need_a_listing():
    with pytest.raises(DslError) as info:
        compile_text(job_text("valid/files.yaml"))
    [issue] = info.value.issues
    assert (issue.path, issue.line) == ("inputs.files", 5)
    assert "must be resolved" in issue.message


def test_file_listing_is_checked_against_the_patterns():
    stray = FileRef(path="secrets/key.pem", digest=digest_bytes(b"k"), size_bytes=1)
    only_reviews = [f for f in FILES if f.path != "data/extra.jsonl"]
    with pytest.raises(DslError) as info:
        compile_text(job_text("valid/files.yaml"), resolved_files=[*only_reviews, stray])
    got = {(i.path, i.line, i.message) for i in info.value.issues}
    assert got == {
        ("inputs.files", 5, "resolved file 'secrets/key.pem' matches no pattern"),
        ("inputs.files[1]", 7, "pattern 'data/extra.jsonl' matched no files"),
    }


def test_file_listed_twice_with_different_content_is_refused():
    changed = FILES[0].model_copy(update={"digest": digest_bytes(b"changed")})
    with pytest.raises(DslError, match="resolved twice with different content"):
        compile_text(job_text("valid/files.yaml"), resolved_files=[*FILES, changed])


def test_shard_ids_sort_like_their_indexes():
    ids = [shard_id(i) for i in (0, 9, 10, 999_999)]
    assert ids == sorted(ids)
