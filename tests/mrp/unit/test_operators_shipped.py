"""The shipped operators, run through the SDK's invoke_* (schema checks, egress guard)."""

from __future__ import annotations

import json
import random
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from activities.mrp.operators import (
    MrpConfig,
    invoke_evaluate,
    invoke_map,
    invoke_produce,
    invoke_reduce,
    load_mrp_config,
)
from keel.digest import digest_bytes
from keel.mrp.dsl import SinkKind, SinkSpec
from keel.mrp.normalize import FileRef
from keel.mrp.sdk import (
    Evaluation,
    LLMResult,
    OperatorContext,
    OperatorError,
    SchemaViolation,
)
from keel.settings import Settings


@pytest.fixture(scope="module")
def cfg() -> MrpConfig:
    return load_mrp_config(Settings(env="test"))


def run_map(cfg: MrpConfig, ref: str, items: list, **ctx_kw: object) -> object:
    spec = cfg.registry.get(ref)
    return invoke_map(spec, cfg.load(ref), items, OperatorContext(operator=ref, **ctx_kw))  # type: ignore[arg-type]


def test_word_count_counts_items_words_and_chars(cfg: MrpConfig):
    out = run_map(
        cfg,
        "word-count@1.0.0",
        ["The cat", {"text": "the CAT's hat"}],
        params={"by_word": True},
    )
    assert out == {
        "items": 2,
        "words": 5,
        "chars": 20,
        "counts": {"cat": 1, "cat's": 1, "hat": 1, "the": 2},
    }


def test_word_count_reads_file_items_through_the_context(cfg: MrpConfig):
    data = b"one two three"
    ref = FileRef(path="a.txt", digest=digest_bytes(data), size_bytes=len(data))
    seen: list[str] = []

    def reader(f: FileRef) -> bytes:
        seen.append(f.path)
        return data

    out = run_map(cfg, "word-count@1.0.0", [ref.model_dump()], file_reader=reader)
    assert out == {"items": 1, "words": 3, "chars": 13}
    assert seen == ["a.txt"]


def test_inputs_and_params_are_checked_against_the_schemas(cfg: MrpConfig):
    with pytest.raises(SchemaViolation) as info:
        run_map(cfg, "word-count@1.0.0", [{"txt": "no text field"}])
    assert info.value.which == "input"
    assert not info.value.retryable
    assert "item 0" in str(info.value)
    with pytest.raises(SchemaViolation) as info:
        run_map(cfg, "word-count@1.0.0", ["ok"], params={"colour": "red"})
    assert info.value.which == "params"


def test_an_operator_exception_is_a_retryable_operator_error(cfg: MrpConfig):
    with pytest.raises(OperatorError) as info:
        run_map(cfg, "amount-stats@1.0.0", [{"amount": "12,5"}])
    assert info.value.retryable
    assert info.value.operator == "amount-stats@1.0.0"


class Replies:
    """An LLM client that answers each prompt with the reply for the first key it holds."""

    def __init__(self, replies: dict[str, str]) -> None:
        self.replies = replies
        self.prompts: list[str] = []

    def complete(self, messages: Any, **params: Any) -> LLMResult:
        prompt = str(messages[-1]["content"])
        self.prompts.append(prompt)
        text = prompt.split("Text:", 1)[1]
        return LLMResult(content=next(r for k, r in self.replies.items() if k in text))


SENTIMENT = "sentiment-label@1.0.0"
REPLIES = {
    "great": " Positive!",
    "broke": "NEGATIVE",
    "phone": "%%%)( 42",  # garbage: no label word at all
    "calls": "The sentiment is unclear.",  # words, but none of them a label
}


def test_sentiment_label_records_a_reply_without_a_label_word_as_unlabeled(cfg: MrpConfig):
    items = ["A great camera", "It broke", {"id": 7, "text": "It is a phone"}, "It makes calls"]
    out = run_map(cfg, SENTIMENT, items, llm=Replies(REPLIES))
    assert out == {
        "labels": [
            {"index": 0, "label": "positive"},
            {"index": 1, "label": "negative"},
            {"index": 2, "label": "unlabeled", "id": 7},
            {"index": 3, "label": "unlabeled"},
        ],
        "counts": {"negative": 1, "neutral": 0, "positive": 1, "unlabeled": 2},
    }


def test_sentiment_label_fallback_files_unlabeled_replies_under_a_label_on_purpose(
    cfg: MrpConfig,
):
    llm = Replies(REPLIES)
    out = run_map(
        cfg, SENTIMENT, ["It is a phone", "great"], llm=llm, params={"fallback": "neutral"}
    )
    assert out == {
        "labels": [{"index": 0, "label": "neutral"}, {"index": 1, "label": "positive"}],
        "counts": {"negative": 0, "neutral": 1, "positive": 1},
    }
    assert "negative, neutral, positive" in llm.prompts[0]  # the fallback is not offered


