"""Workload quantities for the cost estimate (issue 24 §2): formulas as data.

A bill-of-materials line's quantity is a small arithmetic expression over named values
(``data_gb_per_day * retention_days``), written in ``configs/design/patterns.yaml`` and
shown, with its numbers filled in, in ``reports/cost.json``. The names are:

* **inputs**, read from the Constraint Schema (a dotted field path) or, when the form
  does not state them, a default that the estimate marks as assumed;
* **switches**, inputs read from a yes/no field of the Constraint Schema (1 when it is
  true, 0 when it is false or unset): a BOM line whose formula uses a switch that is
  off is left out of the bill (``account_baseline``: the account-wide AWS Config and
  Macie lines only for a deployment that owns the account's baseline, issue 38 §3);
* **parameters**, fixed positive assumptions (a shard's capacity, hours in a month);
* **derived** values, expressions over the names defined before them.

Expressions are parsed with :mod:`ast` and only numbers, names, ``+``, ``*``, ``/``,
parentheses and ``min``, ``max``, ``ceil`` are accepted: no subtraction, no unary minus,
no attribute access or other calls. Over non-negative inputs every such expression is
non-negative, and one that only divides by parameters never decreases when an input
grows; a division by an input is allowed (``sla_latency_ms`` is at least 1) and checked
at evaluation. A result that is not a finite number raises :class:`FormulaError`.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from keel.design.constraints import Constraints

MAX_FORMULA_CHARS = 500
FUNCTIONS: dict[str, Any] = {"min": min, "max": max, "ceil": math.ceil}
# Printed as the multiplication and division signs (U+00D7, U+00F7) for reviewers.
_OPS: dict[type[ast.operator], str] = {ast.Add: "+", ast.Mult: "\u00d7", ast.Div: "\u00f7"}
# Python's precedence for the accepted operators, to print parentheses where needed.
_PREC: dict[type[ast.operator], int] = {ast.Add: 1, ast.Mult: 2, ast.Div: 2}


class FormulaError(ValueError):
    """A formula that does not parse, names an unknown value, or has no finite value."""


def parse_formula(text: str) -> ast.expr:
    """Parse ``text`` and refuse anything but the accepted arithmetic."""
    if not text.strip():
        raise FormulaError("empty formula")
    if len(text) > MAX_FORMULA_CHARS:
        raise FormulaError(f"formula longer than {MAX_FORMULA_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise FormulaError(f"does not parse: {exc.msg}") from None
    _check(tree.body)
    return tree.body


def _check(node: ast.expr) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(f"not a number: {node.value!r}")
        if not math.isfinite(node.value) or node.value < 0:
            raise FormulaError(f"not a finite non-negative number: {node.value!r}")
        return
    if isinstance(node, ast.Name):
        return
    if isinstance(node, ast.BinOp):
        if type(node.op) not in _OPS:
            raise FormulaError(f"operator {type(node.op).__name__} is not allowed")
        _check(node.left)
        _check(node.right)
        return
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise FormulaError(f"only {', '.join(FUNCTIONS)} may be called")
        if node.keywords or not node.args:
            raise FormulaError(f"{node.func.id}() takes positional arguments only")
        if node.func.id == "ceil" and len(node.args) != 1:
            raise FormulaError("ceil() takes one argument")
        for arg in node.args:
            _check(arg)
        return
    raise FormulaError(f"{type(node).__name__} is not allowed in a formula")


def formula_names(text: str) -> list[str]:
    """The value names ``text`` uses, in reading order, each once (functions left out)."""
    names: list[str] = []

    def walk(node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            if node.id not in names:
                names.append(node.id)
        elif isinstance(node, ast.BinOp):
            walk(node.left)
            walk(node.right)
        elif isinstance(node, ast.Call):
            for arg in node.args:
                walk(arg)

    walk(parse_formula(text))
    return names


def _number(node: ast.Constant) -> float:
    if isinstance(node.value, bool) or not isinstance(node.value, int | float):
        raise FormulaError(f"not a number: {node.value!r}")
    return float(node.value)


def _eval(node: ast.expr, env: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return _number(node)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise FormulaError(f"unknown name {node.id!r}")
        return float(env[node.id])
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, env), _eval(node.right, env)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Mult):
            return left * right
        if right == 0:
            raise FormulaError("division by zero")
        return left / right
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        args = [_eval(a, env) for a in node.args]
        if node.func.id == "ceil":
            if not math.isfinite(args[0]):
                raise FormulaError("ceil of a non-finite value")
            return float(math.ceil(args[0]))
        return float(FUNCTIONS[node.func.id](args))
    raise FormulaError(f"{type(node).__name__} is not allowed in a formula")  # pragma: no cover


def evaluate(text: str, env: Mapping[str, float]) -> float:
    """The value of ``text`` with the names in ``env``; finite and non-negative."""
    value = _eval(parse_formula(text), env)
    if not math.isfinite(value):
        raise FormulaError(f"{text!r} is not finite")
    return value


def fmt_number(value: float) -> str:
    """A number as a reviewer reads it: thousands separated, at most 6 significant
    decimals, no exponent."""
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    text = f"{Decimal(repr(value)):,.6f}".rstrip("0").rstrip(".")
    return text if text not in ("", "-0", "0") or value == 0 else f"{value:.3g}"


def _render(node: ast.expr, env: Mapping[str, float] | None, parent: int = 0) -> str:
    if isinstance(node, ast.Constant):
        return fmt_number(_number(node))
    if isinstance(node, ast.Name):
        return node.id if env is None else fmt_number(float(env[node.id]))
    if isinstance(node, ast.BinOp):
        prec = _PREC[type(node.op)]
        left = _render(node.left, env, prec)
        # The right operand of / binds tighter (a / (b * c) keeps its parentheses).
        right = _render(node.right, env, prec + (0 if isinstance(node.op, ast.Add) else 1))
        text = f"{left} {_OPS[type(node.op)]} {right}"
        return f"({text})" if prec < parent else text
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return f"{node.func.id}({', '.join(_render(a, env) for a in node.args)})"
    raise FormulaError(f"{type(node).__name__} is not allowed in a formula")  # pragma: no cover


def render(text: str, env: Mapping[str, float] | None = None) -> str:
    """``text`` with the multiplication and division signs; with ``env``, each name
    replaced by its value."""
    return _render(parse_formula(text), env)


class WorkloadInput(BaseModel):
    """A value read from the Constraint Schema (``field``, a dotted path) or defaulted."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    field: str = Field(min_length=1)
    default: float = Field(ge=0)
    unit: str = ""
    note: str = ""


