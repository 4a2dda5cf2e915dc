"""A data spec from a sample file (issue 38 §2): CSV and Parquet give the same columns,
types, time column and shipped sample; the intake form takes it and the generated
repository ships it."""

from __future__ import annotations

import csv
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from activities.design.app import render_app
from client.design_sample import SampleError, data_spec_from_file, form_with_sample, read_table
from keel.design.constraints import ColumnType, DataSpec
from keel.design.samples import infer_type, snake_name, spec_from_table
from tests.design.codegen_cases import FORMS, request_from

DAYS = [date(2025, 1, 1) + timedelta(days=i) for i in range(12)]
TABLE: dict[str, list[Any]] = {
    "Day": DAYS,
    "Store": ["north", "south"] * 6,
    "Promo": [i % 3 == 0 for i in range(12)],
    "Visits": list(range(100, 112)),
    "Sales ($)": [round(50.5 + i * 1.25, 2) for i in range(12)],
    "Note": [f"free text {i}" for i in range(12)],
}


def write_parquet(path: Path) -> Path:
    pq.write_table(pa.table(TABLE), path)
    return path


def write_csv(path: Path) -> Path:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(TABLE)
        for i in range(12):
            writer.writerow(
                [
                    DAYS[i].isoformat(),
                    TABLE["Store"][i],
                    str(TABLE["Promo"][i]).lower(),
                    TABLE["Visits"][i],
                    TABLE["Sales ($)"][i],
                    TABLE["Note"][i],
                ]
            )
    return path


@pytest.mark.parametrize("kind", ["parquet", "csv"])
def test_a_sample_file_makes_the_data_spec(kind: str, tmp_path: Path) -> None:
    path = (write_parquet if kind == "parquet" else write_csv)(tmp_path / f"sales.{kind}")
    spec = data_spec_from_file(path, task="forecasting", target="Sales ($)")
    types = {c.name: c.type for c in spec.columns}
    assert types == {
        "store": ColumnType.CATEGORY,
        "promo": ColumnType.BOOLEAN,
        "visits": ColumnType.INTEGER,
        "sales": ColumnType.NUMBER,
        "note": ColumnType.TEXT,
    }
    assert spec.target == "sales" and spec.time_column == "day"
    assert next(c for c in spec.columns if c.name == "store").categories == ["north", "south"]
    assert spec.sample_csv is not None
    lines = spec.sample_csv.splitlines()
    assert lines[0] == "day,store,promo,visits,sales,note"
    assert lines[1] == "2025-01-01T00:00:00,north,true,100,50.5,free text 0"
    assert len(lines) == 13
    # The same spec from either kind of file.
    other = (write_csv if kind == "parquet" else write_parquet)(tmp_path / "other.x")
    other = other.rename(other.with_suffix(".csv" if kind == "parquet" else ".parquet"))
    assert data_spec_from_file(other, task="forecasting", target="sales") == spec


def test_the_form_ships_the_sample(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "sales.parquet")
    form = form_with_sample(FORMS["empty_form"], path, task="regression", target="sales")
    assert DataSpec.model_validate(form["data"]).time_column == "day"
    files = render_app(request_from(form, "sales-parquet"))
    assert files["samples/sample.csv"].startswith("day,store,promo,visits,sales,note\n")
    assert 'TIME_COLUMN = "day"' in files["services/common/sample.py"]


def test_what_does_not_make_a_spec_is_said(tmp_path: Path) -> None:
    with pytest.raises(SampleError, match=r"a sample is a \.csv or \.parquet file, not \.xlsx"):
        read_table(tmp_path / "sales.xlsx")
    path = write_parquet(tmp_path / "sales.parquet")
    with pytest.raises(SampleError, match="target 'note' is text; a regression target must be"):
        data_spec_from_file(path, task="regression", target="note")
    with pytest.raises(SampleError, match="time column 'store' does not hold ISO 8601"):
        data_spec_from_file(path, task="regression", target="sales", time_column="store")
    with pytest.raises(ValueError, match="several date or time columns \\(a, b\\)"):
        spec_from_table(
            ["a", "b", "y"], [["2025-01-01", "2025-01-02", 1.0]], task="regression", target="y"
        )
    with pytest.raises(ValueError, match="column names event_id are reserved"):
        spec_from_table(
            ["event_id", "y"], [["e1", 1.0], ["e2", 2.0]], task="regression", target="y"
        )


def test_types_and_names_are_inferred_from_values() -> None:
    assert infer_type(["1", "2", ""]) == ColumnType.INTEGER
    assert infer_type(["1.5", "2"]) == ColumnType.NUMBER
    assert infer_type(["yes", "no", None]) == ColumnType.BOOLEAN
    assert infer_type(["2025-01-01T10:00:00Z"]) is None
    assert infer_type(["a", "b", "a", "b"]) == ColumnType.CATEGORY
    assert infer_type(["a", "b"]) == ColumnType.CATEGORY
    assert infer_type([f"w{i}" for i in range(10)]) == ColumnType.TEXT
    assert snake_name("Monthly Spend ($)") == "monthly_spend"
    assert snake_name("2nd Visit") == "c_2nd_visit"
