from __future__ import annotations

import pytest

from keel.design.constraints import (
    FIELD_NAMES,
    Constraints,
    WorkloadType,
    is_stated,
    parse_constraints,
)
from keel.design.errors import ConstraintError

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


def test_schema_has_exactly_the_plan_fields() -> None:
    assert sorted(FIELD_NAMES) == sorted(PLAN_FIELDS)


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
