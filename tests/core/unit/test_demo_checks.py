"""keel.demo_checks: what `keel demo` compares its results with, and how it says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from keel.demo_checks import (
    attempt_lines,
    compare_invoices,
    compare_wordcount,
    content_problems,
    keyword_problems,
    same_number,
    schema_problems,
    sentence_count,
    sentiment_tally,
    summary_problems,
    tally_validators,
)
from keel.rllm.run import RllmAttempt

EXPECTED = Path(__file__).resolve().parents[3] / "examples" / "mrp" / "expected"
TEXT = (
    "Temporal is a durable execution platform. A workflow keeps its state when a worker "
    "crashes, and it resumes on another worker from the last recorded step. Teams use it "
    "to run long business processes and AI pipelines reliably."
)


def wordcount_reduced(expected: dict[str, Any]) -> dict[str, Any]:
    """The word-count job's reduced value as numeric-sum writes it (decimal strings)."""
    totals = {f"counts.{w}": str(n) for w, n in expected["counts"].items()}
    totals |= {
        "items": str(expected["files"]),
        "words": str(expected["words"]),
        "chars": str(expected["chars"]),
    }
    return {
        "shards": expected["files"],
        "totals": dict(sorted(totals.items())),
        "means": {"words_per_file": expected["words_per_file"] + "0000"},
    }


def test_numbers_are_compared_as_exact_decimals():
    assert same_number("8.000000", 8) and same_number("33.750000", "33.75")
    assert same_number(0.3, "0.3")  # a float by its shortest text
    assert not same_number("0.30000000000000004", 0.3)
    assert not same_number(None, 0) and not same_number("x", "x") and not same_number(True, 1)


def test_wordcount_values_match_the_expected_file():
    expected = json.loads((EXPECTED / "wordcount.json").read_text())
    check = compare_wordcount(wordcount_reduced(expected), expected)
    n = len(expected["counts"])
    assert check.ok, check.differences
    assert check.line == (
        f"word counts: {n} distinct words, {n} match expected; 4 files, "
        f"{expected['words']} words, {expected['chars']} chars, "
        f"{expected['words_per_file']} words per file: match expected"
    )


def test_a_wordcount_difference_names_the_value_both_ways():
    expected = json.loads((EXPECTED / "wordcount.json").read_text())
    reduced = wordcount_reduced(expected)
    reduced["totals"]["counts.workflow"] = "9"
    reduced["totals"]["counts.request-digest"] = "1"  # a word the rule never makes
    del reduced["totals"]["counts.keel"]
    reduced["totals"]["words"] = "134"
    check = compare_wordcount(reduced, expected)
    n = len(expected["counts"])
    assert not check.ok
    assert f"{n} distinct words, {n - 2} match expected" in check.line
    assert check.line.endswith("1 DIFFER")
    assert check.differences == [
        "count of 'keel': produced nothing, expected 1",
        "count of 'request-digest': produced 1, expected none (not a word of the input)",
        f"count of 'workflow': produced 9, expected {expected['counts']['workflow']}",
        f"words: produced 134, expected {expected['words']}",
    ]


def test_invoice_rows_match_the_expected_file_and_differences_name_the_key():
    expected = json.loads((EXPECTED / "invoices.json").read_text())
    rows = [  # the Parquet writer's key/value rows: a string column, 6 places
        {"key": "means.mean_amount", "value": expected["mean_amount"]},
        {"key": "shards", "value": "3"},
        {"key": "totals.count", "value": "8.000000"},
        {"key": "totals.sum", "value": expected["sum"] + "00"},
    ]
    check = compare_invoices(rows, expected)
    assert check.ok, check.differences
    assert check.line.endswith("4 of 4 values match expected")
    rows[3] = {"key": "totals.sum", "value": "100000000000001240.16"}
    check = compare_invoices(rows[1:], expected)
    assert check.differences == [
        f"sum (totals.sum): produced 100000000000001240.16, expected {expected['sum']}",
        f"mean (means.mean_amount): produced nothing, expected {expected['mean_amount']}",
    ]
    assert check.line.endswith("2 of 4 values match expected")


def test_sentiment_tally_counts_labelled_and_unlabeled_replies():
    reduced = {
        "shards": 6,
        "totals": {
            "counts.negative": "1",
            "counts.neutral": "0",
            "counts.positive": "3",
            "counts.unlabeled": "2",
        },
    }
    check = sentiment_tally(reduced, 6)
    assert check.ok  # unlabeled replies are the model's skill, printed, not a failure
    assert check.line == (
        "4 of 6 replies had a label word (1 negative, 0 neutral, 3 positive); 2 unlabeled"
    )
    missing = sentiment_tally(reduced, 7)
    assert missing.differences == ["sentiment: 6 replies counted for 7 reviews"]


