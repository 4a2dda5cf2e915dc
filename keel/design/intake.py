"""Reading the intake model's reply (plan §21.1 node 1), strictly first, then field by field.

A reply that is the Constraint Schema is taken whole. One that is not is never an error:
:func:`read_reply` keeps every constraint field whose value validates on its own, drops
the rest and notes each dropped field in ``IntakeSnapshot.unfit`` with why, in words a user
can read; the coverage check then asks about those fields as it asks about missing ones.
The problems, quoted as validation gave them, go into :func:`recovery_prompt`, the message
of the one re-ask the intake activity makes before it settles for what fits.

Pure: no I/O, so it is unit tested on its own and runs the same wherever it is called.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keel.design.constraints import FIELD_NAMES, Constraints
from keel.design.coverage import IntakeSnapshot
from keel.problems import where

#: How much of a bad reply the re-ask quotes back to the model.
MAX_QUOTED_REPLY_CHARS = 2000
#: How many problems the re-ask lists (a garbage reply can have hundreds).
MAX_PROBLEMS = 12
#: How long one problem or one ``unfit`` reason may be.
MAX_PROBLEM_CHARS = 300


class IntakeReply(BaseModel):
    """What the intake model is asked for: the JSON Schema sent with the request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    constraints: Constraints = Field(default_factory=Constraints)
    ambiguous: dict[str, str] = Field(default_factory=dict)


def intake_schema() -> dict[str, Any]:
    """The JSON Schema the intake request carries (``LLMRequest.json_schema``).

    The data spec's CSV sample and its time column are left out (a sample is the user's
    file, never the model's writing) and so is its bound on columns: a server that constrains the reply
    by grammar (llama.cpp, the embedded model) spells every repetition of a bound out,
    and ``maxLength`` 200,000 killed the embedded model's server on its first intake.
    The reply is still validated against :class:`IntakeReply`, bounds included."""
    schema = IntakeReply.model_json_schema()
    data = schema.get("$defs", {}).get("DataSpec", {}).get("properties", {})
    data.pop("sample_csv", None)
    data.pop("time_column", None)  # a column of the sample, so the user's too
    data.get("columns", {}).pop("maxItems", None)
    return schema


class ReplyReading(BaseModel):
    """One reply read: what fits (and, in ``snapshot.unfit``, what did not), and the
    problems a re-ask quotes. ``fits``: the reply was the schema as it stood."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    snapshot: IntakeSnapshot
    fits: bool
    problems: list[str] = Field(default_factory=list)


def read_reply(content: str) -> ReplyReading:
    """The reply as a snapshot; never raises, however malformed the reply."""
    try:
        reply = IntakeReply.model_validate(json.loads(content))
    except ValidationError as exc:
        return _salvage(content, _problems(exc))
    # RecursionError: a reply nested deeper than the parser's stack is no schema either.
    except (ValueError, RecursionError) as exc:
        return _salvage(content, [_cut(f"the reply is not JSON: {exc}")])
    snapshot = IntakeSnapshot(constraints=reply.constraints, ambiguous=_known(reply.ambiguous))
    return ReplyReading(snapshot=snapshot, fits=True)


def merge_readings(first: ReplyReading, second: ReplyReading) -> IntakeSnapshot:
    """The re-ask's reading over the first one's: a field the second reply states validly
    wins; one only the first stated validly is kept; a field either reply got wrong stays
    ``unfit`` unless the second reply stated it validly."""
    one, two = first.snapshot, second.snapshot
    kept_one = _stated(one.constraints)
    kept_two = _stated(two.constraints)
    merged = {**kept_one, **kept_two}
    fixed = {f for f in kept_two if f not in two.unfit}
    unfit = {f: why for f, why in {**one.unfit, **two.unfit}.items() if f not in fixed}
    return IntakeSnapshot(
        constraints=Constraints.model_validate(merged),
        ambiguous={**one.ambiguous, **two.ambiguous},
        unfit=unfit,
    )


def recovery_prompt(problems: list[str]) -> str:
    """The re-ask's message after a reply that is not the schema (the form of
    ``keel.rllm.render.DEFAULT_RECOVERY_TEMPLATE``, with the schema's field list in the
    system prompt rather than the schema itself: a small model's context is short)."""
    listed = "\n".join(f"- {p}" for p in problems[:MAX_PROBLEMS]) or "- (none given)"
    return (
        "Your previous answer could not be used. Problems found in it:\n"
        f"{listed}\n\n"
        'Answer again with only one JSON object, and nothing else: {"constraints": {...}, '
        '"ambiguous": {...}}, using only the field names and values the instructions list. '
        "Leave out a field you cannot state in that form, or name it under "
        '"ambiguous" with why.'
    )


def quoted_reply(content: str) -> str:
    """The bad reply as the re-ask quotes it back (cut to a bounded size)."""
    if len(content) <= MAX_QUOTED_REPLY_CHARS:
        return content
    return content[:MAX_QUOTED_REPLY_CHARS] + " ...(cut)"


# --- field by field --------------------------------------------------------------------


