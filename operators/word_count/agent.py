"""Count items, words and characters in a shard of text items.

An item is a string, an object with a ``text`` field, or an input file reference
(``{"path", "digest", "size_bytes"}``, from ``inputs.files``), read as UTF-8.
"""

from __future__ import annotations

import re
from collections import Counter

from pydantic import JsonValue

from keel.mrp.normalize import FileRef
from keel.mrp.sdk import AgentBase, OperatorContext

_WORD = re.compile(r"[\w']+", re.UNICODE)


def _text(item: JsonValue, ctx: OperatorContext) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return str(item["text"])
    if isinstance(item, dict) and "digest" in item:
        ref = FileRef.model_validate(item)
        return ctx.read_file(ref).decode("utf-8")
    raise ValueError("an item must be a string, an object with 'text', or a file")


class WordCount(AgentBase):
    """``{"items", "words", "chars"}`` for the shard, plus ``counts`` (word -> count, keys
    sorted) when ``params.by_word`` is true. ``params.lowercase`` folds case first."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        lowercase = bool(ctx.params.get("lowercase", True))
        by_word = bool(ctx.params.get("by_word", False))
        words = 0
        chars = 0
        counts: Counter[str] = Counter()
        for item in items:
            text = _text(item, ctx)
            if lowercase:
                text = text.lower()
            found = _WORD.findall(text)
            words += len(found)
            chars += len(text)
            if by_word:
                counts.update(found)
        out: dict[str, JsonValue] = {"items": len(items), "words": words, "chars": chars}
        if by_word:
            out["counts"] = {w: counts[w] for w in sorted(counts)}
        return out