SUMMARY_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["summary", "sentences"],
    "properties": {
        "summary": {"type": "string", "minLength": 1},
        "sentences": {"type": "integer", "minimum": 1},
    },
}


def test_schema_problems_use_the_apps_output_schema():
    assert schema_problems({"summary": "x", "sentences": 1}, SUMMARY_SCHEMA) == []
    problems = schema_problems({"summary": "", "extra": 1}, SUMMARY_SCHEMA)
    assert any("sentences" in p for p in problems) and any("extra" in p for p in problems)


def test_the_keyword_that_passed_before_fails_now():
    """The demo once accepted "is a durable execution platform" as a keyword."""
    ok = ["Temporal", "durable execution", "workflow", "AI pipelines", "worker"]
    assert keyword_problems(ok, TEXT, 5) == []
    assert keyword_problems(["is a durable execution platform"], TEXT, 5) == [
        "keywords[0] 'is a durable execution platform': 5 words, a keyword has at most 4"
    ]
    assert keyword_problems(["Kubernetes", "durable queues", "is a"], TEXT, 5) == [
        "keywords[0] 'Kubernetes': 'kubernetes' not in the input",
        "keywords[1] 'durable queues': 'queues' not in the input",
        "keywords[2] 'is a': only function words, it names nothing",
    ]
    assert keyword_problems([*ok, "teams"], TEXT, 5) == [
        "keywords: 6 keywords, at most 5 asked for"
    ]
    assert keyword_problems(["", "!"], TEXT, 5) == [
        "keywords[0] '': not a word",
        "keywords[1] '!': not a word",
    ]
    assert keyword_problems([], TEXT, 5) == ["keywords: expected a non-empty list"]


def test_summary_checks():
    good = "Temporal keeps a workflow's state through crashes. Teams run AI pipelines on it."
    assert sentence_count(good) == 2 and sentence_count("One. Two! Three? four") == 4
    assert summary_problems(good, TEXT, 2) == []
    assert summary_problems("It is what it is.", TEXT, 2) == [
        "summary 'It is what it is.': names nothing from the input"
    ]
    assert summary_problems(TEXT, TEXT, 2) == [
        f"summary: {len(TEXT)} characters, not shorter than the input",
        "summary: 3 sentences, at most 2 asked for",
    ]
    assert summary_problems("", TEXT, 2) == ["summary: expected text"]


def test_content_problems_per_app():
    inputs = {"text": TEXT, "max_sentences": 2}
    summary = "Temporal keeps workflows running."
    assert content_problems("summary", {"summary": summary, "sentences": 1}, inputs) == []
    assert content_problems("summary", {"summary": summary, "sentences": 2}, inputs) == [
        "sentences: 2, but the summary has 1"
    ]
    assert content_problems("extract_keywords", {"keywords": ["Temporal"]}, {"text": TEXT}) == []
    composed = {"summary": summary, "keywords": ["is a durable execution platform"]}
    assert content_problems("compose_summary_keywords", composed, {"text": TEXT}) == [
        "keywords[0] 'is a durable execution platform': 5 words, a keyword has at most 4"
    ]
    assert content_problems("some_other_app", {"x": 1}, inputs) == []


def test_attempt_lines_tell_the_recovery_loop():
    attempts = [
        RllmAttempt(attempt=1, ok=False, errors=["$.sentences: required property is missing"]),
        RllmAttempt(attempt=2, ok=True),
    ]
    assert attempt_lines(attempts) == [
        "attempt 1 (prompt): rejected ($.sentences: required property is missing)",
        "attempt 2 (recovery prompt): valid",
    ]


@pytest.mark.parametrize(
    ("statuses", "line", "problems"),
    [
        ({"ruff": "passed", "mypy": "passed"}, "2 passed, 0 failed, 0 not run", []),
        (
            {"ruff": "passed", "hadolint": "not_run", "mypy": "failed"},
            "1 passed, 1 failed, 1 not run",
            [
                "validator hadolint did not run (required): hadolint is not installed",
                "validator mypy failed: 2 errors",
            ],
        ),
        ({"sbom": "not_run"}, "0 passed, 0 failed, 1 not run", [
            "validator sbom did not run (required): no reason recorded"
        ]),
        ({}, "0 passed, 0 failed, 0 not run", ["no validator ran"]),
    ],
)  # fmt: skip
def test_every_validator_is_required(
    statuses: dict[str, str], line: str, problems: list[str]
) -> None:
    reasons = {"hadolint": "hadolint is not installed", "mypy": "2 errors"}
    tally = tally_validators(statuses, reasons)
    assert tally.line == line
    assert sorted(tally.problems) == problems