def test_sentiment_label_refuses_unlabeled_as_a_label_without_another_fallback(cfg: MrpConfig):
    with pytest.raises(OperatorError, match="'unlabeled' cannot be a label"):
        run_map(
            cfg,
            SENTIMENT,
            ["great"],
            llm=Replies(REPLIES),
            params={"labels": ["good", "unlabeled"]},
        )
    out = run_map(
        cfg,
        SENTIMENT,
        ["It is a phone"],
        llm=Replies(REPLIES),
        params={"labels": ["good", "unlabeled"], "fallback": "unknown"},
    )
    assert out == {
        "labels": [{"index": 0, "label": "unknown"}],
        "counts": {"good": 0, "unknown": 1, "unlabeled": 0},
    }


def test_read_label_takes_the_first_label_word_else_unlabeled():
    from operators.sentiment_label.agent import read_label

    labels = ["negative", "neutral", "positive"]
    assert read_label("Neutral, maybe positive", labels) == "neutral"
    assert read_label("positively", labels) == "unlabeled"  # a whole word, not a prefix
    assert read_label("", labels) == "unlabeled"
    assert read_label("?!", labels, fallback="neutral") == "neutral"


def test_amount_stats_are_exact_decimals(cfg: MrpConfig):
    out = run_map(cfg, "amount-stats@1.0.0", [{"amount": "0.10"}, {"amount": 0.2}, {"amount": 1}])
    assert out == {"count": 3, "sum": "1.30", "min": "0.10", "max": "1"}


def test_numeric_sum_is_exact_and_order_free(cfg: MrpConfig):
    ref = "numeric-sum@1.0.0"
    spec, reducer = cfg.registry.get(ref), cfg.load(ref)
    outputs: list[Any] = [
        {"count": 1, "sum": "0.1", "nested": {"x": 0.1}},
        {"count": 2, "sum": "0.2", "nested": {"x": 0.2}},
    ]
    outputs += [{"count": 1, "sum": "0.3", "nested": {"x": 0.3}, "label": "ignored"}]
    params: dict[str, Any] = {"means": {"mean": {"sum": "sum", "count": "count"}}}
    reduced = invoke_reduce(spec, reducer, outputs, OperatorContext(params=params))
    assert reduced == {
        "shards": 3,
        "totals": {"count": "4", "nested.x": "0.6", "sum": "0.6"},
        "means": {"mean": "0.15"},
    }
    # Floats summed in order would give 0.6000000000000001; shuffled shards give the same.
    assert 0.1 + 0.2 + 0.3 != 0.6
    rng = random.Random(7)
    for _ in range(5):
        shuffled = outputs[:]
        rng.shuffle(shuffled)
        assert invoke_reduce(spec, reducer, shuffled, OperatorContext(params=params)) == reduced


def test_numeric_sum_places_and_field_selection(cfg: MrpConfig):
    ref = "numeric-sum@1.0.0"
    spec, reducer = cfg.registry.get(ref), cfg.load(ref)
    params: dict[str, Any] = {
        "fields": ["sum", "count"],
        "places": 2,
        "means": {"m": {"sum": "sum", "count": "count"}},
    }
    out = invoke_reduce(
        spec, reducer, [{"sum": "1", "count": 3, "other": 5}], OperatorContext(params=params)
    )
    assert out == {"shards": 1, "totals": {"count": "3.00", "sum": "1.00"}, "means": {"m": "0.33"}}


def test_rules_evaluator_scores_the_fraction_of_rules_that_hold(cfg: MrpConfig):
    ref = "rules-check@1.0.0"
    spec, evaluator = cfg.registry.get(ref), cfg.load(ref)
    reduced: Any = {"totals": {"words": "12", "items": "5"}, "means": {"m": None}, "tags": ["a"]}
    rules: list[Any] = [
        {"path": "totals.words", "op": ">=", "value": 10},
        {"path": "totals.items", "op": "==", "value": "5.0"},
        {"path": "tags", "op": "nonempty"},
        {"name": "needs-x", "path": "totals.x", "op": "exists"},
    ]
    ev = invoke_evaluate(spec, evaluator, reduced, OperatorContext(params={"rules": rules}))
    assert isinstance(ev, Evaluation)
    assert ev.score == Decimal("0.75")
    assert ev.reasons == ["needs-x: totals.x exists failed (got missing)"]
    with pytest.raises(SchemaViolation):
        invoke_evaluate(spec, evaluator, reduced, OperatorContext(params={"rules": [{"op": "??"}]}))


def produce(
    cfg: MrpConfig,
    ref: str,
    reduced: object,
    kind: SinkKind,
    dest: str,
    out: Path,
    **params: object,
):
    spec = cfg.registry.get(ref)
    sink = SinkSpec(kind=kind, destination=dest)
    ctx = OperatorContext(params=dict(params), seed=42, operator=ref)  # type: ignore[arg-type]
    return invoke_produce(spec, cfg.load(ref), reduced, sink, out, ctx)  # type: ignore[arg-type]


