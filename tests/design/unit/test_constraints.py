from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.design.constraints import (
    FIELD_NAMES,
    Constraints,
    WorkloadType,
    is_stated,
    parse_constraints,
)
from keel.design.errors import ConstraintError
from tests.design.unit.design_strategies import constraint_dicts

PLAN_FIELDS = [
    "cloud",
    "regions",
    "budget_band",
    "data_classification",
    "sla_latency_ms",
    "availability_target",
    "throughput",
    "workload_types",
    "deployment_pref",
    "storage_prefs",
    "observability_prefs",
    "team_constraints",
    "existing_stack",
    "compliance",
]
# Added by issue 24 §2 (cost from the workload): optional, outside the coverage score.
COST_FIELDS = ["retention_days", "training_runs_per_month"]
# Added by issue 38 §3 (deployable into a real account): optional, outside the score.
DEPLOY_FIELDS = ["account_baseline"]


def test_schema_has_exactly_the_plan_fields() -> None:
    assert sorted(FIELD_NAMES) == sorted(PLAN_FIELDS + COST_FIELDS + DEPLOY_FIELDS)


def test_enums_follow_the_plan() -> None:
    schema = Constraints.model_json_schema()
    defs = schema["$defs"]
    assert defs["WorkloadType"]["enum"] == ["batch", "streaming", "online"]
    assert defs["DeploymentPref"]["enum"] == ["serverless", "containers"]
    assert {"gdpr", "hipaa"} <= set(defs["Compliance"]["enum"])


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"regions": ["EU West 1"]}, "regions"),
        ({"sla_latency_ms": 0}, "sla_latency_ms"),
        ({"availability_target": 100}, "availability_target"),
        ({"budget_band": "cheap"}, "budget_band"),
        ({"workload_types": ["realtime"]}, "workload_types.0"),
        ({"throughput": {"requests_per_s": -1}}, "throughput.requests_per_s"),
        ({"budget": "low"}, "budget"),
    ],
)
def test_validation_errors_name_the_field(data: dict[str, object], field: str) -> None:
    with pytest.raises(ConstraintError) as info:
        parse_constraints(data)
    assert [i.field for i in info.value.issues] == [field]
    assert field in str(info.value)


def test_lists_are_normalised_so_digests_do_not_depend_on_order() -> None:
    a = parse_constraints(
        {"regions": ["us-east-1", "eu-west-1", "us-east-1"], "existing_stack": [" Kafka", "dbt"]}
    )
    b = parse_constraints(
        {"regions": ["eu-west-1", "us-east-1"], "existing_stack": ["dbt", "kafka"]}
    )
    assert a == b
    assert a.regions == ["eu-west-1", "us-east-1"]


def test_is_stated_treats_empty_values_as_missing() -> None:
    c = parse_constraints({"throughput": {}, "workload_types": ["batch"], "team_constraints": {}})
    assert not is_stated(c, "throughput")
    assert not is_stated(c, "team_constraints")
    assert not is_stated(c, "cloud")
    assert is_stated(c, "workload_types")
    assert c.workload_types == [WorkloadType.BATCH]


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from([*FIELD_NAMES, "budget", "region"]), _json, max_size=6),
    constraint_dicts(),
)
def test_intake_of_arbitrary_json_is_valid_or_refused_by_field(
    junk: dict[str, Any], valid: dict[str, Any]
) -> None:
    """An extractor's output of any shape either parses or raises ConstraintError whose
    issues all name a top-level field that was in the input; valid dicts round-trip."""
    data = {**valid, **junk}
    try:
        c = parse_constraints(data)
    except ConstraintError as exc:
        assert exc.issues
        for issue in exc.issues:
            assert issue.field.split(".", 1)[0] in data
    else:
        assert parse_constraints(c.model_dump(mode="json")) == c
    ok = parse_constraints(valid)
    assert parse_constraints(ok.model_dump(mode="json")) == ok
