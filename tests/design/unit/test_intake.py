"""Reading the intake model's reply (keel/design/intake.py) and what coverage makes of the
fields that did not fit: kept field by field, asked once, cleared by any answers."""

from __future__ import annotations

import json

from keel.design.constraints import FIELD_NAMES
from keel.design.coverage import (
    IntakeSnapshot,
    adaptive_questions,
    apply_answers,
    coverage_check,
)
from keel.design.intake import (
    MAX_PROBLEMS,
    intake_schema,
    merge_readings,
    read_reply,
    recovery_prompt,
)

#: What SmolLM2-135M answered for the issue's paragraph (grammar-constrained by the schema,
#: which cannot bound a float): every field valid but availability 9.5.
SMOL_REPLY = (
    '{ "constraints": { "budget_band" : "low", "data_classification" : "public", '
    '"sla_latency_ms" : 10, "availability_target" : 9.5 }}'
)


def test_a_reply_that_fits_is_taken_whole() -> None:
    reply = {"constraints": {"cloud": "aws", "regions": ["eu-west-1"]}, "ambiguous": {}}
    reading = read_reply(json.dumps(reply))
    assert reading.fits and reading.problems == []
    assert reading.snapshot.constraints.regions == ["eu-west-1"]
    assert reading.snapshot.unfit == {}


def test_out_of_range_value_is_dropped_and_named_the_rest_kept() -> None:
    reading = read_reply(SMOL_REPLY)
    assert not reading.fits
    c = reading.snapshot.constraints
    assert (c.budget_band, c.data_classification, c.sla_latency_ms) == ("low", "public", 10)
    assert c.availability_target is None
    why = reading.snapshot.unfit["availability_target"]
    assert "9.5" in why and "greater than or equal to 90" in why
    assert reading.problems == [
        "constraints.availability_target: Input should be greater than or equal to 90 (got 9.5)"
    ]


def test_garbage_keeps_nothing_and_says_it_is_not_json() -> None:
    reading = read_reply("Sure! Here are the constraints you asked for.")
    assert not reading.fits
    assert reading.snapshot == IntakeSnapshot()
    assert reading.problems[0].startswith("the reply is not JSON")


def test_small_model_forms_are_read_and_wrong_items_dropped() -> None:
    # Capitals, a bare string for a list, one unknown item, a negative rate, fields at the
    # top level without the wrapper, prose around it and a cut-off end.
    reply = (
        'Here you go: {"cloud": "AWS", "regions": "eu-west-1", "compliance": ["GDPR", "ccpa"],'
        ' "throughput": {"data_gb_per_day": 200, "events_per_s": -1}, "notes": "x",'
        ' "workload_types": ["batch", "online"], "sla_latency_ms": 100, "budget_band": "lo'
    )
    reading = read_reply(reply)
    c = reading.snapshot.constraints
    assert c.cloud == "aws" and c.regions == ["eu-west-1"] and c.compliance == ["gdpr"]
    assert c.throughput is not None and c.throughput.data_gb_per_day == 200
    assert c.throughput.events_per_s is None
    assert c.workload_types == ["batch", "online"] and c.sla_latency_ms == 100
    assert c.budget_band is None  # cut off mid-value: not stated, not guessed
    assert set(reading.snapshot.unfit) == {"compliance", "throughput"}
    assert '"ccpa"' in reading.snapshot.unfit["compliance"]


def test_the_reask_wins_where_it_fits_and_keeps_the_first_replys_valid_fields() -> None:
    first = read_reply(json.dumps({"constraints": {"cloud": "aws", "availability_target": 9.5}}))
    second = read_reply(
        json.dumps({"constraints": {"regions": ["eu-west-1"], "sla_latency_ms": -3}})
    )
    merged = merge_readings(first, second)
    assert merged.constraints.cloud == "aws" and merged.constraints.regions == ["eu-west-1"]
    assert set(merged.unfit) == {"availability_target", "sla_latency_ms"}
    fixed = read_reply(json.dumps({"constraints": {"availability_target": 99.5, "bad": 1}}))
    assert merge_readings(first, fixed).unfit == {}
    assert merge_readings(first, fixed).constraints.availability_target == 99.5


def test_recovery_prompt_quotes_the_problems_and_is_bounded() -> None:
    problems = read_reply(SMOL_REPLY).problems
    text = recovery_prompt(problems)
    assert problems[0] in text and "only one JSON object" in text
    many = recovery_prompt([f"p{i}" for i in range(100)])
    assert "p0" in many and f"p{MAX_PROBLEMS}" not in many


def test_schema_sent_is_the_reply_without_unfit() -> None:
    schema = intake_schema()
    assert set(schema["properties"]) == {"constraints", "ambiguous"}


def test_unfit_fields_are_asked_once_even_when_not_required() -> None:
    full = {
        "cloud": "aws",
        "regions": ["eu-west-1"],
        "budget_band": "low",
        "workload_types": ["batch"],
        "data_classification": "internal",
    }
    reading = read_reply(json.dumps({"constraints": {**full, "availability_target": 9.5}}))
    cov = coverage_check(reading.snapshot)
    # Every required field is stated, yet the run is not covered: the 9.5 is asked about.
    assert cov.score == 1.0 and not cov.covered
    assert list(cov.unfit) == ["availability_target"]
    questions = adaptive_questions(cov)
    assert [q.field for q in questions] == ["availability_target"]
    assert questions[0].reason.startswith("unclear in the text: the model read 9.5")
    # Any answers clear it: answered here, or left blank while another field is answered.
    answered = apply_answers(reading.snapshot, {"availability_target": 99.9})
    assert coverage_check(answered).covered
    skipped = apply_answers(reading.snapshot, {"cloud": "aws"})
    assert skipped.unfit == {} and coverage_check(skipped).covered
    assert skipped.constraints.availability_target is None


def test_unknown_fields_never_reach_unfit_or_questions() -> None:
    snapshot = IntakeSnapshot(unfit={"nonsense": "x", "cloud": "read as 'mars'"})
    cov = coverage_check(snapshot)
    assert list(cov.unfit) == ["cloud"]
    assert {q.field for q in adaptive_questions(cov)} <= set(FIELD_NAMES)
