"""Work out what the pure MRP examples must produce, without Keel.

`keel demo` compares the values its word-count and invoice jobs produced with the files
beside this script. They are derived here from the inputs alone, by the definitions
below, and share no code with Keel's operators, reducers or writers, so a bug there
cannot move the answer it is checked against.

wordcount.json, from the four files of ``examples/mrp/data/*.txt``:
  each file is read as UTF-8 and lowercased; a word is a longest run of characters that
  are letters, digits, ``_`` or ``'`` (so ``request-digest`` is two words, ``crashes:``
  is ``crashes``). ``counts`` is how often each word occurs over all files, ``words`` their
  sum, ``chars`` the characters of the files (newlines included), ``files`` how many
  there are, and ``words_per_file`` is ``words / files``.

invoices.json, from the eight ``inputs.items`` of ``examples/mrp/invoices.yaml``:
  each amount is an exact decimal: a string is read as written (``"1e-2"`` is 0.01), and
  the YAML float ``0.3`` as its shortest text, ``0.3``. ``sum`` is their exact sum,
  ``mean_amount`` the sum divided by the count, rounded half-even to 6 places (the job's
  ``places: 6``; here the division is exact anyway), and ``shards`` is the number of
  shards of ``shard_size: 3`` the eight items make.

Run ``python examples/mrp/expected/derive.py`` to rewrite both files (it needs only the
standard library and PyYAML, to read the job file);
tests/mrp/unit/test_examples_expected.py re-derives them and compares with the committed
files.
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
EXAMPLES = HERE.parent


def words_of(text: str) -> list[str]:
    """The words of ``text`` (see the module docstring), in order."""
    words: list[str] = []
    current = ""
    for ch in text:
        if ch.isalnum() or ch in "_'":
            current += ch
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return words


def wordcount() -> dict[str, Any]:
    files = sorted((EXAMPLES / "data").glob("*.txt"))
    counts: Counter[str] = Counter()
    chars = 0
    for path in files:
        text = path.read_text(encoding="utf-8").lower()
        chars += len(text)
        counts.update(words_of(text))
    words = sum(counts.values())
    return {
        "how": "examples/mrp/expected/derive.py: lowercased words (runs of letters, "
        "digits, _ and ') of examples/mrp/data/*.txt, counted",
        "files": len(files),
        "words": words,
        "chars": chars,
        "words_per_file": str(Decimal(words) / Decimal(len(files))),
        "counts": dict(sorted(counts.items())),
    }


def amount(value: object) -> Decimal:
    """An amount as an exact decimal: strings as written, floats by their shortest text."""
    if isinstance(value, str):
        return Decimal(value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return Decimal(repr(value))
    raise ValueError(f"not an amount: {value!r}")


def invoices() -> dict[str, Any]:
    job = yaml.safe_load((EXAMPLES / "invoices.yaml").read_text(encoding="utf-8"))
    items = job["inputs"]["items"]
    amounts = [amount(item["amount"]) for item in items]
    with localcontext() as ctx:
        ctx.prec = 60  # more digits than any of these sums needs: every step is exact
        total = sum(amounts, Decimal(0))
        mean = (total / len(amounts)).quantize(Decimal("0.000001"), rounding=ROUND_HALF_EVEN)
    return {
        "how": "examples/mrp/expected/derive.py: the amounts of examples/mrp/invoices.yaml "
        "as exact decimals, summed; mean = sum / count to 6 places",
        "invoices": len(amounts),
        "sum": str(total),
        "mean_amount": str(mean),
        "shards": math.ceil(len(items) / job["inputs"]["shard_size"]),
    }


EXPECTED = {"wordcount": wordcount, "invoices": invoices}


def main() -> None:
    for name, derive in EXPECTED.items():
        path = HERE / f"{name}.json"
        path.write_text(json.dumps(derive(), indent=2, ensure_ascii=False) + "\n")
        sys.stderr.write(f"wrote {path}\n")


if __name__ == "__main__":
    main()
