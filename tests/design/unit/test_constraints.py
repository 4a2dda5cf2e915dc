from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel.design.constraints import (
    DEFAULT_DATA_SPEC,
    FIELD_NAMES,
    Constraints,
    Task,
    WorkloadType,
    data_spec,
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
# Added by issue 38 §2 (the pipeline runs on the user's data shape): optional, unscored.
DATA_FIELDS = ["data"]


def test_schema_has_exactly_the_plan_fields() -> None:
    assert sorted(FIELD_NAMES) == sorted(PLAN_FIELDS + COST_FIELDS + DEPLOY_FIELDS + DATA_FIELDS)


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


_COLUMNS = [
    {"name": "amount", "type": "number"},
    {"name": "merchant", "type": "category", "categories": ["shop", "travel"]},
    {"name": "is_fraud", "type": "boolean"},
]


def test_a_data_spec_is_read_and_names_its_feature_columns() -> None:
    c = parse_constraints(
        {"data": {"task": "classification", "target": "is_fraud", "columns": _COLUMNS}}
    )
    assert c.data is not None
    assert c.data.task == Task.CLASSIFICATION
    assert [col.name for col in c.data.feature_columns()] == ["amount", "merchant"]
    assert data_spec(c) == (c.data, True)
    assert is_stated(c, "data")
    assert parse_constraints(c.model_dump(mode="json")) == c


def test_without_a_data_spec_the_stated_default_schema_is_used() -> None:
    spec, stated = data_spec(parse_constraints({}))
    assert (spec, stated) == (DEFAULT_DATA_SPEC, False)
    assert spec.target == "churned"
    assert spec.target in {col.name for col in spec.columns}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"task": "classification", "target": "label", "columns": _COLUMNS}, "not a column"),
        ({"task": "regression", "columns": _COLUMNS}, "needs a target column"),
        ({"task": "regression", "target": "is_fraud", "columns": _COLUMNS}, "must be"),
        (
            {
                "task": "classification",
                "target": "x",
                "columns": [{"name": "x", "type": "boolean"}],
            },
            "a column besides the target",
        ),
        (
            {
                "task": "classification",
                "target": "y",
                "columns": [{"name": "My Col", "type": "number"}],
            },
            "snake_case identifier",
        ),
        (
            {"task": "regression", "target": "y", "columns": [{"name": "ts", "type": "number"}]},
            "reserved",
        ),
        (
            {
                "task": "regression",
                "target": "y",
                "columns": [{"name": "y", "type": "number"}, {"name": "y", "type": "integer"}],
            },
            "repeat",
        ),
        (
            {"task": "retrieval", "columns": [{"name": "n", "type": "number"}]},
            "needs a text column",
        ),
        (
            {
                "task": "regression",
                "target": "y",
                "columns": [{"name": "y", "type": "number", "categories": ["a", "b"]}],
            },
            "only a category column",
        ),
        (
            {
                "task": "classification",
                "target": "is_fraud",
                "columns": _COLUMNS,
                "sample_csv": "amount,is_fraud\n1.0,true\n",
            },
            "missing merchant",
        ),
    ],
)
def test_a_bad_data_spec_is_refused_with_a_clear_reason(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConstraintError) as info:
        parse_constraints({"data": data})
    assert all(i.field.startswith("data") for i in info.value.issues)
    assert message in str(info.value)


def test_a_sample_csv_whose_header_names_the_columns_is_kept() -> None:
    sample = "merchant,amount,is_fraud\nshop,12.5,false\ntravel,900,true\n"
    c = parse_constraints(
        {
            "data": {
                "task": "classification",
                "target": "is_fraud",
                "columns": _COLUMNS,
                "sample_csv": sample,
            }
        }
    )
    assert c.data is not None and c.data.sample_csv == sample
