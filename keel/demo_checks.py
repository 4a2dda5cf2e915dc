"""What `keel demo` checks its results against, as pure functions (``cli/keel.py`` reads
the results; this decides whether they are right and says how, one line each).

- **Pure MRP examples.** The values the word-count and invoice jobs produced are compared
  with ``examples/mrp/expected/*.json``, which ``examples/mrp/expected/derive.py`` works
  out from the inputs without Keel's code (:func:`compare_wordcount`,
  :func:`compare_invoices`). Numbers are compared as exact decimals, so ``"8.000000"``
  (the reducer's six places) equals ``8``.
- **The LLM sentiment example.** :func:`sentiment_tally` counts the replies that had a
  label word and the ``unlabeled`` ones, and checks that every review got a row.
- **The ``.rllm`` apps.** Each output must match its app's ``output_schema``
  (:func:`schema_problems`) and hold what the input implies (:func:`content_problems`,
  the rules are in :data:`CONTENT_RULES`); :func:`attempt_lines` tells the recovery loop's
  steps.
- **The design validators.** :func:`tally_validators` counts passed, failed and
  ``not_run`` apart. Keel has no optional validators: every validator the pipeline runs
  on a repository is required, so one that did not run fails the demo with its reason.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from keel.rllm.run import RllmAttempt
from keel.rllm.schema import validate_instance


@dataclass
class ValueCheck:
    """A comparison of produced values with expected ones: ``line`` says what was compared
    (always printed), ``differences`` name each value that differs (empty when all match)."""

    line: str
    differences: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences


def _decimal(value: Any) -> Decimal | None:
    """An exact decimal of a number or a decimal string; None for anything else."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        value = repr(value)
    try:
        d = Decimal(value) if isinstance(value, int | str) else None
    except decimal.InvalidOperation:
        return None
    return d if d is not None and d.is_finite() else None


def same_number(produced: Any, expected: Any) -> bool:
    """Equal as exact decimals (``"33.750000"`` equals ``"33.75"``); never for a non-number."""
    a, b = _decimal(produced), _decimal(expected)
    return a is not None and b is not None and a == b


def _differs(what: str, produced: Any, expected: Any) -> str | None:
    if same_number(produced, expected):
        return None
    shown = "nothing" if produced is None else produced
    return f"{what}: produced {shown}, expected {expected}"


def compare_wordcount(reduced: Mapping[str, Any], expected: Mapping[str, Any]) -> ValueCheck:
    """The word-count job's reduced value (``{"shards", "totals": {"items", "words",
    "chars", "counts.<word>"...}, "means": {"words_per_file"}}``, as wordcount.json holds
    it under ``data``) against ``examples/mrp/expected/wordcount.json``.

    Every word's count is compared, on both sides: a word produced but not expected, or
    expected but not produced, is a difference too.
    """
    totals = reduced.get("totals") or {}
    means = reduced.get("means") or {}
    produced_counts = {
        k.removeprefix("counts."): v for k, v in totals.items() if k.startswith("counts.")
    }
    want_counts: Mapping[str, Any] = expected["counts"]
    differences: list[str] = []
    matched = 0
    for word in sorted(set(produced_counts) | set(want_counts)):
        if word not in want_counts:
            differences.append(
                f"count of {word!r}: produced {produced_counts[word]}, expected none "
                "(not a word of the input)"
            )
            continue
        problem = _differs(f"count of {word!r}", produced_counts.get(word), want_counts[word])
        if problem is None:
            matched += 1
        else:
            differences.append(problem)
    totals_checked = [
        ("files", totals.get("items"), expected["files"]),
        ("shards", reduced.get("shards"), expected["files"]),  # one file per shard
        ("words", totals.get("words"), expected["words"]),
        ("chars", totals.get("chars"), expected["chars"]),
        ("words per file", means.get("words_per_file"), expected["words_per_file"]),
    ]
    totals_differ = [
        p for what, got, want in totals_checked if (p := _differs(what, got, want)) is not None
    ]
    differences += totals_differ
    line = (
        f"word counts: {len(want_counts)} distinct words, {matched} match expected; "
        f"{expected['files']} files, {expected['words']} words, {expected['chars']} chars, "
        f"{expected['words_per_file']} words per file: "
        + ("match expected" if not totals_differ else f"{len(totals_differ)} DIFFER")
    )
    return ValueCheck(line=line, differences=differences)


