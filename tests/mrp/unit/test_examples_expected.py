"""examples/mrp/expected/: the values `keel demo` checks the pure MRP examples against are
what examples/mrp/expected/derive.py works out from the inputs (no Keel code involved)."""

from __future__ import annotations

import importlib.util
import json
from decimal import Decimal
from pathlib import Path
from types import ModuleType

import pytest

EXPECTED = Path(__file__).resolve().parents[3] / "examples" / "mrp" / "expected"


def derive_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mrp_expected_derive", EXPECTED / "derive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["wordcount", "invoices"])
def test_committed_expected_values_are_what_derive_py_works_out(name: str) -> None:
    derived = derive_module().EXPECTED[name]()
    committed = json.loads((EXPECTED / f"{name}.json").read_text())
    assert committed == json.loads(json.dumps(derived)), (
        f"examples/mrp/expected/{name}.json is stale: run examples/mrp/expected/derive.py"
    )


def test_derive_py_imports_nothing_of_keel() -> None:
    """Independent of the code it checks: the standard library and PyYAML only."""
    source = (EXPECTED / "derive.py").read_text()
    imported = {
        line.split()[1].split(".")[0]
        for line in source.splitlines()
        if line.startswith(("import ", "from "))
    }
    assert imported <= {"__future__", "json", "math", "sys", "collections", "decimal",
                        "pathlib", "typing", "yaml"}, imported  # fmt: skip


def test_the_word_rule_and_the_exact_sums() -> None:
    m = derive_module()
    assert m.words_of("Request-digest cache: it's 120 percent_ok.") == [
        "Request", "digest", "cache", "it's", "120", "percent_ok",
    ]  # fmt: skip
    assert m.amount(0.3) == Decimal("0.3") and m.amount("1e-2") == Decimal("0.01")
    inv = json.loads((EXPECTED / "invoices.json").read_text())
    assert Decimal(inv["sum"]) == Decimal("100000000000001240.1578")
    assert Decimal(inv["mean_amount"]) * inv["invoices"] == Decimal(inv["sum"])
    wc = json.loads((EXPECTED / "wordcount.json").read_text())
    assert sum(wc["counts"].values()) == wc["words"]
