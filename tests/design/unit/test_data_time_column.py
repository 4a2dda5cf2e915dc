"""A sample's time column (issue 38 §2): the data spec names the sample's date column
(``time_column``), the generated repository dates each sample row by it, and a
forecasting design's lag and rolling features read the real series, not rows spread over
days by their order."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.design.app import render_app
from keel.design.constraints import DataSpec
from keel.design.intake import intake_schema
from tests.design.codegen_cases import FORMS, request_from

COLUMNS = [
    {"name": "store", "type": "category", "categories": ["north", "south"]},
    {"name": "promo", "type": "boolean"},
    {"name": "sales", "type": "number"},
]


def sample(days: int = 40) -> str:
    """Two stores' daily sales from 2025-01-01, with a trend: the rows out of date order."""
    rows = []
    for i in range(days):
        day = date(2025, 1, 1) + timedelta(days=i)
        for store, level in (("north", 100.0), ("south", 60.0)):
            sales = level + 10 * math.sin(2 * math.pi * day.weekday() / 7) + i
            rows.append(f"{day.isoformat()},{store},{'true' if i % 5 == 0 else 'false'},{sales}")
    rows.reverse()
    return "day,store,promo,sales\n" + "\n".join(rows) + "\n"


def spec(**extra: object) -> dict[str, object]:
    return {"task": "forecasting", "target": "sales", "columns": COLUMNS, **extra}


def test_a_time_column_is_checked_against_the_sample() -> None:
    assert DataSpec.model_validate(spec(sample_csv=sample(), time_column="day")).time_column
    cases = [
        (spec(time_column="day"), "time_column names a column of sample_csv; there is none"),
        (
            spec(sample_csv=sample(), time_column="sales"),
            "time_column 'sales' is also a column",
        ),
        (
            spec(sample_csv=sample(), time_column="date"),
            "sample_csv header does not match the columns: missing date; not in the columns: day",
        ),
        (
            spec(sample_csv=sample().replace("2025-01-03", "03/01/2025"), time_column="day"),
            "day is '03/01/2025', not an ISO 8601 date or time",
        ),
    ]
    for data, message in cases:
        with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
            DataSpec.model_validate(data)
    # The model never writes the sample, nor its time column.
    props = intake_schema()["$defs"]["DataSpec"]["properties"]
    assert "time_column" not in props and "sample_csv" not in props


def test_the_sample_is_dated_by_its_time_column_and_lags_follow_it(tmp_path: Path) -> None:
    form = {**FORMS["empty_form"], "data": spec(sample_csv=sample(), time_column="day")}
    files = render_app(request_from(form, "sales-fc"))
    assert 'TIME_COLUMN = "day"' in files["services/common/sample.py"]
    for path, text in files.items():
        if path.startswith(("services/", "samples/")):
            target = tmp_path / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    # The generated code, in its own process (its package is also named services).
    script = """
import json
from datetime import date
from services.common.sample import sample_events
from services.feature.features import compute
events = [e for e in sample_events(start=date(2026, 3, 1), days=30) if e.event_id.startswith("s-")]
rows = compute(events, date(2026, 3, 10), date(2026, 3, 30))
out = {
    "days": sorted({e.day.isoformat() for e in events}),
    "rows": {e.event_id: [e.day.isoformat(), e.values["store"], e.values["sales"]] for e in events},
    "features": {k: [r["lag_1"], r["lag_7"], r["day_of_week"]] for k, r in rows.items()},
}
print(json.dumps(out))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    # The sample's last 30 days (2025-01-11 .. 2025-02-09) land on the window, in order.
    assert out["days"][0] == "2026-03-01" and out["days"][-1] == "2026-03-30"
    assert len(out["days"]) == 30
    by_day: dict[tuple[str, str], float] = {
        (day, store): sales for day, store, sales in out["rows"].values()
    }
    checked = 0
    for event_id, (lag_1, lag_7, _) in out["features"].items():
        if not event_id.startswith("s-"):
            continue
        day, store, _ = out["rows"][event_id]
        before = (date.fromisoformat(day) - timedelta(days=1)).isoformat()
        week = (date.fromisoformat(day) - timedelta(days=7)).isoformat()
        # One record per store and day: the lags are that store's sales 1 and 7 days before.
        assert lag_1 == pytest.approx(by_day[(before, store)])
        assert lag_7 == pytest.approx(by_day[(week, store)])
        checked += 1
    assert checked == 2 * 21
