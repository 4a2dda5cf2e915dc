"""``map.min_success_ratio`` in the DSL and the IR: absent and 1 are today's job, byte for
byte; below 1 it reaches the runtime limits; out of range is a DSL error with its line."""

from __future__ import annotations

from decimal import Decimal

import pytest

from keel.mrp import DslError, compile_job
from keel.mrp.ir import RuntimeLimits
from tests.mrp.unit.mrp_jobs import job_text, load_caps, load_registry

REGISTRY = load_registry()
CAPS = load_caps()
BASE = job_text("valid/wordcount.yaml")
ANCHOR = "  operator: tokens-count@1.0.0\n"


def with_ratio(value: str) -> str:
    return BASE.replace(ANCHOR, ANCHOR + f"  min_success_ratio: {value}\n")


def test_absent_and_one_compile_to_the_same_ir_as_before() -> None:
    before = compile_job(BASE, REGISTRY, CAPS)
    assert "min_success_ratio" not in before.ir_json().decode()
    for value in ("1", '"1.0"', "1.0"):
        same = compile_job(with_ratio(value), REGISTRY, CAPS)
        assert same.ir.limits.min_success_ratio is None
        assert same.ir_json() == before.ir_json()
        assert same.ir.job_digest == before.ir.job_digest
        assert same.manifest_json() == before.manifest_json()


def test_a_ratio_below_one_reaches_the_runtime_limits() -> None:
    result = compile_job(with_ratio('"0.75"'), REGISTRY, CAPS)
    assert result.ir.limits.min_success_ratio == Decimal("0.75")
    assert '"min_success_ratio":"0.75"' in result.ir_json().decode()
    # The job changed, so its digest did; seeds follow the inputs, so they did not.
    base = compile_job(BASE, REGISTRY, CAPS)
    assert result.ir.job_digest != base.ir.job_digest
    assert [t.seed for t in result.ir.map_tasks] == [t.seed for t in base.ir.map_tasks]


@pytest.mark.parametrize("value", ["0", "-0.1", "1.5", '"half"', "true"])
def test_out_of_range_ratios_are_dsl_errors_with_their_line(value: str) -> None:
    text = with_ratio(value)
    line = 1 + text.splitlines().index(f"  min_success_ratio: {value}")
    with pytest.raises(DslError) as info:
        compile_job(text, REGISTRY, CAPS, source="job.yaml")
    [issue] = info.value.issues
    assert (issue.path, issue.line) == ("map.min_success_ratio", line)


@pytest.mark.parametrize(
    ("ratio", "succeeded", "total", "enough"),
    [
        (None, 6, 6, True),
        (None, 5, 6, False),
        ("0.5", 3, 6, True),
        ("0.5", 2, 6, False),
        ("0.75", 3, 4, True),
        ("0.75", 74, 100, False),
        ("0.01", 0, 6, False),  # nothing to reduce
    ],
)
def test_enough_succeeded_is_exact(
    ratio: str | None, succeeded: int, total: int, enough: bool
) -> None:
    limits = RuntimeLimits(
        max_workers=1,
        shard_timeout_s=1,
        shard_memory_mb=16,
        max_shard_retries=0,
        egress=[],
        min_success_ratio=Decimal(ratio) if ratio else None,
    )
    assert limits.enough_succeeded(succeeded, total) is enough