class WorkloadParameter(BaseModel):
    """A fixed assumption, positive so it can divide."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(gt=0)
    unit: str = ""
    note: str = ""


class WorkloadDerived(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    formula: str = Field(min_length=1)
    unit: str = ""
    note: str = ""


class WorkloadSpec(BaseModel):
    """The named values BOM formulas may use (``workload:`` in patterns.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    inputs: dict[str, WorkloadInput] = Field(default_factory=dict)
    parameters: dict[str, WorkloadParameter] = Field(default_factory=dict)
    derived: dict[str, WorkloadDerived] = Field(default_factory=dict)

    def names(self) -> list[str]:
        return [*self.inputs, *self.parameters, *self.derived]

    def problems(self) -> list[tuple[str, str]]:
        """``(name, message)`` for each bad definition: a name defined twice, a derived
        formula that does not parse or uses a name not defined before it, an input whose
        field is not in the Constraint Schema."""
        out: list[tuple[str, str]] = []
        seen: set[str] = set()
        for name in self.names():
            if name in seen:
                out.append((name, "defined more than once"))
            if not name.isidentifier() or name in FUNCTIONS:
                out.append((name, "not a usable name"))
            seen.add(name)
        for name, inp in self.inputs.items():
            try:
                _check_path(inp.field)
            except FormulaError as exc:
                out.append((name, str(exc)))
        known = {*self.inputs, *self.parameters}
        for name, d in self.derived.items():
            try:
                unknown = [n for n in formula_names(d.formula) if n not in known]
            except FormulaError as exc:
                out.append((name, str(exc)))
            else:
                if unknown:
                    out.append((name, f"uses {', '.join(unknown)} before it is defined"))
            known.add(name)
        return out


def _check_path(path: str) -> None:
    """Refuse ``path`` unless it names a number, a yes/no or a list field of the
    Constraint Schema."""
    model: type[BaseModel] = Constraints
    parts = path.split(".")
    for i, part in enumerate(parts):
        where = ".".join(parts[: i + 1])
        if part not in model.model_fields:
            raise FormulaError(f"{where} is not a constraint field")
        annotation = model.model_fields[part].annotation
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        if get_origin(annotation) is list or not kinds:
            kinds = [annotation]
        target = kinds[0] if len(kinds) == 1 else None
        if i < len(parts) - 1:
            if not (isinstance(target, type) and issubclass(target, BaseModel)):
                raise FormulaError(f"{where} has no fields")
            model = target
        elif not (get_origin(target) is list or target in (int, float, bool)):
            raise FormulaError(f"{path} is not a number")


def _is_switch(path: str) -> bool:
    """Whether ``path`` (already checked) names a yes/no field of the Constraint Schema."""
    model: Any = Constraints
    annotation: Any = None
    for part in path.split("."):
        annotation = model.model_fields[part].annotation
        kinds = [a for a in get_args(annotation) if a is not type(None)] or [annotation]
        model = kinds[0]
    return model is bool


def _resolve(constraints: Constraints, path: str) -> float | None:
    """A number from ``constraints`` at ``path``; a list gives its length (0 as None)."""
    value: Any = constraints
    for i, part in enumerate(path.split(".")):
        if value is None:
            return None
        fields = type(value).model_fields if isinstance(value, BaseModel) else {}
        if part not in fields:
            raise FormulaError(f"{'.'.join(path.split('.')[: i + 1])} is not a constraint field")
        value = getattr(value, part)
    if value is None:
        return None
    if isinstance(value, list):
        return float(len(value)) or None
    if isinstance(value, BaseModel):
        raise FormulaError(f"{path} is not a number")
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if not isinstance(value, int | float):
        raise FormulaError(f"{path} is not a number")
    return float(value)


class WorkloadValue(BaseModel):
    """One named value as the estimate used it, for ``cost.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    value: float
    unit: str = ""
    source: str = Field(description="stated | default | switch | parameter | derived")
    detail: str = ""
    # A derived value's formula as written and the inputs it follows from (transitively).
    formula: str = ""
    depends_on: list[str] = Field(default_factory=list)


class Workload(BaseModel):
    """Every named value of one estimate, in definition order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    values: list[WorkloadValue] = Field(default_factory=list)

    def env(self) -> dict[str, float]:
        return {v.name: v.value for v in self.values}

    def depends_on(self, formula: str) -> list[str]:
        """The workload inputs ``formula`` follows from, through derived values, in
        definition order (parameters are fixed, so never listed)."""
        by_name = {v.name: v for v in self.values}
        found: set[str] = set()
        for name in formula_names(formula):
            v = by_name.get(name)
            if v is None:
                continue
            if v.source in ("stated", "default", "switch"):
                found.add(name)
            found.update(v.depends_on)
        return [v.name for v in self.values if v.name in found]

    def explain(self, formula: str, quantity: float, unit: str) -> str:
        """``formula = numbers = quantity unit``, a bare derived name shown by its own
        formula (``stored_gb = data_gb_per_day * retention_days = 50 * 30 = 1,500 GB``,
        printed with the multiplication sign);
        a formula of parameters alone is marked fixed."""
        env = self.env()
        total = f"{fmt_number(quantity)} {unit}".strip()
        names = formula_names(formula)
        by_name = {v.name: v for v in self.values}
        steps = [render(formula)]
        if len(names) == 1 and formula.strip() == names[0] and by_name[names[0]].formula:
            inner = by_name[names[0]].formula
            steps += [render(inner), render(inner, env)]
        else:
            steps.append(render(formula, env))
        shown = " = ".join(dict.fromkeys(steps)) + f" = {total}"
        if not self.depends_on(formula):
            shown += " (fixed: no workload input)"
        return shown

    def switched_off(self, formula: str) -> list[str]:
        """The switches ``formula`` uses that are off (a line with one is not billed)."""
        by_name = {v.name: v for v in self.values}
        return [
            n
            for n in formula_names(formula)
            if n in by_name and by_name[n].source == "switch" and by_name[n].value == 0
        ]

    @property
    def assumed(self) -> list[WorkloadValue]:
        """The inputs the form did not state, priced at their default."""
        return [v for v in self.values if v.source == "default"]


def compute_workload(spec: WorkloadSpec, constraints: Constraints) -> Workload:
    """Read the inputs from ``constraints`` (defaults where unstated), then the
    parameters, then each derived value in order."""
    values: list[WorkloadValue] = []
    env: dict[str, float] = {}
    for name, inp in spec.inputs.items():
        stated = _resolve(constraints, inp.field)
        value = inp.default if stated is None else stated
        if _is_switch(inp.field):
            # Unset is the field's own "no" (the default), not an assumption to flag.
            values.append(
                WorkloadValue(
                    name=name,
                    value=value,
                    source="switch",
                    detail=f"{inp.field} {'on' if value else 'off'}"
                    + (" (unset)" if stated is None else "")
                    + (f" ({inp.note})" if inp.note else ""),
                )
            )
            env[name] = value
            continue
        values.append(
            WorkloadValue(
                name=name,
                value=value,
                unit=inp.unit,
                source="default" if stated is None else "stated",
                detail=(f"{inp.field} not stated; assumed" if stated is None else inp.field)
                + (f" ({inp.note})" if inp.note else ""),
            )
        )
        env[name] = value
    for name, par in spec.parameters.items():
        values.append(
            WorkloadValue(
                name=name, value=par.value, unit=par.unit, source="parameter", detail=par.note
            )
        )
        env[name] = par.value
    for name, d in spec.derived.items():
        value = evaluate(d.formula, env)
        env[name] = value
        depends = Workload(values=values).depends_on(d.formula)
        values.append(
            WorkloadValue(
                name=name,
                value=value,
                unit=d.unit,
                source="derived",
                detail=f"{name} = {render(d.formula)} = {render(d.formula, env)}"
                + (f" ({d.note})" if d.note else ""),
                formula=d.formula,
                depends_on=depends,
            )
        )
    return Workload(values=values)
