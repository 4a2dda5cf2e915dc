from __future__ import annotations

from keel.design.constraints import parse_constraints
from keel.design.diff import (
    DecisionSetDiff,
    change_summary,
    change_summary_md,
    cost_delta,
    cost_line_diff,
    decision_set_diff,
    diffable,
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
    # The instance's argument stands in for var.shard_count.
    assert '"shard_count":2' in body


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
    # Nothing to compare, or a block never closed: no resources, no error; the file that
    # is not HCL is named.
    assert terraform_diff({}, {}).empty
    broken = {"a.tf": 'resource "x" "y" {\n  a = 1\n'}
    assert terraform_resources(broken) == {}
    assert terraform_diff({}, broken).unreadable == ["a.tf"]


#: The tree of ``_tree`` in a layout ``terraform fmt`` never writes: one-line blocks, a
#: block closed on its last argument's line or by an indented brace, indented blocks,
#: no spaces around ``=``, a comment after the brace. Terraform reads it as the same tree.
ODD_ROOT_TF = """provider "aws" { alias = "us_east_1"
region="us-east-1" }
provider   "aws"   {
    alias="eu_west_1"
    region   =   "eu-west-1"
    }
module "ingest_us_east_1" { source = "./modules/ingest"
  providers = { aws = aws.us_east_1 }
  shard_count = %d }
module "ingest_eu_west_1" {
    source="./modules/ingest"
    providers={aws=aws.eu_west_1}
    shard_count=1
  }
"""
ODD_MODULE_TF = """resource "aws_kinesis_stream" "events" { # one stream per region
  name = "events"
  shard_count = var.shard_count }
resource "aws_kms_key" "this" { enable_key_rotation = true }
"""


def _odd_tree(shards: int) -> dict[str, str]:
    return {"infra/main.tf": ODD_ROOT_TF % shards, "infra/modules/ingest/main.tf": ODD_MODULE_TF}


def test_terraform_in_any_layout_reads_as_in_fmt_layout() -> None:
    """The old reader matched ``terraform fmt``'s layout line by line (a block opened at
    the end of its first line, closed by ``}`` at column 0): on this tree it found no
    resource at all. Read as HCL, it is the same tree as ``_tree``'s."""
    odd = terraform_resources(_odd_tree(2))
    fmt = terraform_resources(_tree(2))
    assert (
        sorted(odd)
        == sorted(fmt)
        == [
            "module.ingest_eu_west_1.aws_kinesis_stream.events",
            "module.ingest_eu_west_1.aws_kms_key.this",
            "module.ingest_us_east_1.aws_kinesis_stream.events",
            "module.ingest_us_east_1.aws_kms_key.this",
        ]
    )
    assert {a: (c.region, body) for a, (c, body) in odd.items()} == {
        a: (c.region, body) for a, (c, body) in fmt.items()
    }
    d = terraform_diff(_odd_tree(2), _odd_tree(4))
    assert [r.address for r in d.changed] == ["module.ingest_us_east_1.aws_kinesis_stream.events"]
    assert d.added == d.removed == d.unreadable == []
    # Across layouts only what Terraform would see counts: the argument that changed.
    assert [r.address for r in terraform_diff(_tree(2), _odd_tree(4)).changed] == [
        "module.ingest_us_east_1.aws_kinesis_stream.events"
    ]
    assert terraform_diff(_tree(2), _odd_tree(2)).empty


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


def test_one_cost_delta_rule_for_the_critic_and_design_diff() -> None:
    """``design diff`` against any decision set and the cost critic against the previous
    one compute the delta with the same rule (cost_delta), percent to 0.1."""
    assert cost_delta(100.0, 133.33) == (33.33, 33.3)
    assert cost_delta(0.0, 5.0) == (5.0, None)
    assert cost_delta(None, 5.0) == cost_delta(5.0, None) == (None, None)
    line = {"service": "s3_storage", "region": "us-east-1", "quantity": 10.0, "usd": 0.23,
            "pattern_id": "ingest:a", "unit": "GB-month", "qty": "10 GB-month"}  # fmt: skip
    d = decision_set_diff(
        project="p",
        decision_set="ds2",
        previous="ds1",
        old_state=diffable({"regions": ["us-east-1"]}, {"choices": []}),
        new_state=diffable(
            {"regions": ["us-east-1"]}, {"choices": [{"capability": "ingest", "pattern_id": "a"}]}
        ),
        files={"README.md": "modified", "infra/main.tf": "added"},
        old_tf=None,
        new_tf=None,
        old_cost={"monthly_usd": 100.0, "breakdown": []},
        new_cost={"monthly_usd": 100.23, "breakdown": [line]},
    )
    assert (d.cost_delta_usd, d.cost_delta_pct, d.monthly_usd) == (0.23, 0.2, 100.23)
    assert d.docs_changed == ["README.md"] and d.files_added == ["infra/main.tf"]
    assert d.state_keys_changed == ["plan"] and d.terraform is None
    doc = d.model_dump(mode="json")
    assert doc["cost_lines"][0]["delta_usd"] == 0.23
    assert doc["changes"]["added"] == ["plan.ingest"]
    # A run's recorded summary keeps what the run computed.
    recorded = {"docs_changed": ["plan.md"], "state_keys_changed": []}
    kept = decision_set_diff(**{**_args(d), "recorded": recorded})
    assert (kept.docs_changed, kept.state_keys_changed) == (["plan.md"], [])


def _args(d: DecisionSetDiff) -> dict:
    return {
        "project": d.project,
        "decision_set": d.decision_set,
        "previous": d.previous,
        "old_state": {},
        "new_state": {},
        "files": {},
        "old_tf": None,
        "new_tf": None,
        "old_cost": None,
        "new_cost": None,
    }
