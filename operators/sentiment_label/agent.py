"""Label each item's sentiment with one word, asking the model through ``ctx.llm``.

The request is deterministic (temperature 0, a seed derived from the shard seed, a small
``max_tokens``), so equal items give equal requests and the request-digest cache answers
repeats and replays without a model call. The reply is read leniently: the first known
label word in it wins.

A reply with no label word in it is recorded as :data:`UNLABELED` (``unlabeled``) and
counted as such, never passed off as one of the labels: a small model that answers with
something else would otherwise look like a run of ``neutral`` reviews. A job that wants
such replies filed under a label may say so on purpose with ``params.fallback`` (for
example ``fallback: neutral``). ``counts`` always has the ``unlabeled`` key (0 when every
reply had a label word), or the fallback's when one is given.
"""

from __future__ import annotations

import re

from pydantic import JsonValue

from keel.mrp.sdk import AgentBase, OperatorContext

DEFAULT_LABELS = ["negative", "neutral", "positive"]
#: What a reply with no label word is recorded as, unless ``params.fallback`` names a label.
UNLABELED = "unlabeled"
_WORD = re.compile(r"[a-z]+")

PROMPT = (
    "Classify the sentiment of the text below. Answer with exactly one word, one of: "
    "{labels}.\n\nText: {text}\n\nAnswer:"
)


def _text(item: JsonValue) -> tuple[JsonValue, str]:
    if isinstance(item, str):
        return None, item
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return item.get("id"), str(item["text"])
    raise ValueError("an item must be a string or an object with 'text'")


def read_label(reply: str, labels: list[str], fallback: str = UNLABELED) -> str:
    """The first word of ``reply`` that is a label (case-folded), else ``fallback``."""
    for word in _WORD.findall(reply.lower()):
        if word in labels:
            return word
    return fallback


class SentimentLabel(AgentBase):
    """``{"labels": [{"index", "id"?, "label"}], "counts": {label: n}}`` for the shard."""

    def map(self, items: list[JsonValue], ctx: OperatorContext) -> JsonValue:
        raw_labels = ctx.params.get("labels") or DEFAULT_LABELS
        labels = sorted(str(x).lower() for x in raw_labels)  # type: ignore[union-attr]
        fallback = str(ctx.params.get("fallback") or UNLABELED).lower()
        if fallback == UNLABELED and UNLABELED in labels:
            raise ValueError(
                f"{UNLABELED!r} cannot be a label: it is what a reply with no label word is "
                "recorded as (name another fallback to reuse the word)"
            )
        model = str(ctx.params.get("model", ""))
        seed = ctx.seed % 2**31
        counts = dict.fromkeys(sorted({*labels, fallback}), 0)
        out: list[JsonValue] = []
        for index, item in enumerate(items):
            item_id, text = _text(item)
            result = ctx.llm.complete(
                [{"role": "user", "content": PROMPT.format(labels=", ".join(labels), text=text)}],
                model=model,
                temperature=0,
                seed=seed,
                max_tokens=4,
            )
            label = read_label(result.content, labels, fallback)
            counts[label] += 1
            row: dict[str, JsonValue] = {"index": index, "label": label}
            if item_id is not None:
                row["id"] = item_id
            out.append(row)
        ctx.log(f"labelled {len(items)} items")
        return {"labels": out, "counts": {k: v for k, v in counts.items()}}