def compare_invoices(rows: Sequence[Mapping[str, Any]], expected: Mapping[str, Any]) -> ValueCheck:
    """The invoice job's Parquet rows (``{"key", "value"}``: ``totals.count``,
    ``totals.sum``, ``means.mean_amount``, ``shards``) against
    ``examples/mrp/expected/invoices.json``. A value is read as its JSON text where the
    column holds text (``"3"``), and compared as an exact decimal."""
    produced = {str(r.get("key")): r.get("value") for r in rows}
    compared = [
        ("invoices", "totals.count", expected["invoices"]),
        ("sum", "totals.sum", expected["sum"]),
        ("mean", "means.mean_amount", expected["mean_amount"]),
        ("shards", "shards", expected["shards"]),
    ]
    differences = [
        p
        for what, key, want in compared
        if (p := _differs(f"{what} ({key})", produced.get(key), want)) is not None
    ]
    line = (
        f"invoice totals: {expected['invoices']} invoices, sum {expected['sum']}, "
        f"mean {expected['mean_amount']}, {expected['shards']} shards; "
        f"{len(compared) - len(differences)} of {len(compared)} values match expected"
    )
    return ValueCheck(line=line, differences=differences)


#: What the sentiment operator records a reply with no label word as (its default).
UNLABELED = "unlabeled"


def sentiment_tally(reduced: Mapping[str, Any], reviews: int) -> ValueCheck:
    """How many of ``reviews`` replies had a label word, from the sentiment job's reduced
    value (``totals`` with ``counts.<label>`` and ``counts.unlabeled``). The model's skill
    is printed, never a failure; a review with no row at all (counts that do not add up
    to ``reviews``) is."""
    totals = reduced.get("totals") or {}
    counts: dict[str, int] = {}
    differences: list[str] = []
    for key, value in sorted(totals.items()):
        if key.startswith("counts."):
            n = _decimal(value)
            if n is None or n != n.to_integral_value() or n < 0:
                differences.append(f"sentiment {key}: {value!r} is not a count")
                continue
            counts[key.removeprefix("counts.")] = int(n)
    unlabeled = counts.pop(UNLABELED, 0)
    labelled = sum(counts.values())
    if labelled + unlabeled != reviews:
        differences.append(
            f"sentiment: {labelled + unlabeled} replies counted for {reviews} reviews"
        )
    each = ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))
    line = f"{labelled} of {reviews} replies had a label word ({each}); {unlabeled} unlabeled"
    return ValueCheck(line=line, differences=differences)


# ----------------------------------------------------------------------------- .rllm apps


def schema_problems(output: Any, output_schema: Mapping[str, Any]) -> list[str]:
    """``path: message`` for each way ``output`` misses the app's ``output_schema``."""
    return [issue.line() for issue in validate_instance(output_schema, output)]


