"""The intake's rules reader (issue 38 §6): what a paragraph states, read without a model,
and the merge in which the rules check the model's reading."""

from __future__ import annotations

from typing import Any

import pytest

from keel.design.constraints import Constraints
from keel.design.coverage import IntakeSnapshot, coverage_check
from keel.design.intake_rules import merge_with_rules, read_rules

PARAGRAPH = (
    "Nightly retraining of a churn model on 200 GB/day of event data in eu-west-1, GDPR, "
    "batch scoring plus a low-latency API under 100 ms, budget under $2k/month"
)


def stated(text: str) -> dict[str, Any]:
    return read_rules(text).constraints.model_dump(mode="json", exclude_defaults=True)


def test_the_issue_paragraph() -> None:
    assert stated(PARAGRAPH) == {
        "cloud": "aws",
        "regions": ["eu-west-1"],
        "budget_band": "medium",
        "sla_latency_ms": 100,
        "throughput": {"data_gb_per_day": 200.0},
        "workload_types": ["batch", "online"],
        "compliance": ["gdpr"],
        "training_runs_per_month": 30.0,
    }
    # Only the data classification is left for a question, and the rest clears 0.8.
    cov = coverage_check(IntakeSnapshot(constraints=read_rules(PARAGRAPH).constraints))
    assert cov.missing == ["data_classification"] and cov.covered


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Commas in numbers, a yearly budget, "no more than", hourly retraining.
        (
            "Ingest 1,500 GB per day into us-east-1; p99 no more than 250 ms; "
            "$120,000 per year; retrain hourly.",
            {
                "cloud": "aws",
                "regions": ["us-east-1"],
                "throughput": {"data_gb_per_day": 1500.0},
                "sla_latency_ms": 250,
                "budget_band": "high",
                "training_runs_per_month": 720.0,
                "workload_types": ["batch"],
            },
        ),
        # Units in words, a monthly volume, GCP regions (two of them).
        (
            "Two terabytes a month of clickstream, streamed through Pub/Sub, served from "
            "europe-west4 and us-central1 with a p95 latency of 0.5 seconds.",
            {
                "cloud": "gcp",
                "regions": ["europe-west4", "us-central1"],
                "throughput": {"data_gb_per_day": 66.666667},
                "sla_latency_ms": 500,
                "workload_types": ["streaming"],
            },
        ),
        # Two AWS regions, an availability zone, rates, HIPAA and SOC 2, PHI.
        (
            "Primary in us-west-2a with failover to us-east-2. 5k events/s from devices, "
            "1,200 requests per second at peak, 99.95% availability. HIPAA and SOC 2; PHI.",
            {
                "cloud": "aws",
                "regions": ["us-east-2", "us-west-2"],
                "throughput": {"events_per_s": 5000.0, "requests_per_s": 1200.0},
                "availability_target": 99.95,
                "compliance": ["hipaa", "soc2"],
                "data_classification": "restricted",
            },
        ),
        # Region-like words that are not regions; a cloud named outright.
        (
            "Our team in the us-west office runs covid-19 dashboards on Azure; "
            "the model id is eu-west-100x.",
            {"cloud": "azure"},
        ),
        # An Azure region name implies the cloud (the schema's regions are dash-separated).
        (
            "Serve in westeurope behind a REST API, 3 nines.",
            {
                "cloud": "azure",
                "workload_types": ["online"],
                "availability_target": 99.9,
            },
        ),
        # Negations: the kinds the text rules out are not read.
        (
            "Batch only, no streaming and no online serving. PCI-DSS applies, GDPR does not "
            "apply. Keep data for 2 years. Budget of $800 monthly.",
            {
                "workload_types": ["batch"],
                "compliance": ["pci_dss"],
                "retention_days": 730,
                "budget_band": "low",
            },
        ),
        # A price per request is no budget; seconds without a latency word are no SLO.
        (
            "Each call costs $0.002 per request and the job takes 40 seconds.",
            {},
        ),
        # Enterprise budget, weekly cadence, serverless, confidential data.
        (
            "Monthly budget around $150k. Weekly model training on confidential data, "
            "deployed serverless, a real-time inference API with 30ms p99.",
            {
                "budget_band": "enterprise",
                "training_runs_per_month": 4.0,
                "deployment_pref": "serverless",
                "data_classification": "confidential",
                "workload_types": ["batch", "online"],
                "sla_latency_ms": 30,
            },
        ),
        # Two clouds: neither is the cloud; both regions are kept.
        (
            "Move from us-central1 (GCP) to AWS eu-central-1.",
            {"regions": ["eu-central-1", "us-central1"]},
        ),
        # Nothing stated, and the empty string.
        ("We want a good, fast, cheap ML platform that our team will love.", {}),
        ("", {}),
        # RAG is an online workload; a kubernetes preference means containers.
        (
            "A RAG chatbot over our docs on Kubernetes, 2.5 TB/month of documents.",
            {
                "workload_types": ["online"],
                "deployment_pref": "containers",
                "throughput": {"data_gb_per_day": 83.333333},
            },
        ),
    ],
)
def test_paragraphs(text: str, expected: dict[str, Any]) -> None:
    assert stated(text) == expected


