from __future__ import annotations

from keel.design.constraints import parse_constraints
from keel.design.diff import (
    change_summary,
    change_summary_md,
    cost_line_diff,
    state_diff,
    terraform_diff,
    terraform_resources,
)
from keel.design.planner import plan
from tests.design.unit.design_data import catalog


def test_added_removed_changed_paths() -> None:
    old = {"a": 1, "b": {"c": [1, 2, 3], "d": "x"}, "gone": True}
    new = {"a": 2, "b": {"c": [1, 5], "d": "x", "e": None}, "new": 1}
    d = state_diff(old, new)
    assert d.added == ["b.e", "new"]
    assert d.removed == ["b.c[2]", "gone"]
    assert [(c.path, c.old, c.new) for c in d.changed] == [("a", 1, 2), ("b.c[1]", 2, 5)]
    assert d.top_keys() == ["a", "b", "gone", "new"]
    assert state_diff(new, new).empty


def test_type_change_is_a_change() -> None:
    d = state_diff({"x": 1}, {"x": 1.0})
    assert [c.path for c in d.changed] == ["x"]


def test_lists_of_keyed_objects_match_by_key() -> None:
    old = {"choices": [{"capability": "a", "p": 1}, {"capability": "b", "p": 2}]}
    new = {
        "choices": [
            {"capability": "z", "p": 0},
            {"capability": "a", "p": 1},
            {"capability": "b", "p": 3},
        ]
    }
    d = state_diff(old, new)
    assert d.added == ["choices[capability=z]"]
    assert [c.path for c in d.changed] == ["choices[capability=b].p"]


def test_replan_diff_shows_only_the_changed_choices() -> None:
    c = parse_constraints(
        {
            "regions": ["us-east-1"],
            "workload_types": ["online"],
            "sla_latency_ms": 300,
            "budget_band": "high",
        }
    )
    first = plan(c, catalog())
    second = plan(c, catalog(), "avoid lambda-serverless")
    d = state_diff(
        {"plan": first.model_dump(mode="json")}, {"plan": second.model_dump(mode="json")}
    )
    changed = {x.path for x in d.changed}
    assert "plan.choices[capability=serve].pattern_id" in changed
    assert not any("capability=ingest" in p for p in changed)


def test_change_summary_counts_files_and_docs() -> None:
    old_files = {"README.md": "h1", "app/main.py": "h2", "infra/old.tf": "h3"}
    new_files = {
        "README.md": "h1b",
        "app/main.py": "h2",
        "infra/new.tf": "h4",
        "docs/plan.md": "h5",
    }
    s = change_summary(
        {"plan": {"x": 1}, "cost": 10},
        {"plan": {"x": 2}, "cost": 10},
        old_files,
        new_files,
        cost_delta_usd=55.0,
        git_commit="a1b2c3d",
    )
    assert (s.files_added, s.files_removed, s.files_modified) == (2, 1, 1)
    assert s.docs_changed == ["README.md", "docs/plan.md"]
    assert s.state_keys_changed == ["plan"]
    assert s.cost_delta_usd == 55.0
    md = change_summary_md(s, state_diff({"plan": {"x": 1}}, {"plan": {"x": 2}}))
    assert "Files: +2 -1 ~1" in md and "Cost: +$55.00/month" in md
    assert "- changed `plan.x`: 1 -> 2" in md


# ------------------------------------------------------------ Terraform and cost lines

ROOT_TF = """\
provider "aws" {
  alias  = "us_east_1"
  region = "us-east-1"
}

provider "aws" {
  alias  = "eu_west_1"
  region = "eu-west-1"
}

module "ingest_us_east_1" {
  source    = "./modules/ingest"
  providers = { aws = aws.us_east_1 }

  shard_count = %d
}

module "ingest_eu_west_1" {
  source    = "./modules/ingest"
  providers = { aws = aws.eu_west_1 }

  shard_count = 1
}
"""
MODULE_TF = """\
# comments do not count
resource "aws_kinesis_stream" "events" {
  name        = "events"
  shard_count = var.shard_count
}

resource "aws_kms_key" "this" {
  enable_key_rotation = true
}
"""


def _tree(shards: int, module: str = MODULE_TF) -> dict[str, str]:
    return {"infra/main.tf": ROOT_TF % shards, "infra/modules/ingest/main.tf": module}


