"""Run statistics: the aggregation maths (pure) and the store (SQLite, and PostgreSQL when
``KEEL_TEST_POSTGRES_URL`` is set, through test_store's ``db_url`` fixture)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.orm import Session, sessionmaker

from keel.llm import ModelsConfig, ModelSpec
from keel.rllm.stats import (
    STATS_SCHEMA_VERSION,
    PredictionPart,
    RllmRunRecord,
    aggregate,
    aggregate_one,
    combine_stats,
    predict,
    predict_part,
)
from store.db import get_engine, init_db
from store.files import load_rllm_app
from store.rllm_stats import get_stats, list_runs, predict_exectime, record_run, run_parts
from tests.support.store import run_together

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
MODELS = ModelsConfig(
    default="local",
    models={
        "local": ModelSpec(litellm_model="openai/smollm2", api_base="http://127.0.0.1:1/v1"),
        "big": ModelSpec(litellm_model="openai/gpt-4o-mini"),
    },
)


def rec(key: str, **kw: Any) -> RllmRunRecord:
    fields: dict[str, Any] = {
        "run_key": key,
        "workflow_id": f"rllm/summary/{key}",
        "app": "summary",
        "app_version": "0.1.0",
        "model": "local",
        "status": "ok",
        "input_valid": True,
        "output_valid": True,
        "attempts": 1,
        "retries": 0,
        "prompt_tokens": 100,
        "completion_tokens": 50,
        "total_tokens": 150,
        "max_completion_tokens": 50,
        "llm_latency_ms": 300.0,
        "total_latency_ms": 400.0,
        "own_latency_ms": 400.0,
        "created_at": T0,
    }
    fields.update(kw)
    return RllmRunRecord(**fields)


# -- maths -----------------------------------------------------------------------------------


def test_aggregate_one_counts_rates_and_averages() -> None:
    runs = [
        rec("a"),
        # recovered on retry: two calls, more tokens, slower
        rec(
            "b",
            attempts=2,
            retries=1,
            prompt_tokens=300,
            completion_tokens=90,
            total_tokens=390,
            max_completion_tokens=60,
            llm_latency_ms=900.0,
            total_latency_ms=1000.0,
            own_latency_ms=1000.0,
            created_at=T0 + timedelta(minutes=1),
        ),
        # retries exhausted: three calls, output never valid
        rec(
            "c",
            status="error",
            error_type="RetryExhaustedError",
            output_valid=False,
            attempts=3,
            retries=2,
            prompt_tokens=450,
            completion_tokens=150,
            total_tokens=600,
            max_completion_tokens=70,
            llm_latency_ms=1500.0,
            total_latency_ms=1600.0,
            own_latency_ms=1600.0,
            created_at=T0 + timedelta(minutes=2),
        ),
        # bad input: no call, the output never checked
        rec(
            "d",
            status="error",
            error_type="InputSchemaError",
            input_valid=False,
            output_valid=None,
            attempts=0,
            prompt_tokens=0,
            completion_tokens=0,
            total_tokens=0,
            max_completion_tokens=0,
            llm_latency_ms=0.0,
            total_latency_ms=20.0,
            own_latency_ms=20.0,
            created_at=T0 - timedelta(minutes=1),
        ),
    ]
    s = aggregate_one(runs)
    assert (s.runs, s.successes, s.failures) == (4, 2, 2)
    assert s.input_compliance_pct == 75.0  # 3 of 4 inputs valid
    assert s.output_compliance_pct == round(200 / 3, 2)  # 2 of the 3 checked outputs
    assert s.avg_latency_ms == (400 + 1000 + 1600 + 20) / 4
    assert s.avg_llm_latency_ms == (300 + 900 + 1500) / 4
    assert s.avg_prompt_tokens == (100 + 300 + 450) / 4
    assert s.avg_completion_tokens == (50 + 90 + 150) / 4
    assert s.max_completion_tokens == 70
    # model time per 1000 tokens, over runs that called the model
    assert s.ms_per_1k_tokens == round(1000 * (300 + 900 + 1500) / (150 + 390 + 600), 3)
    assert s.avg_retries == (0 + 1 + 2) / 4
    assert s.tokens_per_attempt == round((150 + 390 + 600) / 6, 3)
    assert (s.first_run_at, s.last_run_at) == (T0 - timedelta(minutes=1), T0 + timedelta(minutes=2))
    assert s.schema_version == STATS_SCHEMA_VERSION


def test_aggregate_groups_by_app_version_and_model() -> None:
    runs = [
        rec("1"),
        rec("2", model="big"),
        rec("3", app_version="0.2.0"),
        rec("4"),
        rec("5", app="extract_keywords"),
    ]
    got = [(s.app, s.app_version, s.model, s.runs) for s in aggregate(runs)]
    assert got == [
        ("extract_keywords", "0.1.0", "local", 1),
        ("summary", "0.1.0", "big", 1),
        ("summary", "0.1.0", "local", 2),
        ("summary", "0.2.0", "local", 1),
    ]
    assert aggregate([]) == []


def test_no_checks_and_no_calls_give_none_not_zero() -> None:
    s = aggregate_one([rec("x", input_valid=None, output_valid=None, attempts=0, total_tokens=0)])
    assert s.input_compliance_pct is None and s.output_compliance_pct is None
    assert s.ms_per_1k_tokens is None and s.tokens_per_attempt is None


def test_aggregate_one_refuses_mixed_or_empty_groups() -> None:
    with pytest.raises(ValueError, match="no runs"):
        aggregate_one([])
    with pytest.raises(ValueError, match="several"):
        aggregate_one([rec("1"), rec("2", model="big")])


def test_predict_part_by_latency_and_by_tokens() -> None:
    s = aggregate_one([rec("1"), rec("2", retries=1, attempts=2)])
    assert predict_part(None) is None
    assert predict_part(s) == 400.0  # the average own time
    # 300 ms per 150 tokens -> 2000 ms per 1k; 1000 prompt + 50 completion tokens,
    # 1.5 attempts on average, plus 100 ms outside the model.
    assert s.ms_per_1k_tokens == 2000.0
    assert predict_part(s, prompt_tokens=1000) == round(100 + 1050 * 2.0 * 1.5, 3)


def test_predict_sums_parts_and_refuses_partial_sums() -> None:
    s = aggregate_one([rec("1")])
    k = aggregate_one([rec("2", app="extract_keywords", own_latency_ms=250.0)])
    parts = [
        PredictionPart(key="root", app="c", app_version="1", model="local", stats=s),
        PredictionPart(key="root/a", app="summary", app_version="0.1.0", model="local", stats=s),
        PredictionPart(
            key="root/b", app="extract_keywords", app_version="0.1.0", model="local", stats=k
        ),
    ]
    p = predict("c", None, parts)
    assert p.predicted_ms == 400 + 400 + 250 and p.missing == []
    assert [x.basis for x in p.parts] == ["latency"] * 3
    p = predict("c", None, parts, prompt_tokens=100)
    assert p.parts[0].basis == "tokens" and p.parts[1].basis == "latency"
    parts[2] = parts[2].model_copy(update={"stats": None})
    p = predict("c", None, parts)
    assert p.predicted_ms is None and p.missing == ["root/b"]


def test_combine_stats_weights_by_runs() -> None:
    a = aggregate_one([rec("1", own_latency_ms=100.0, total_latency_ms=100.0)])
    b = aggregate_one(
        [
            rec(str(i), app_version="0.2.0", own_latency_ms=400.0, total_latency_ms=400.0)
            for i in range(3)
        ]
    )
    c = combine_stats([a, b])
    assert c is not None and c.runs == 4
    assert c.avg_own_latency_ms == (100 + 3 * 400) / 4
    assert combine_stats([]) is None and combine_stats([a]) is a


# -- store -----------------------------------------------------------------------------------


def test_table_and_migration(db_url: str) -> None:
    init_db(db_url)
    insp = inspect(get_engine(db_url))
    cols = {c["name"] for c in insp.get_columns("rllm_runs")}
    assert set(RllmRunRecord.model_fields) <= cols
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("rllm_runs")}
    assert ("run_key",) in uniques


def test_record_once_and_aggregate(sm: sessionmaker[Session]) -> None:
    assert record_run(sm, rec("k1"))
    assert not record_run(sm, rec("k1", status="error"))  # a retried activity: no-op
    record_run(sm, rec("k2", model="big", created_at=T0 + timedelta(seconds=1)))
    record_run(
        sm,
        rec("k3", status="error", output_valid=False, created_at=T0 + timedelta(seconds=2)),
    )
    runs = list_runs(sm, "summary")
    assert [r.run_key for r in runs] == ["k1", "k2", "k3"]
    assert runs[0] == rec("k1")  # round trip, timezone included
    stats = get_stats(sm, "summary")
    assert [(s.model, s.runs, s.failures) for s in stats] == [("big", 1, 0), ("local", 2, 1)]
    (local,) = get_stats(sm, "summary", "local")
    assert local.output_compliance_pct == 50.0
    assert get_stats(sm, "nothing") == []


def test_concurrent_duplicate_records_write_one_row(sm: sessionmaker[Session]) -> None:
    results = run_together(4, lambda: record_run(sm, rec("same")))
    assert sorted(results) == [False, False, False, True]
    assert len(list_runs(sm, "summary")) == 1


def test_predict_exectime_sums_over_uses(sm: sessionmaker[Session]) -> None:
    resolved = load_rllm_app(EXAMPLES / "compose_summary_keywords.rllm")
    assert [k for k, _, _ in run_parts(resolved, MODELS)] == [
        "compose_summary_keywords.rllm",
        "compose_summary_keywords.rllm/summarised",
        "compose_summary_keywords.rllm/keywords_of",
    ]
    empty = predict_exectime(sm, resolved, MODELS)
    assert empty.predicted_ms is None and len(empty.missing) == 3

    record_run(sm, rec("s", own_latency_ms=700.0))
    record_run(sm, rec("k", app="extract_keywords", own_latency_ms=900.0))
    record_run(
        sm,
        rec(
            "c",
            app="compose_summary_keywords",
            attempts=0,
            total_tokens=0,
            own_latency_ms=50.0,
            total_latency_ms=1650.0,
        ),
    )
    p = predict_exectime(sm, resolved, MODELS)
    assert p.predicted_ms == 50 + 700 + 900
    # Another model has no runs; an older version's runs stand in for a new version's.
    assert predict_exectime(sm, resolved, MODELS, model="big").predicted_ms is None
    record_run(sm, rec("old", app_version="0.0.9", model="big", own_latency_ms=10.0))
    p = predict_exectime(sm, resolved, MODELS, model="big")
    summary_part = next(x for x in p.parts if x.app == "summary")
    assert summary_part.app_version == "*" and summary_part.predicted_ms == 10.0
