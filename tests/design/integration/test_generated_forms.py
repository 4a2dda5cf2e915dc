"""Three intake forms of different shape, planned and rendered as a platform engineer
would receive them (issue 24 §1): batch in one region on a low budget; streaming in three
regions; online retrieval (RAG) on a high budget.

Each tree must hold real resources (no ``aws_ssm_parameter`` standing in for a service,
nothing named placeholder) and every capability in every region of the form;
``design diff``'s domain between two of them names the Terraform resources and cost
lines that changed. The validators (HCL parse and checkov among them) run in
``test_validators.py`` on the shapes that together generate everything any shape here
generates (its ``VALIDATED``; a test there keeps that true).
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import pytest

from activities.design.codegen import CodeGenRequest, render_request
from activities.design.validators import add_sbom
from keel.design.diff import cost_line_diff, terraform_diff, terraform_resources
from tests.design.codegen_cases import request_from
from tests.design.unit.design_data import golden_cases

pytestmark = pytest.mark.timeout(900)

FORMS: dict[str, dict[str, Any]] = {
    "batch-one-region-low": dict(golden_cases()["batch_training"]["constraints"]),
    "streaming-three-regions": {
        "cloud": "aws",
        "regions": ["us-east-1", "us-west-2", "eu-west-1"],
        "workload_types": ["streaming"],
        "throughput": {"events_per_s": 5000, "data_gb_per_day": 400},
        "budget_band": "high",
        "data_classification": "internal",
    },
    "online-rag-high": {
        "cloud": "aws",
        "regions": ["eu-central-1"],
        "workload_types": ["online"],
        "storage_prefs": ["vector"],
        "sla_latency_ms": 100,
        "budget_band": "high",
        "throughput": {"requests_per_s": 200},
        "data_classification": "confidential",
    },
}


@functools.cache
def _request(name: str) -> CodeGenRequest:
    return request_from(FORMS[name], name)


@functools.cache
def _tree(name: str) -> dict[str, str]:
    return asyncio.run(add_sbom(render_request(_request(name))))


def test_the_forms_differ_in_shape() -> None:
    batch, streaming, rag = (_request(n) for n in FORMS)
    assert [len(r.plan.regions) for r in (batch, streaming, rag)] == [1, 3, 1]
    assert batch.constraints.budget_band == "low" and rag.constraints.budget_band == "high"
    assert {w.value for w in streaming.plan.workloads} == {"streaming"}
    assert "store:opensearch-vector" in rag.plan.pattern_ids()
    assert all(r.policy.overall != "fail" for r in (batch, streaming, rag))


@pytest.mark.parametrize("name", list(FORMS))
def test_form_renders_real_resources_in_every_region(name: str) -> None:
    req, files = _request(name), _tree(name)
    tf = {p: t for p, t in files.items() if p.endswith(".tf")}
    for path, text in tf.items():
        assert "aws_ssm_parameter" not in text, path
        assert "placeholder" not in text.lower(), path
    resources = terraform_resources(files)
    by_region: dict[str | None, set[str]] = {}
    for change, _ in resources.values():
        by_region.setdefault(change.region, set()).add(change.module)
    assert set(by_region) == set(req.plan.regions), by_region.keys()
    modules = {f"infra/modules/{c.capability.value}" for c in req.plan.choices}
    for region in req.plan.regions:
        assert by_region[region] == modules | {"infra/modules/foundation"}, region
    for choice in req.plan.choices:
        assert choice.pattern_id in tf[f"infra/modules/{choice.capability.value}/main.tf"]


def test_diff_between_two_forms_names_resources_and_cost_lines() -> None:
    old, new = "batch-one-region-low", "streaming-three-regions"
    d = terraform_diff(_tree(old), _tree(new))
    added = {r.address for r in d.added}
    assert "module.ingest_us_east_1.aws_msk_cluster.this" in added
    assert "module.ingest_eu_west_1.aws_msk_cluster.this" in added
    assert "module.ingest_eu_west_1.aws_sfn_state_machine.ingest" in {r.address for r in d.removed}
    assert {r.region for r in d.added} == {"eu-west-1", "us-east-1", "us-west-2"}
    # The store is the lake in both: same resources, sized by the new retention and data.
    assert all(not r.address.startswith("module.store_eu_west_1.aws_s3_bucket.") for r in d.added)
    lines = cost_line_diff(
        [ln.model_dump(mode="json") for ln in _request(old).cost.breakdown],
        [ln.model_dump(mode="json") for ln in _request(new).cost.breakdown],
    )
    keyed = {(c.capability, c.resource, c.region): c for c in lines}
    broker = keyed[("ingest", "msk_broker_m5_large", "us-east-1")]
    assert broker.old_usd is None and broker.new_usd and broker.new_quantity
    lake = keyed[("store", "s3_storage", "eu-west-1")]
    assert lake.old_quantity is not None and lake.new_quantity is not None
    assert lake.old_quantity != lake.new_quantity
    assert round(sum(c.delta_usd for c in lines), 2) == pytest.approx(
        _request(new).cost.monthly_usd - _request(old).cost.monthly_usd, abs=0.05
    )
