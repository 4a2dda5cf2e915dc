"""Task instructions state intent, never the gold rule.

An instruction says what to change and why, as a person would ask: it may quote the code
to change and name the new name, but it must not hand the model the answer it is scored
against. :func:`instruction_leaks` lists how an instruction gives the gold action away:

* a metavariable token (``$A``, ``$$$ARGS``, ``$_``: ``$`` once to three times, then an
  upper-case letter or ``_``): only an ast-grep pattern or rewrite template has one;
* the gold action's pattern, or its rewrite template, inside the instruction (whitespace
  runs collapsed on both sides), unless it is plain code the instruction may quote: a
  single name (``calculate``: a new name) or, for the pattern, code that is in the file
  before the change (``obj.close()``: the code to change);
* rule text: a YAML or JSON key of an ast-grep rule (``rule:``, ``fix:``,
  ``"pattern":`` …) at the start of a line or as a JSON key.

``SrlTask`` (keel/srl/steps.py) refuses a task whose instruction leaks its gold action or
an expert step's action; ``keel.srl.synth`` refuses to make one. A task without an expert
action (a dataset record's) has nothing to leak and is not checked. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: An ast-grep metavariable token (``$A``, ``$$B``, ``$$$ARGS``, ``$_``, ``$_X``).
METAVARIABLE = re.compile(r"(?<![\w$])\${1,3}[A-Z_][A-Z0-9_]*(?![a-z0-9])")
_NAME = re.compile(r"[A-Za-z_$][\w$]*(\.[A-Za-z_$][\w$]*)*")
_WHITESPACE = re.compile(r"\s+")
_RULE_KEY = re.compile(
    r"(?m)(^\s*-?\s*(id|rule|fix|pattern|rewrite|constraints|transform|rewriters|utils)\s*:)"
    r'|("(pattern|rewrite|rule|fix)"\s*:)'
)


def _squash(text: str) -> str:
    return _WHITESPACE.sub(" ", text).strip()


def _rule_strings(rule: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The patterns (anywhere in the rule object) and the fix template of a YAML rule."""
    patterns: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key == "pattern" and isinstance(item, str):
                    patterns.append(item)
                elif key == "pattern" and isinstance(item, dict):
                    context = item.get("context")
                    if isinstance(context, str):
                        patterns.append(context)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(rule.get("rule"))
    fix = rule.get("fix")
    if isinstance(fix, dict):
        fix = fix.get("template")
    return patterns, [fix] if isinstance(fix, str) else []


def action_texts(action: Any) -> tuple[list[str], list[str]]:
    """The patterns and rewrite templates of an action (a ``PatternAction``, a
    ``RuleAction`` or their JSON form)."""
    data = action.model_dump(mode="json") if hasattr(action, "model_dump") else action
    if not isinstance(data, dict):
        return [], []
    if isinstance(data.get("rule"), dict):
        return _rule_strings(data["rule"])
    pattern, rewrite = data.get("pattern"), data.get("rewrite")
    return (
        [pattern] if isinstance(pattern, str) else [],
        [rewrite] if isinstance(rewrite, str) else [],
    )


def instruction_leaks(instruction: str, actions: Iterable[Any], pre: str = "") -> list[str]:
    """How ``instruction`` gives away the expert's ``actions`` (see the module): one
    sentence per leak, empty when it states intent only. ``pre`` is the file before the
    change (code from it may be quoted as a pattern)."""
    leaks: list[str] = []
    said = _squash(instruction)
    tokens = sorted(set(METAVARIABLE.findall(instruction)))
    if tokens:
        leaks.append(f"it has the ast-grep metavariable(s) {', '.join(tokens)}")
    if _RULE_KEY.search(instruction):
        leaks.append("it has ast-grep rule text (a rule key such as rule:, fix: or pattern:)")
    code = _squash(pre)
    for action in actions:
        patterns, rewrites = action_texts(action)
        for what, texts in (("pattern", patterns), ("rewrite template", rewrites)):
            for text in texts:
                squashed = _squash(text)
                if not squashed or squashed not in said or _NAME.fullmatch(squashed):
                    continue
                if what == "pattern" and not METAVARIABLE.search(text) and squashed in code:
                    continue  # the code to change, quoted
                leaks.append(f"it has the gold action's {what} {text!r}")
    return leaks
