from __future__ import annotations

from keel.design.constraints import parse_constraints
from keel.design.diff import change_summary, change_summary_md, state_diff
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
