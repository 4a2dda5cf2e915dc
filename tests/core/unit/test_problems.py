"""keel.problems: one way to write where a problem is, used by every family's messages."""

from __future__ import annotations

from keel.mrp.errors import DslIssue
from keel.mrp.policy import Violation
from keel.problems import at_path, located, location


def test_location_leaves_out_what_is_unknown() -> None:
    assert location("job.yaml", 26) == "job.yaml:26"
    assert location("app.rllm", 6, 1) == "app.rllm:6:1"
    assert location("", 26) == "line 26"
    assert location("", 26, 3) == "line 26:3"
    assert location("job.yaml") == "job.yaml"
    assert location() == ""
    assert located("bad", "job.yaml", 26) == "job.yaml:26: bad"
    assert located("bad") == "bad"
    assert at_path("policy.max_workers", 30) == " at policy.max_workers (line 30)"
    assert at_path("policy.max_workers") == " at policy.max_workers"
    assert at_path("", 30) == " (line 30)"
    assert at_path("") == ""


def test_the_mrp_findings_write_places_with_it() -> None:
    issue = DslIssue(path="produce.sink.mode", line=23, message="unknown field 'mode'")
    assert (
        issue.render("wordcount.yaml")
        == "wordcount.yaml:23: produce.sink.mode: unknown field 'mode'"
    )
    assert issue.render() == "line 23: produce.sink.mode: unknown field 'mode'"
    assert DslIssue(path="", message="empty").render() == "empty"
    v = Violation(rule_id="MRP-P001", title="max_workers over cap", path="policy.max_workers",
                  line=30, message="64 > 16")  # fmt: skip
    assert v.render() == "MRP-P001 max_workers over cap at policy.max_workers (line 30): 64 > 16"