def test_json_writer_writes_canonical_json_and_an_audit_log(cfg: MrpConfig, tmp_path: Path):
    reduced = {"totals": {"b": "2", "a": "1"}}
    result = produce(
        cfg, "json-writer@1.0.0", reduced, SinkKind.JSON, "out/result.json", tmp_path / "a"
    )
    assert [f.path for f in result.files] == ["out/result.json", "out/result.json.audit.jsonl"]
    data = (tmp_path / "a" / "out" / "result.json").read_bytes()
    assert data == b'{"data":{"totals":{"a":"1","b":"2"}}}\n'
    audit = [
        json.loads(line)
        for line in (tmp_path / "a" / "out" / "result.json.audit.jsonl").read_text().splitlines()
    ]
    assert audit == result.audit
    assert audit[0]["digest"] == digest_bytes(data) == result.files[0].digest
    assert audit[0]["operator"] == "json-writer@1.0.0"
    again = produce(
        cfg, "json-writer@1.0.0", reduced, SinkKind.JSON, "out/result.json", tmp_path / "b"
    )
    assert again.files == result.files


def test_parquet_writer_is_byte_identical_across_writes(cfg: MrpConfig, tmp_path: Path):
    reduced = {
        "labels": [
            {"index": 0, "label": "positive", "id": 1},
            {"index": 1, "label": "negative"},
            {"index": 2, "label": "neutral", "id": "x"},
        ],
        "counts": {"negative": 1, "neutral": 1, "positive": 1},
    }
    first = produce(
        cfg,
        "parquet-writer@1.0.0",
        reduced,
        SinkKind.PARQUET,
        "labels.parquet",
        tmp_path / "1",
        rows="labels",
    )
    second = produce(
        cfg,
        "parquet-writer@1.0.0",
        reduced,
        SinkKind.PARQUET,
        "labels.parquet",
        tmp_path / "2",
        rows="labels",
    )
    b1 = (tmp_path / "1" / "labels.parquet").read_bytes()
    b2 = (tmp_path / "2" / "labels.parquet").read_bytes()
    assert b1 == b2
    assert first.files == second.files
    assert first.rows == 3
    table = pq.read_table(tmp_path / "1" / "labels.parquet")
    assert table.column_names == ["id", "index", "label"]
    assert table.to_pylist() == [
        {"id": "1", "index": 0, "label": "positive"},
        {"id": None, "index": 1, "label": "negative"},
        {"id": "x", "index": 2, "label": "neutral"},
    ]
    meta = pq.read_metadata(tmp_path / "1" / "labels.parquet")
    assert meta.metadata is None  # no pandas/arrow key-value metadata, no timestamps
    assert meta.num_row_groups == 1
    assert (tmp_path / "1" / "labels.parquet.audit.jsonl").is_file()


def test_parquet_writer_flattens_a_mapping_into_key_value_rows(cfg: MrpConfig, tmp_path: Path):
    reduced = {"shards": 2, "totals": {"sum": "0.30", "count": "3"}, "means": {}}
    result = produce(
        cfg,
        "parquet-writer@1.0.0",
        reduced,
        SinkKind.PARQUET,
        "s3://bucket/x/totals.parquet",
        tmp_path,
    )
    assert result.files[0].path == "totals.parquet"
    rows = pq.read_table(tmp_path / "totals.parquet").to_pylist()
    assert rows == [
        {"key": "shards", "value": "2"},
        {"key": "totals.count", "value": "3"},
        {"key": "totals.sum", "value": "0.30"},
    ]


def test_producer_refuses_a_sink_kind_it_does_not_write(cfg: MrpConfig, tmp_path: Path):
    with pytest.raises(OperatorError, match="does not write json"):
        produce(cfg, "parquet-writer@1.0.0", {}, SinkKind.JSON, "x.json", tmp_path)


def test_wrong_kind_is_refused(cfg: MrpConfig):
    spec = cfg.registry.get("numeric-sum@1.0.0")
    with pytest.raises(OperatorError, match="not map"):
        invoke_map(spec, cfg.load("numeric-sum@1.0.0"), [], OperatorContext())


def test_context_seeds_its_rng_and_keeps_logs():
    a, b = OperatorContext(seed=5), OperatorContext(seed=5)
    assert [a.rng.random() for _ in range(3)] == [b.rng.random() for _ in range(3)]
    # Made on first use, and it is random.Random(seed): the same draws as before.
    expected = random.Random(2**70 + 3)
    c = OperatorContext(seed=2**70 + 3)
    assert [c.rng.random() for _ in range(3)] == [expected.random() for _ in range(3)]
    assert c.rng is c.rng
    c.rng = random.Random(1)
    assert c.rng.random() == random.Random(1).random()
    a.log("hello")
    a.charge("2.5", "tool")
    assert a.charged_units == Decimal("2.5")
    assert a.logs == ["hello", "charged 2.5 units: tool"]
    with pytest.raises(ValueError):
        a.charge(-1)