def test_terraform_resources_expand_each_module_instance_with_its_region() -> None:
    found = terraform_resources(_tree(2))
    assert sorted(found) == [
        "module.ingest_eu_west_1.aws_kinesis_stream.events",
        "module.ingest_eu_west_1.aws_kms_key.this",
        "module.ingest_us_east_1.aws_kinesis_stream.events",
        "module.ingest_us_east_1.aws_kms_key.this",
    ]
    change, body = found["module.ingest_us_east_1.aws_kinesis_stream.events"]
    assert (change.region, change.module, change.resource) == (
        "us-east-1",
        "infra/modules/ingest",
        "aws_kinesis_stream.events",
    )
    assert "shard_count = (2)" in body


def test_an_argument_changes_only_that_regions_resource() -> None:
    d = terraform_diff(_tree(2), _tree(4))
    assert [r.address for r in d.changed] == ["module.ingest_us_east_1.aws_kinesis_stream.events"]
    assert d.added == d.removed == []
    # A comment or spacing is no change.
    respaced = MODULE_TF.replace("name        =", "name =").replace("# comments", "# other")
    assert terraform_diff(_tree(2), _tree(2, respaced)).empty


def test_added_and_removed_resources_and_trees_without_modules() -> None:
    extra = MODULE_TF + 'resource "aws_s3_bucket" "landing" {\n  bucket_prefix = "x"\n}\n'
    d = terraform_diff(_tree(2), _tree(2, extra))
    assert [(r.address, r.region) for r in d.added] == [
        ("module.ingest_eu_west_1.aws_s3_bucket.landing", "eu-west-1"),
        ("module.ingest_us_east_1.aws_s3_bucket.landing", "us-east-1"),
    ]
    assert [r.address for r in terraform_diff(_tree(2, extra), _tree(2)).removed] == [
        "module.ingest_eu_west_1.aws_s3_bucket.landing",
        "module.ingest_us_east_1.aws_s3_bucket.landing",
    ]
    # One stack per directory (the layout before modules): addressed by directory.
    flat = {"infra/ingest/main.tf": MODULE_TF, "README.md": 'resource "x" "y" {\n}\n'}
    assert sorted(terraform_resources(flat)) == [
        "infra/ingest:aws_kinesis_stream.events",
        "infra/ingest:aws_kms_key.this",
    ]
    # Nothing to compare, or a block never closed: no resources, no error.
    assert terraform_diff({}, {}).empty
    assert terraform_resources({"a.tf": 'resource "x" "y" {\n  a = 1\n'}) == {}


def test_cost_lines_are_matched_by_capability_resource_and_region() -> None:
    def line(service: str, region: str, qty: float, usd: float, pid: str = "ingest:a") -> dict:
        return {"service": service, "region": region, "quantity": qty, "usd": usd,
                "pattern_id": pid, "unit": "GB-month", "qty": f"{qty} GB-month"}  # fmt: skip

    old = [line("s3_storage", "us-east-1", 10, 0.23), line("kinesis_shard", "us-east-1", 730, 11)]
    new = [
        line("s3_storage", "us-east-1", 10, 0.23),
        line("kinesis_shard", "us-east-1", 1460, 22),
        line("s3_storage", "eu-west-1", 5, 0.1),
        line("s3_storage", "eu-west-1", 5, 0.1),
    ]
    changes = cost_line_diff(old, new)
    assert [(c.resource, c.region) for c in changes] == [
        ("kinesis_shard", "us-east-1"),
        ("s3_storage", "eu-west-1"),
    ]
    shard, added = changes
    assert (shard.old_quantity, shard.new_quantity, shard.delta_usd) == (730, 1460, 11.0)
    assert (added.old_usd, added.new_quantity, added.new_usd) == (None, 10, 0.2)
    removed = cost_line_diff(new, old)[1]
    assert (removed.old_usd, removed.new_usd, removed.delta_usd) == (0.2, None, -0.2)
    # The same resource under another pattern of the capability is a change.
    swapped = [line("s3_storage", "us-east-1", 10, 0.23, "ingest:b"), old[1]]
    [moved] = cost_line_diff(old, swapped)
    assert (moved.old_pattern, moved.new_pattern) == ("ingest:a", "ingest:b")
    assert cost_line_diff(old, old) == []
