"""Sink destinations: what the runtime can write is exactly what compile admits.

``s3://`` URIs under an allowed prefix compile and are written through the artifact
store's S3 client (tests/mrp/integration/test_s3_sink.py); any other scheme, a malformed
S3 URI or a relative path leaving the output root is refused at compile with its line.
"""

from __future__ import annotations

import pytest

from keel.mrp import DslError, PolicyViolation, compile_job
from keel.mrp.dsl import SinkKind, SinkSpec, destination_problem, parse_s3_destination
from keel.mrp.sdk import sink_file_name
from tests.mrp.unit.mrp_jobs import job_text, load_caps, load_registry

REGISTRY = load_registry()
BASE = job_text("valid/wordcount.yaml")
DEST_LINE = 1 + BASE.splitlines().index("    destination: out/wordcount.json")


def with_destination(dest: str) -> str:
    return BASE.replace("destination: out/wordcount.json", f"destination: {dest!r}")


@pytest.mark.parametrize(
    ("dest", "bucket", "prefix", "name"),
    [
        ("s3://keel-out/wordcount.json", "keel-out", "", "wordcount.json"),
        ("s3://keel-out/a/b/wordcount.json", "keel-out", "a/b/", "wordcount.json"),
        ("s3://keel-out/sentiment/2026-q1/", "keel-out", "sentiment/2026-q1/", None),
        ("s3://keel.out-2/x=1/y.json", "keel.out-2", "x=1/", "y.json"),
    ],
)
def test_s3_destinations_parse_into_bucket_and_prefix(
    dest: str, bucket: str, prefix: str, name: str | None
) -> None:
    loc = parse_s3_destination(dest)
    assert (loc.bucket, loc.prefix, loc.file_name) == (bucket, prefix, name)
    assert destination_problem(dest) is None
    # The producer's file name and the upload key agree with the destination.
    file_name = sink_file_name(SinkSpec(kind=SinkKind.JSON, destination=dest))
    assert file_name == (name or "output.json")
    assert loc.uri_for(file_name) == (dest if name else dest + "output.json")


@pytest.mark.parametrize(
    ("dest", "why"),
    [
        ("gs://keel-out/wordcount.json", "scheme 'gs'"),
        ("http://keel-out/wordcount.json", "scheme 'http'"),
        ("file://keel-out/wordcount.json", "scheme 'file'"),
        ("s3://keel-out", "names no object or prefix"),
        ("s3://keel-out/", "names no object or prefix"),
        ("s3://Keel_Out/x.json", "not a valid S3 bucket name"),
        ("s3://keel-out/a/../x.json", "segment '..'"),
        ("s3://keel-out/a//x.json", "segment ''"),
        ("s3://keel-out/./x.json", "segment '.'"),
        ("s3://keel-out/a b/x.json", "segment 'a b'"),
    ],
)
def test_unwritable_destinations_are_refused_at_compile_with_their_line(
    dest: str, why: str
) -> None:
    # The caps admit every one of these prefixes: only the runtime's ability decides.
    caps = load_caps(
        allowed_destination_prefixes=[
            "s3://keel-out",
            "s3://Keel_Out/",
            "gs://keel-out/",
            "http://keel-out/",
            "file://keel-out/",
        ]
    )
    with pytest.raises(PolicyViolation) as info:
        compile_job(with_destination(dest), REGISTRY, caps, source="job.yaml")
    [v] = info.value.report.violations
    assert (v.rule_id, v.path, v.line) == ("MRP-P016", "produce.sink.destination", DEST_LINE)
    assert why in v.message and dest in v.message
    assert f"(line {DEST_LINE})" in str(info.value)


def test_an_s3_destination_under_an_allowed_prefix_compiles() -> None:
    result = compile_job(
        with_destination("s3://keel-out/reports/wordcount.json"), REGISTRY, load_caps()
    )
    assert result.ir.produce.sink.destination == "s3://keel-out/reports/wordcount.json"
    outcomes = {o.rule_id: o.status for o in result.policy_report.rules_evaluated}
    assert outcomes["MRP-P009"] == outcomes["MRP-P016"] == "passed"


@pytest.mark.parametrize("dest", ["../escape.json", "/etc/passwd", "out/../../x.json"])
def test_relative_destinations_leaving_the_output_root_are_dsl_errors(dest: str) -> None:
    with pytest.raises(DslError) as info:
        compile_job(with_destination(dest), REGISTRY, load_caps(), source="job.yaml")
    [issue] = info.value.issues
    assert (issue.path, issue.line) == ("produce.sink.destination", DEST_LINE)