#: Words that name nothing on their own: a keyword made of these only is no keyword, and
#: a summary sharing only these with its input names nothing from it.
_FUNCTION_WORDS_TEXT = """
a an the and or but of to in on at by for from with as is are was were be been it its
this that these those there their they them he she we you i not no so if then than
when which who what how can will would should may might do does did has have had
"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS_TEXT.split())
#: The longest keyword, in words: a keyword is a word or a short phrase, not a clause.
MAX_KEYWORD_WORDS = 4
_WORDS = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """The lowercased words of ``text`` (letters and digits, with an inner apostrophe)."""
    return _WORDS.findall(text.lower())


def keyword_problems(keywords: Any, text: str, max_keywords: int) -> list[str]:
    """Each keyword is a phrase of 1 to :data:`MAX_KEYWORD_WORDS` words, every one of them
    a word of ``text`` (case-insensitive), at least one not a :data:`FUNCTION_WORDS`
    word; and there are at most ``max_keywords`` of them (the app's input says how many).
    A keyword that is not in the input is not a keyword of it."""
    if not isinstance(keywords, list) or not keywords:
        return ["keywords: expected a non-empty list"]
    vocabulary = set(words(text))
    problems: list[str] = []
    if len(keywords) > max_keywords:
        problems.append(f"keywords: {len(keywords)} keywords, at most {max_keywords} asked for")
    for i, keyword in enumerate(keywords):
        where = f"keywords[{i}] {keyword!r}"
        found = words(keyword) if isinstance(keyword, str) else []
        if not found:
            problems.append(f"{where}: not a word")
            continue
        if len(found) > MAX_KEYWORD_WORDS:
            problems.append(
                f"{where}: {len(found)} words, a keyword has at most {MAX_KEYWORD_WORDS}"
            )
        missing = [w for w in found if w not in vocabulary]
        if missing:
            problems.append(f"{where}: {', '.join(repr(w) for w in missing)} not in the input")
        if all(w in FUNCTION_WORDS for w in found):
            problems.append(f"{where}: only function words, it names nothing")
    return problems


_SENTENCE_END = re.compile(r"[.!?]+(?:\s+|$)")


def sentence_count(text: str) -> int:
    """Sentences in ``text``: pieces ending at ``.``, ``!`` or ``?`` followed by a space or
    the end (a last piece with no end mark counts too)."""
    return sum(1 for piece in _SENTENCE_END.split(text.strip()) if words(piece))


def summary_problems(summary: Any, text: str, max_sentences: int) -> list[str]:
    """A summary names something from ``text`` (shares a word with it that is not a
    :data:`FUNCTION_WORDS` word), is shorter than ``text``, and has at most
    ``max_sentences`` sentences (the app's input says how many)."""
    if not isinstance(summary, str) or not words(summary):
        return ["summary: expected text"]
    problems: list[str] = []
    shared = (set(words(summary)) & set(words(text))) - FUNCTION_WORDS
    if not shared:
        problems.append(f"summary {summary!r}: names nothing from the input")
    if len(summary.strip()) >= len(text.strip()):
        problems.append(f"summary: {len(summary.strip())} characters, not shorter than the input")
    n = sentence_count(summary)
    if n > max_sentences:
        problems.append(f"summary: {n} sentences, at most {max_sentences} asked for")
    return problems


def sentences_problems(output: Mapping[str, Any]) -> list[str]:
    """``sentences`` says how many sentences ``summary`` has: it must be that number."""
    n = sentence_count(str(output.get("summary", "")))
    got = output.get("sentences")
    return [] if got == n else [f"sentences: {got!r}, but the summary has {n}"]


#: The content each example app's output must hold, given its input (``text`` and the
#: input's defaults: ``max_sentences`` 2, ``max_keywords`` 5), by app name.
CONTENT_RULES: dict[str, str] = {
    "summary": "the summary names something from the input, is shorter than it, has at "
    "most max_sentences sentences, and `sentences` is its sentence count",
    "extract_keywords": f"at most max_keywords keywords, each a phrase of at most "
    f"{MAX_KEYWORD_WORDS} words, all of them words of the input, not only function words",
    "compose_summary_keywords": "the summary and the keywords, each as in the apps it uses",
}


def content_problems(app: str, output: Mapping[str, Any], inputs: Mapping[str, Any]) -> list[str]:
    """What in ``output`` the input (``inputs``: ``text`` plus the input schema's
    defaults) does not bear out, by :data:`CONTENT_RULES`; empty when all holds. An app
    with no rule has no content check."""
    text = str(inputs.get("text", ""))
    max_sentences = int(inputs.get("max_sentences", 2))
    max_keywords = int(inputs.get("max_keywords", 5))
    problems: list[str] = []
    if app in ("summary", "compose_summary_keywords"):
        problems += summary_problems(output.get("summary"), text, max_sentences)
    if app == "summary":
        problems += sentences_problems(output)
    if app in ("extract_keywords", "compose_summary_keywords"):
        problems += keyword_problems(output.get("keywords"), text, max_keywords)
    return problems


def attempt_lines(attempts: Sequence[RllmAttempt]) -> list[str]:
    """One line per model call of an app: the first prompt or a recovery prompt, and
    whether its answer matched the schema (the first problem the model was shown if not)."""
    lines = []
    for a in attempts:
        prompt = "prompt" if a.attempt == 1 else "recovery prompt"
        verdict = "valid" if a.ok else f"rejected ({a.errors[0] if a.errors else 'invalid'})"
        lines.append(f"attempt {a.attempt} ({prompt}): {verdict}")
    return lines


# ------------------------------------------------------------------------ design validators


@dataclass
class ValidatorTally:
    """Validators by status, and a failure line for each one that failed or did not run."""

    passed: list[str]
    failed: list[str]
    not_run: list[str]
    problems: list[str]

    @property
    def line(self) -> str:
        return f"{len(self.passed)} passed, {len(self.failed)} failed, {len(self.not_run)} not run"


def tally_validators(
    statuses: Mapping[str, str], reasons: Mapping[str, str] | None = None
) -> ValidatorTally:
    """Count ``statuses`` (validator -> passed|failed|not_run). Every validator the design
    pipeline runs is required (Keel has no optional ones), so a failed one and one that
    did not run are both problems, each named with its reason from ``reasons`` (the
    report's summaries). An unknown status is a problem too."""
    reasons = reasons or {}
    by: dict[str, list[str]] = {"passed": [], "failed": [], "not_run": []}
    problems: list[str] = []
    for name, status in statuses.items():
        why = reasons.get(name) or "no reason recorded"
        if status not in by:
            problems.append(f"validator {name}: unknown status {status!r}")
            continue
        by[status].append(name)
        if status == "failed":
            problems.append(f"validator {name} failed: {why}")
        elif status == "not_run":
            problems.append(f"validator {name} did not run (required): {why}")
    if not statuses:
        problems.append("no validator ran")
    return ValidatorTally(by["passed"], by["failed"], by["not_run"], problems)


__all__ = [
    "CONTENT_RULES",
    "ValidatorTally",
    "ValueCheck",
    "attempt_lines",
    "compare_invoices",
    "compare_wordcount",
    "content_problems",
    "keyword_problems",
    "same_number",
    "schema_problems",
    "sentence_count",
    "sentiment_tally",
    "summary_problems",
    "tally_validators",
]
