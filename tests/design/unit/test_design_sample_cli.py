"""``design run --sample FILE --task T --target C``: the user's sample file reaches the
intake form's ``data`` (issue 38 §2); a sample that makes no spec, or one given without
its task, fails with one line before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli.design_run import with_sample
from cli.toolkit import CliFailure
from tests.design.unit.test_design_sample import write_csv, write_parquet

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_the_sample_becomes_the_forms_data(kind: str, tmp_path: Path) -> None:
    path = (write_parquet if kind == "parquet" else write_csv)(tmp_path / f"sales.{kind}")
    form = with_sample({"regions": ["eu-west-1"]}, path, "forecasting", "Sales ($)", None)
    assert form is not None and form["regions"] == ["eu-west-1"]
    data = form["data"]
    assert data["task"] == "forecasting" and data["target"] == "sales"
    assert data["time_column"] == "day"
    assert {c["name"] for c in data["columns"]} == {"store", "promo", "visits", "sales", "note"}
    assert with_sample({"a": 1}, None, None, None, None) == {"a": 1}  # no sample: as it was


def test_sample_options_without_a_sample_are_refused() -> None:
    with pytest.raises(CliFailure, match="describe a --sample file"):
        with_sample(None, None, "classification", None, None)


def test_a_bad_sample_fails_with_one_line_before_anything_starts(tmp_path: Path) -> None:
    bad = tmp_path / "events.txt"
    bad.write_text("a,b\n1,2\n")
    env = {
        **{k: v for k, v in os.environ.items() if k != "KEEL_TEMPORAL_ADDRESS"},
        "KEEL_DATA_DIR": str(tmp_path / "keel"),
        "KEEL_USER": "alice",
    }
    cmd = [sys.executable, "-m", "cli.design", "run", "p", "--sample", str(bad)]
    done = subprocess.run(
        [*cmd, "--task", "classification", "--target", "b"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "a sample is a .csv or .parquet file, not .txt" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    untasked = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert untasked.returncode != 0 and "--sample needs --task" in untasked.stderr
    assert not (tmp_path / "keel" / "up.log").exists()  # nothing was started
