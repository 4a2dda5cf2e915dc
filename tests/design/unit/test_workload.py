"""The formula language of workload-sized quantities (keel/design/workload.py)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from keel.design.constraints import parse_constraints
from keel.design.workload import (
    FormulaError,
    WorkloadSpec,
    compute_workload,
    evaluate,
    fmt_number,
    formula_names,
    parse_formula,
    render,
)

ENV = {"data_gb_per_day": 50.0, "retention_days": 30.0, "rate": 0.0, "k": 4.0}


def test_accepts_arithmetic_names_and_the_three_functions() -> None:
    text = "max(1, ceil(data_gb_per_day * retention_days / k)) + min(rate, 2.5)"
    assert evaluate(text, ENV) == 375 + 0
    assert formula_names(text) == ["data_gb_per_day", "retention_days", "k", "rate"]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "a - b",  # no subtraction: a formula never shrinks as an input grows
        "-a",
        "a ** 2",
        "a % 2",
        "a // 2",
        "a.b",
        "a[0]",
        "__import__('os')",
        "abs(a)",
        "max(a, key=b)",
        "max()",
        "ceil(a, b)",
        "'text'",
        "True",
        "1e999",  # parses to inf
        "a if a else b",
        "a < b",
        "lambda: 1",
        "(a, b)",
        "a +",
        "x" * 501,
    ],
)
def test_refuses_everything_else(text: str) -> None:
    with pytest.raises(FormulaError):
        parse_formula(text)


def test_division_by_zero_and_unknown_names_raise() -> None:
    with pytest.raises(FormulaError, match="division by zero"):
        evaluate("data_gb_per_day / rate", ENV)
    with pytest.raises(FormulaError, match="unknown name 'nope'"):
        evaluate("nope * 2", ENV)
    with pytest.raises(FormulaError, match="not finite"):
        evaluate("k * 1e308 * 1e308", ENV)


def test_render_shows_the_formula_and_its_numbers() -> None:
    text = "data_gb_per_day * retention_days"
    assert render(text) == "data_gb_per_day \u00d7 retention_days"
    assert render(text, ENV) == "50 \u00d7 30"
    # Parentheses stay where the value needs them, and only there.
    assert render("(a + b) * c / (d * e)") == "(a + b) \u00d7 c \u00f7 (d \u00d7 e)"
    assert render("a + b * c") == "a + b \u00d7 c"


def test_numbers_read_plainly() -> None:
    assert fmt_number(1500.0) == "1,500"
    assert fmt_number(0.5) == "0.5"
    assert fmt_number(1520.835) == "1,520.835"
    assert fmt_number(0.0) == "0"
    assert fmt_number(1e-9) == "1e-09"


SPEC = WorkloadSpec.model_validate(
    {
        "inputs": {
            "gb": {"field": "throughput.data_gb_per_day", "default": 10, "unit": "GB/day"},
            "days": {"field": "retention_days", "default": 30},
            "regions": {"field": "regions", "default": 1},
        },
        "parameters": {"per_file": {"value": 2}},
        "derived": {
            "stored": {"formula": "gb * days"},
            "files": {"formula": "stored / per_file / regions"},
        },
    }
)


def test_inputs_come_from_the_constraints_or_are_marked_assumed() -> None:
    c = parse_constraints({"throughput": {"data_gb_per_day": 50}, "regions": ["eu-west-1"]})
    w = compute_workload(SPEC, c)
    by = {v.name: v for v in w.values}
    assert (by["gb"].value, by["gb"].source) == (50, "stated")
    assert (by["days"].value, by["days"].source) == (30, "default")
    assert [v.name for v in w.assumed] == ["days"]
    assert by["regions"].value == 1 and by["regions"].source == "stated"
    assert by["stored"].detail == "stored = gb \u00d7 days = 50 \u00d7 30"
    assert by["files"].value == 750
    assert by["files"].depends_on == ["gb", "days", "regions"]
    assert w.depends_on("per_file * 3") == []
    assert w.explain("stored", 1500, "GB") == ("stored = gb \u00d7 days = 50 \u00d7 30 = 1,500 GB")
    assert w.explain("per_file", 2, "GB").endswith("(fixed: no workload input)")
    # No region stated is one region-agnostic copy.
    assert compute_workload(SPEC, parse_constraints({})).env()["regions"] == 1


def test_spec_problems_name_the_definition() -> None:
    bad = WorkloadSpec.model_validate(
        {
            "inputs": {"x": {"field": "throughput.nope", "default": 1}},
            "parameters": {"max": {"value": 1}},
            "derived": {"a": {"formula": "b * 2"}, "b": {"formula": "x -"}},
        }
    )
    problems = dict(bad.problems())
    assert "throughput.nope is not a constraint field" in problems["x"]
    assert problems["max"] == "not a usable name"
    assert "uses b before it is defined" in problems["a"]
    assert "does not parse" in problems["b"]
    cloud = WorkloadSpec.model_validate({"inputs": {"c": {"field": "cloud", "default": 1}}})
    assert "cloud is not a number" in dict(cloud.problems())["c"]


_names = st.sampled_from(["a", "b", "c"])
_leaf = st.one_of(_names, st.integers(0, 1000).map(str), st.sampled_from(["0.5", "2.25"]))


def _combine(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    binary = st.tuples(children, st.sampled_from(["+", "*"]), children).map(
        lambda t: f"({t[0]} {t[1]} {t[2]})"
    )
    divided = st.tuples(children, st.sampled_from(["2", "0.5", "7"])).map(
        lambda t: f"({t[0]} / {t[1]})"
    )
    call = st.tuples(st.sampled_from(["min", "max"]), children, children).map(
        lambda t: f"{t[0]}({t[1]}, {t[2]})"
    )
    return st.one_of(binary, divided, call, children.map(lambda x: f"ceil({x})"))


formulas = st.recursive(_leaf, _combine, max_leaves=12)
values = st.floats(0, 1e6, allow_nan=False)


@given(formulas, values, values, values, st.floats(1, 100))
def test_any_formula_is_non_negative_and_never_falls_as_an_input_grows(
    text: str, a: float, b: float, c: float, k: float
) -> None:
    """Without subtraction, and dividing only by positive constants, every formula is
    monotone non-decreasing in each name: the grounds of the cost property tests."""
    low = evaluate(text, {"a": a, "b": b, "c": c})
    high = evaluate(text, {"a": a * k, "b": b, "c": c})
    assert low >= 0 and math.isfinite(low)
    assert high >= low


SWITCHED = WorkloadSpec.model_validate(
    {
        "inputs": {
            "baseline": {"field": "account_baseline", "default": 0, "note": "a switch"},
            "gb": {"field": "throughput.data_gb_per_day", "default": 10},
        },
        "parameters": {"items": {"value": 1000}},
    }
)


@pytest.mark.parametrize(
    ("form", "value", "detail"),
    [
        ({}, 0, "account_baseline off (unset) (a switch)"),
        ({"account_baseline": False}, 0, "account_baseline off (a switch)"),
        ({"account_baseline": True}, 1, "account_baseline on (a switch)"),
    ],
)
def test_a_yes_no_field_is_a_switch_never_an_assumption(
    form: dict[str, bool], value: int, detail: str
) -> None:
    assert SWITCHED.problems() == []
    w = compute_workload(SWITCHED, parse_constraints(form))
    by = {v.name: v for v in w.values}
    assert (by["baseline"].value, by["baseline"].source) == (value, "switch")
    assert by["baseline"].detail == detail
    assert [v.name for v in w.assumed] == ["gb"]
    assert w.depends_on("items * baseline") == ["baseline"]
    assert w.switched_off("items * baseline") == ([] if value else ["baseline"])
    assert w.switched_off("items * gb") == []
    assert evaluate("items * baseline", w.env()) == 1000 * value
