"""Score the reduced value by rules: the score is passed rules / all rules, in Decimal.

A rule is ``{"path": "totals.words", "op": ">=", "value": 1}``. ``path`` is dotted (list
indexes as numbers); ``op`` is one of ``== != > >= < <=`` (numbers compared as Decimal,
anything else as JSON), ``exists``, ``nonempty`` (a non-empty string, list or object) or
``in`` (``value`` is a list). Each failed rule gives a reason naming it.
"""

from __future__ import annotations

import decimal
from decimal import Decimal

from pydantic import JsonValue

from keel.digest import canonical_json
from keel.mrp.normalize import decimal_context, to_decimal
from keel.mrp.sdk import Evaluation, EvaluatorBase, OperatorContext

_MISSING = object()


def lookup(value: JsonValue, path: str) -> object:
    """The value at a dotted path, or a sentinel when absent."""
    current: object = value
    for part in path.split(".") if path else []:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _as_decimal(v: object) -> Decimal | None:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        return None
    try:
        return to_decimal(v)
    except (ValueError, TypeError, decimal.InvalidOperation):
        return None


def check(actual: object, op: str, expected: JsonValue) -> bool:
    """Whether one rule holds."""
    if op == "exists":
        return actual is not _MISSING
    if actual is _MISSING:
        return False
    if op == "nonempty":
        return isinstance(actual, str | list | dict) and len(actual) > 0
    if op == "in":
        return isinstance(expected, list) and any(
            canonical_json(actual) == canonical_json(e) for e in expected
        )
    a, e = _as_decimal(actual), _as_decimal(expected)
    if a is not None and e is not None:
        ordering = (a > e) - (a < e)
    elif op in ("==", "!="):
        ordering = 0 if canonical_json(actual) == canonical_json(expected) else 1
    else:
        return False
    return {
        "==": ordering == 0,
        "!=": ordering != 0,
        ">": ordering > 0,
        ">=": ordering >= 0,
        "<": ordering < 0,
        "<=": ordering <= 0,
    }[op]


class RulesCheck(EvaluatorBase):
    """Score = passed / total (1 when there are no rules)."""

    def evaluate(self, reduced: JsonValue, ctx: OperatorContext) -> Evaluation:
        rules = ctx.params.get("rules") or []
        assert isinstance(rules, list)
        reasons: list[str] = []
        passed = 0
        for i, rule in enumerate(rules):
            assert isinstance(rule, dict)
            path, op = str(rule["path"]), str(rule["op"])
            expected = rule.get("value")
            actual = lookup(reduced, path)
            if check(actual, op, expected):
                passed += 1
            else:
                shown = "missing" if actual is _MISSING else canonical_json(actual).decode()
                wanted = (
                    "" if op in ("exists", "nonempty") else " " + canonical_json(expected).decode()
                )
                name = rule.get("name") or f"rule {i}"
                reasons.append(f"{name}: {path} {op}{wanted} failed (got {shown})")
        if not rules:
            return Evaluation(score=Decimal(1), reasons=["no rules"])
        score = decimal_context().divide(Decimal(passed), Decimal(len(rules)))
        if not reasons:
            reasons.append(f"all {len(rules)} rules passed")
        return Evaluation(score=score, reasons=reasons)