def test_the_rules_fill_what_the_model_left_and_correct_what_the_text_contradicts() -> None:
    model = IntakeSnapshot(
        constraints=Constraints(
            cloud="gcp", regions=["us-east-1"], budget_band="enterprise",
            workload_types=["streaming"], data_classification="internal",
        ),
        ambiguous={"sla_latency_ms": "'low latency' without a number", "availability_target": "?"},
        unfit={"throughput": "the model read 200, which does not fit"},
    )  # fmt: skip
    merged, source = merge_with_rules(model, read_rules(PARAGRAPH))
    c = merged.constraints
    assert (c.cloud, c.regions, c.budget_band) == ("aws", ["eu-west-1"], "medium")
    assert c.sla_latency_ms == 100 and c.throughput is not None
    assert c.throughput.data_gb_per_day == 200.0
    # The model's extra workload kind stays beside the rules' (the text does not rule it out).
    assert c.workload_types == ["batch", "online", "streaming"]
    assert c.data_classification == "internal"
    assert merged.ambiguous == {"availability_target": "?"} and merged.unfit == {}
    assert source["cloud"] == "rules" and source["data_classification"] == "model"
    assert source["compliance"] == "rules"


def test_agreeing_sources_and_a_workload_the_text_rules_out() -> None:
    model = IntakeSnapshot(
        constraints=Constraints(
            cloud="aws", workload_types=["batch", "online"], compliance=["gdpr"]
        )
    )
    merged, source = merge_with_rules(model, read_rules("AWS batch scoring, no online serving"))
    assert merged.constraints.workload_types == ["batch"]
    assert source["cloud"] == "model+rules" and source["compliance"] == "model"


def test_a_compliance_regime_the_text_does_not_name_is_dropped() -> None:
    model = IntakeSnapshot(constraints=Constraints(compliance=["gdpr", "hipaa"]))
    merged, source = merge_with_rules(model, read_rules(PARAGRAPH))
    assert merged.constraints.compliance == ["gdpr"] and source["compliance"] == "rules"


def test_nothing_read_leaves_the_model_alone() -> None:
    model = IntakeSnapshot(constraints=Constraints(cloud="aws"), ambiguous={"regions": "x"})
    merged, source = merge_with_rules(model, read_rules(""))
    assert merged == model and source == {"cloud": "model"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.5 TB per month of logs", {"throughput": {"data_gb_per_day": 50.0}}),
        ("$15,000 per month", {"budget_band": "high"}),
        ("monthly budget of $3,000", {"budget_band": "medium"}),
        ("budget $50k per year", {"budget_band": "medium"}),
        ("1k rps at peak", {"throughput": {"requests_per_s": 1000.0}}),
        ("500 requests per minute", {"throughput": {"requests_per_s": 8.333333}}),
        ("p50 20 ms, p99 under 80 ms", {"sla_latency_ms": 80}),
        ("p99 under 200 ms and p95 under 120 ms", {"sla_latency_ms": 120}),
        ("eu-west-1a only", {"cloud": "aws", "regions": ["eu-west-1"]}),
        ("retrain every two weeks", {"workload_types": ["batch"], "training_runs_per_month": 2.0}),
        ("we retrain twice a day", {"workload_types": ["batch"], "training_runs_per_month": 60.0}),
        ("no PII here", {}),
        # An upper bound is no negation.
        ("a budget of no more than $2k/month", {"budget_band": "medium"}),
        ("not to exceed 2 TB per day", {"throughput": {"data_gb_per_day": 2000.0}}),
    ],
)
def test_one_phrase(text: str, expected: dict[str, Any]) -> None:
    assert stated(text) == expected


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Please set up the account baseline.", "set up the account baseline"),
        ("This AWS account is dedicated to the project.", "this aws account is dedicated to"),
        ("We own the account, so go ahead.", "we own the account"),
        ("We deploy to a dedicated AWS account.", "a dedicated aws account"),
        (
            "Enable AWS Config and Macie for the account",
            "enable aws config and macie for the account",
        ),
        (
            "Turn on Lake Formation admins for this account",
            "turn on lake formation admins for this account",
        ),
        ("set up account-wide Config", "set up account-wide config"),
    ],
)
def test_an_explicit_account_baseline_request_turns_it_on(text: str, words: str) -> None:
    reading = read_rules(text)
    assert reading.constraints.account_baseline is True
    assert reading.evidence["account_baseline"] == words


@pytest.mark.parametrize(
    "text",
    [
        # A regime or a service named alone is no request: the account may be shared.
        PARAGRAPH,
        "GDPR and HIPAA apply; Macie must scan the lake for PII.",
        "AWS Config rules are required for SOC 2.",
        "enable Macie",
        "Lake Formation permissions on the lake",
        # Someone else's baseline, a shared account, a refusal.
        "The platform team provides the account baseline.",
        "the account baseline is owned by security",
        "account-wide Macie is run by security",
        "We share the account with two other teams; AWS Config is already on.",
        "Do not set up the account baseline.",
        "We won't set up the account baseline.",
        "we don't own the account",
        "we do not own the account",
        "We don't have a dedicated account.",
        "our dedicated account manager approved the budget",
        "Deploy into our own AWS account",
    ],
)
def test_no_account_baseline_without_an_explicit_request(text: str) -> None:
    reading = read_rules(text)
    assert reading.constraints.account_baseline is None
    assert "account_baseline" not in reading.evidence


def test_the_rules_baseline_reaches_the_merged_snapshot() -> None:
    text = PARAGRAPH + ". This account is dedicated to the project."
    model = IntakeSnapshot(constraints=Constraints.model_validate({"cloud": "aws"}))
    merged, source = merge_with_rules(model, read_rules(text))
    assert merged.constraints.account_baseline is True
    assert source["account_baseline"] == "rules"
    # A paragraph without the request leaves the model's reading (here: none) alone.
    merged, source = merge_with_rules(model, read_rules(PARAGRAPH))
    assert merged.constraints.account_baseline is None and "account_baseline" not in source
