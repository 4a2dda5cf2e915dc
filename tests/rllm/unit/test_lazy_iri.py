"""``activities.lazy_iri``: a CLI start does not build the IRI grammar, and the ``iri`` formats
are checked as before (in a fresh interpreter, as a person's command starts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

CHECK = """
import json, sys
{first}
from keel.rllm.schema import _validator
grammar = "rfc3987_syntax.syntax_helpers"
out = {{"at_start": grammar in sys.modules}}
for fmt, bad, good in [
    ("iri", "http://exa mple.com/ä", "http://example.com/ä"),
    ("iri-reference", "\\\\\\\\bad", "../a/ä"),
]:
    v = _validator({{"type": "string", "format": fmt}})
    out[fmt] = [[e.message for e in v.iter_errors(x)] for x in (bad, good)]
out["after"] = grammar in sys.modules
print(json.dumps(out))
"""


def _run(first: str) -> dict[str, object]:
    code = CHECK.format(first=first)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_cli_start_defers_the_grammar_and_checks_iris_the_same() -> None:
    deferred = _run("import cli.runllm")
    direct = _run("")
    assert deferred["at_start"] is False
    assert direct["at_start"] is True
    assert deferred["iri"] == direct["iri"] == [["'http://exa mple.com/ä' is not a 'iri'"], []]
    assert deferred["iri-reference"] == direct["iri-reference"]
    assert deferred["iri-reference"][0] and not deferred["iri-reference"][1]  # type: ignore[index]
    assert deferred["after"] is True


def test_a_worker_loads_the_real_grammar_at_start() -> None:
    code = (
        "import sys, cli.keel, keel.rllm.schema\n"
        "from activities import lazy_iri\n"
        "before = 'rfc3987_syntax.syntax_helpers' in sys.modules\n"
        "real = lazy_iri.load_now()\n"
        "print(before, real is sys.modules['rfc3987_syntax'], hasattr(real, 'syntax_parser'),"
        " real.is_valid_syntax('iri', 'http://example.com/ä'))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True", "True"]
