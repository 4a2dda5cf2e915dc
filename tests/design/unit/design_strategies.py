"""Hypothesis strategies for the design domain: any valid Constraint Schema value."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from keel.design.constraints import (
    BudgetBand,
    Cloud,
    Compliance,
    DataClassification,
    DeploymentPref,
    WorkloadType,
)

REGIONS = ["us-east-1", "us-west-2", "eu-west-1", "eu-central-1", "ap-southeast-2"]
WORDS = ["kafka", "grafana", "vector", "python", "mlflow", "dbt", "s3", "sagemaker", "fargate"]


def _maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


@st.composite
def constraint_dicts(draw: st.DrawFn, clouds: list[Cloud] | None = None) -> dict[str, Any]:
    """A dict that ``parse_constraints`` accepts, with any subset of fields stated."""
    fields: dict[str, Any] = {
        "cloud": _maybe(st.sampled_from([c.value for c in (clouds or list(Cloud))])),
        "regions": st.lists(st.sampled_from(REGIONS), max_size=3),
        "budget_band": _maybe(st.sampled_from([b.value for b in BudgetBand])),
        "data_classification": _maybe(st.sampled_from([d.value for d in DataClassification])),
        "sla_latency_ms": _maybe(st.integers(min_value=1, max_value=5000)),
        "availability_target": _maybe(st.sampled_from([95.0, 99.0, 99.5, 99.9, 99.95, 99.99])),
        "throughput": _maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "requests_per_s": st.floats(0, 50_000, allow_nan=False),
                    "events_per_s": st.floats(0, 200_000, allow_nan=False),
                    "data_gb_per_day": st.floats(0, 10_000, allow_nan=False),
                },
            )
        ),
        "workload_types": st.lists(st.sampled_from([w.value for w in WorkloadType]), max_size=3),
        "deployment_pref": _maybe(st.sampled_from([d.value for d in DeploymentPref])),
        "storage_prefs": st.lists(st.sampled_from(WORDS), max_size=2),
        "observability_prefs": st.lists(st.sampled_from(WORDS), max_size=2),
        "existing_stack": st.lists(st.sampled_from(WORDS), max_size=3),
        "compliance": st.lists(st.sampled_from([c.value for c in Compliance]), max_size=2),
    }
    keep = draw(st.sets(st.sampled_from(sorted(fields))))
    return {name: draw(fields[name]) for name in sorted(keep)}


# A valid answer per question field, for tests that answer what the questioner asks.
ANSWERS: dict[str, Any] = {
    "cloud": "aws",
    "regions": ["eu-west-1"],
    "budget_band": "medium",
    "workload_types": ["online"],
    "data_classification": "internal",
    "sla_latency_ms": 200,
    "availability_target": 99.9,
    "deployment_pref": "containers",
    "compliance": [],
}

# Candidate answers for conflict questions, withdrawal (None) included.
ANSWER_OPTIONS: dict[str, list[Any]] = {
    "compliance": [[], ["gdpr"], ["soc2"]],
    "data_classification": ["internal", "restricted"],
    "sla_latency_ms": [None, 200],
    "workload_types": [["online"], ["batch", "online"]],
    "budget_band": ["medium", "high"],
    "availability_target": [None, 99.9],
    "deployment_pref": [None, "containers"],
    "regions": [["eu-west-1"], ["eu-central-1"]],
}
