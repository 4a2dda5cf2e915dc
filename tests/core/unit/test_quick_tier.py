"""The quick tier's fault tests (tests/quick_tier.txt, read by scripts/test.sh --quick):
one per family that has fault tests, and each names a test that exists."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def quick_faults() -> list[str]:
    lines = (ROOT / "tests" / "quick_tier.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def test_every_family_with_fault_tests_has_one_in_the_quick_tier() -> None:
    families = {p.parent.name for p in ROOT.glob("tests/*/faults") if p.is_dir()}
    families -= {"core"}  # the core's fault tests span families; each family has its own
    listed = {node.split("/")[1] for node in quick_faults()}
    assert {"gate", "rllm", "mrp", "srl", "design"} <= families
    assert families <= listed, sorted(families - listed)


def test_each_listed_fault_test_exists() -> None:
    for node in quick_faults():
        path, name = node.split("::")
        assert path.startswith("tests/") and "/faults/" in path, node
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        assert name in names, node


def test_the_script_runs_the_list() -> None:
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "tests/quick_tier.txt" in script and '"${faults[@]}"' in script


def test_durations_table_sums_each_file_from_junit_xml(tmp_path: Path) -> None:
    from tests.support.durations import file_seconds

    junit = tmp_path / "suite.xml"
    junit.write_text(
        "<testsuites><testsuite>"
        '<testcase classname="tests.core.unit.test_quick_tier" name="a" time="1.5"/>'
        '<testcase classname="tests.core.unit.test_quick_tier" name="b" time="2.0"/>'
        '<testcase classname="tests.test_replay" name="c" time="0.25"/>'
        "</testsuite></testsuites>"
    )
    assert file_seconds(junit) == {
        "tests/core/unit/test_quick_tier.py": 3.5,
        "tests/test_replay.py": 0.2,
    }


def test_work_units_are_ordered_longest_first() -> None:
    from tests.conftest import EMBEDDED_MODEL_FILES, EMBEDDED_MODEL_GROUP, scope_seconds

    seconds = scope_seconds({EMBEDDED_MODEL_GROUP, "tests/no/such_file.py"})
    table = json.loads((ROOT / "tests" / "durations.json").read_text())
    assert seconds[EMBEDDED_MODEL_GROUP] == pytest.approx(
        sum(table[f] for f in EMBEDDED_MODEL_FILES if f in table)
        + sum(
            sorted(table.values())[len(table) // 2] for f in EMBEDDED_MODEL_FILES if f not in table
        )
    )
    assert seconds["tests/no/such_file.py"] == sorted(table.values())[len(table) // 2]
