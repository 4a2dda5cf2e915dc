"""One canonical form of an ast-grep action, so that the reward compares what an action
does, not how it is spelled.

The same rewrite can be written as JSON ``{"pattern", "rewrite", "language"}`` or as a
YAML rule (``id``, ``language``, ``rule: {pattern: …}``, ``fix``), with keys in any order,
any quoting and any metavariable names. :func:`canonical_action` keeps the parts that
carry meaning and drops the envelope:

* ``matcher``: the rule object as canonical JSON (sorted keys, no spaces); a
  :class:`~keel.srl.step.PatternAction`'s pattern ``P`` is the rule ``{"pattern": P}``;
* ``rewrite``: the pattern action's rewrite, or the rule's ``fix`` (a ``fix`` mapping
  gives its ``template``; its other keys, ``expandStart``/``expandEnd``, go to extras);
  ``None`` for a rule without a fix;
* ``extras``: ``constraints``, ``transform``, ``utils``, ``rewriters`` (and the fix's
  expansions) as canonical JSON, ``None`` when there are none.

``id``, ``language``, ``message``, ``severity``, ``note``, ``files``, ``metadata`` … are
envelope and left out. In every string, whitespace runs become one space (ends
stripped) and a space next to punctuation goes (``g( $A,\n $B )`` is ``g($A,$B)``);
metavariables are renamed by their order of first appearance, across the
matcher, then the rewrite, then the extras: ``$A`` → ``$1``, ``$$$ARGS`` → ``$$$2``,
``$$B`` → ``$$3``; a non-capturing one (``$_``, ``$_X``) becomes ``$_`` with its prefix.
The bare names that key ``constraints`` and ``transform`` are renamed with the same map.

:func:`text_similarity` is the mean ``difflib.SequenceMatcher`` ratio (``autojunk`` off)
of the parts present in either action (a part present in one only scores 0 for it:
a rule without ``fix`` is not a rewrite to the empty string).
Pure: no I/O.
"""

from __future__ import annotations

import difflib
import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict

from keel.srl.step import Language, PatternAction, RuleAction

# ast-grep metavariables: ``$NAME``, ``$$NAME`` (unnamed nodes too), ``$$$NAME`` (a list);
# a NAME is upper-case letters, digits and ``_``, not starting with a digit.
_METAVAR = re.compile(r"(?<![\w$])(\${1,3})([A-Z_][A-Z0-9_]*)")
_BARE_NAME = re.compile(r"[A-Z_][A-Z0-9_]*")
_WHITESPACE = re.compile(r"\s+")
_BY_PUNCTUATION = re.compile(r" ?([^\w\s$]) ?")
#: The top-level rule keys whose mapping is keyed by metavariable names (without ``$``).
_NAME_KEYED = ("constraints", "transform")
_EXTRA_KEYS = ("constraints", "transform", "utils", "rewriters")


class CanonicalAction(BaseModel):
    """The meaning-carrying parts of an action, canonically spelled (see the module)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    language: Language
    matcher: str
    rewrite: str | None = None
    extras: str | None = None

    def parts(self) -> tuple[str | None, str | None, str | None]:
        return (self.matcher, self.rewrite, self.extras)


def _squash(value: Any) -> Any:
    """In every string of a JSON value: whitespace runs collapsed to one space, and the
    space next to punctuation dropped (``g( $A,\n $B )`` is ``g($A,$B)``)."""
    if isinstance(value, str):
        return _BY_PUNCTUATION.sub(r"\1", _WHITESPACE.sub(" ", value).strip())
    if isinstance(value, list):
        return [_squash(v) for v in value]
    if isinstance(value, dict):
        return {k: _squash(v) for k, v in value.items()}
    return value


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _is_capturing(name: str) -> bool:
    return not name.startswith("_")


class _Renamer:
    """Metavariable names numbered by first appearance; non-capturing ones become ``_``."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def see(self, name: str) -> None:
        if _is_capturing(name) and name not in self.names:
            self.names[name] = str(len(self.names) + 1)

    def see_text(self, text: str) -> None:
        for m in _METAVAR.finditer(text):
            self.see(m.group(2))

    def name(self, name: str) -> str:
        return self.names.get(name, name) if _is_capturing(name) else "_"

    def text(self, text: str) -> str:
        return _METAVAR.sub(lambda m: m.group(1) + self.name(m.group(2)), text)

    def value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            return {k: self.value(v) for k, v in value.items()}
        return value


def _rule_parts(rule: dict[str, Any]) -> tuple[Any, str | None, dict[str, Any]]:
    fix = rule.get("fix")
    extras: dict[str, Any] = {k: rule[k] for k in _EXTRA_KEYS if rule.get(k) is not None}
    rewrite: str | None
    if isinstance(fix, dict):
        template = fix.get("template")
        rewrite = template if isinstance(template, str) else None
        expansions = {k: v for k, v in fix.items() if k != "template"}
        if expansions:
            extras["fix"] = expansions
    else:
        rewrite = fix if isinstance(fix, str) else None
    return rule.get("rule"), rewrite, extras


def canonical_action(action: PatternAction | RuleAction | CanonicalAction) -> CanonicalAction:
    """The canonical form of ``action`` (a canonical one is returned as it is)."""
    if isinstance(action, CanonicalAction):
        return action
    if isinstance(action, PatternAction):
        matcher: Any = {"pattern": action.pattern}
        rewrite: str | None = action.rewrite
        extras: dict[str, Any] = {}
    else:
        matcher, rewrite, extras = _rule_parts(action.rule)
    matcher, extras = _squash(matcher), _squash(extras)
    rewrite = None if rewrite is None else _squash(rewrite)

    names = _Renamer()
    names.see_text(_dump(matcher))
    if rewrite is not None:
        names.see_text(rewrite)
    for key in sorted(extras):
        body = extras[key]
        if key in _NAME_KEYED and isinstance(body, dict):
            for name in sorted(body, key=str):
                if _BARE_NAME.fullmatch(str(name)):
                    names.see(str(name))
        names.see_text(_dump(body))

    renamed_extras: dict[str, Any] = {}
    for key, body in extras.items():
        if key in _NAME_KEYED and isinstance(body, dict):
            body = {
                (names.name(k) if _BARE_NAME.fullmatch(str(k)) else k): v for k, v in body.items()
            }
        renamed_extras[key] = names.value(body)
    return CanonicalAction(
        language=action.language,
        matcher=_dump(names.value(matcher)),
        rewrite=None if rewrite is None else names.text(rewrite),
        extras=_dump(renamed_extras) if renamed_extras else None,
    )


def _ratio(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def text_similarity(
    action: PatternAction | RuleAction | CanonicalAction,
    expert: PatternAction | RuleAction | CanonicalAction,
) -> float:
    """Mean ``SequenceMatcher`` ratio, in [0, 1], over the canonical parts (matcher,
    rewrite, extras) present in either action; 1.0 exactly when the canonical parts are
    equal. ``autojunk`` is off: its heuristic ignores characters frequent in texts over
    200 chars, which would make the score depend on the length of the action."""
    a, b = canonical_action(action), canonical_action(expert)
    ratios = [
        0.0 if x is None or y is None else _ratio(x, y)
        for x, y in zip(a.parts(), b.parts(), strict=True)
        if x is not None or y is not None
    ]
    return sum(ratios) / len(ratios)
