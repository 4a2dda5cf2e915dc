from __future__ import annotations

import copy

import pytest

from keel.design.constraints import Cloud
from keel.design.errors import PatternError
from keel.design.patterns import MANDATORY_CAPABILITIES, Capability, load_patterns
from tests.design.unit.design_data import catalog, prices, raw_patterns


def test_shipped_catalogue_has_two_or_three_aws_patterns_per_capability() -> None:
    cat = catalog()
    assert [c.value for c in MANDATORY_CAPABILITIES] == [
        "ingest", "transform", "store", "feature", "train", "serve", "observe", "govern",
    ]  # fmt: skip
    for capability in Capability:
        n = len(cat.for_capability(capability, Cloud.AWS))
        assert 2 <= n <= 3, (capability, n)
    assert sum(len(cat.for_capability(c, Cloud.AWS)) for c in Capability) == len(cat.patterns)


def test_every_shipped_bom_line_is_priced_in_its_unit() -> None:
    table = prices().prices
    for p in catalog().patterns:
        for item in p.bom:
            assert item.resource in table, (p.id, item.resource)
            assert table[item.resource].unit == item.unit, (p.id, item.resource)


def test_duplicate_id_is_refused() -> None:
    data = copy.deepcopy(raw_patterns())
    data["patterns"]["ingest"].append(dict(data["patterns"]["ingest"][0]))
    with pytest.raises(PatternError) as info:
        load_patterns(data)
    assert info.value.issues[0].field == "patterns.ingest:s3-batch"
    assert "duplicate" in info.value.issues[0].message


def test_unknown_reference_is_refused() -> None:
    data = copy.deepcopy(raw_patterns())
    data["patterns"]["serve"][0]["requires"] = ["store:nowhere"]
    with pytest.raises(PatternError, match="store:nowhere"):
        load_patterns(data)


def test_id_must_name_its_capability_and_errors_name_the_field() -> None:
    data = copy.deepcopy(raw_patterns())
    data["patterns"]["train"][0]["id"] = "serve:misfiled"
    with pytest.raises(PatternError) as info:
        load_patterns(data)
    assert info.value.issues[0].field.startswith("patterns.")
    data = copy.deepcopy(raw_patterns())
    data["patterns"]["train"][0]["cost_tier"] = 9
    with pytest.raises(PatternError) as info:
        load_patterns(data)
    assert info.value.issues[0].field.endswith("cost_tier")