def _salvage(content: str, problems: list[str]) -> ReplyReading:
    obj = _loads_lenient(content)
    kept: dict[str, Any] = {}
    unfit: dict[str, str] = {}
    ambiguous: dict[str, str] = {}
    if isinstance(obj, dict):
        raw = obj.get("constraints")
        if not isinstance(raw, dict):
            # A small model may give the fields at the top level, without the wrapper.
            raw = {k: v for k, v in obj.items() if k in FIELD_NAMES}
        for field, value in raw.items():
            if field not in FIELD_NAMES or value is None:
                continue
            good, why = _field_value(field, value)
            if good is not None:
                kept[field] = good
            if why is not None:
                unfit[field] = _cut(why)
        amb = obj.get("ambiguous")
        if isinstance(amb, dict):
            ambiguous = _known({str(k): v for k, v in amb.items() if isinstance(v, str | int)})
    # Each kept value validated alone and no validator looks across fields: this holds.
    snapshot = IntakeSnapshot(
        constraints=Constraints.model_validate(kept),
        ambiguous={f: str(v) for f, v in ambiguous.items() if f not in unfit},
        unfit=unfit,
    )
    return ReplyReading(snapshot=snapshot, fits=False, problems=problems[:MAX_PROBLEMS])


def _field_value(field: str, value: Any) -> tuple[Any, str | None]:
    """(the value to keep or None, why it did not fit or None) for one field. A list keeps
    its items that fit; an object (throughput, team) keeps its parts that fit."""
    error = _check(field, value)
    if error is None:
        return value, None
    # Forms a small model often writes for a value that is otherwise right: an enum in
    # capitals ("GDPR"), one item where a list is asked ("regions": "eu-west-1").
    for alt in _variants(field, value):
        if _check(field, alt) is None:
            return alt, None
    if isinstance(value, list):
        value = [_lower(item) if _check(field, [_lower(item)]) is None else item for item in value]
        good = [item for item in value if _check(field, [item]) is None]
        bad = [item for item in value if _check(field, [item]) is not None]
        why = f"the model read {_show(bad)}, which does not fit: {_check(field, bad) or error}"
        return (good or None), why
    if isinstance(value, dict):
        parts = {k: v for k, v in value.items() if _check(field, {k: v}) is None}
        return (parts or None), f"the model read {_show(value)}, which does not fit: {error}"
    return None, f"the model read {_show(value)}, which does not fit: {error}"


def _variants(field: str, value: Any) -> list[Any]:
    out: list[Any] = []
    if isinstance(value, str):
        out.append(_lower(value))
        if field in _LIST_FIELDS:
            out += [[value], [_lower(value)]]
    elif isinstance(value, list):
        out.append([_lower(v) for v in value])
    return out


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


_LIST_FIELDS = frozenset(f for f in FIELD_NAMES if isinstance(getattr(Constraints(), f), list))


def _check(field: str, value: Any) -> str | None:
    """Why ``{field: value}`` is not the schema (validation's own words), or None."""
    try:
        Constraints.model_validate({field: value})
    except ValidationError as exc:
        return "; ".join(e["msg"] for e in exc.errors(include_url=False))
    return None


def _problems(exc: ValidationError) -> list[str]:
    """Validation's errors as ``where: what (got value)`` lines."""
    out = []
    for e in exc.errors(include_url=False):
        got = f" (got {_show(e['input'])})" if e["type"] != "missing" else ""
        out.append(_cut(f"{where(e['loc'], '(the reply)')}: {e['msg']}{got}"))
    return out


def _loads_lenient(content: str) -> Any:
    """JSON out of a reply that may be wrapped in prose or fences, or cut off at the
    token limit (closed here at the last complete member); None if there is none."""
    text = content.strip()
    start = text.find("{")
    if start < 0:
        return None
    text = text[start:]
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    end = text.rfind("}")
    if end > 0:
        try:
            return json.loads(text[: end + 1])
        except (ValueError, RecursionError):
            pass
    for candidate in _closings(text):
        try:
            return json.loads(candidate)
        except (ValueError, RecursionError):
            continue
    return None


def _closings(text: str, most: int = 64) -> list[str]:
    """Cut-off JSON closed at each member boundary, latest first: the text up to a comma
    (outside strings) with the brackets then open closed."""
    stack: list[str] = []
    in_string = escaped = False
    cuts: deque[tuple[int, str]] = deque(maxlen=most)
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if stack:
                stack.pop()
        elif ch == "," and stack:
            cuts.append((i, "".join(reversed(stack))))
    return [text[:i] + closers for i, closers in reversed(cuts)]


def _stated(c: Constraints) -> dict[str, Any]:
    dumped = c.model_dump(mode="json", exclude_defaults=True)
    return {f: v for f, v in dumped.items() if v not in (None, [], {})}


def _known(ambiguous: dict[str, Any]) -> dict[str, str]:
    return {f: _cut(str(v)) for f, v in ambiguous.items() if f in FIELD_NAMES}


def _show(value: Any) -> str:
    try:
        shown = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


def _cut(text: str) -> str:
    return text if len(text) <= MAX_PROBLEM_CHARS else text[: MAX_PROBLEM_CHARS - 3] + "..."
