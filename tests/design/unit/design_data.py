"""Shipped design data and golden cases, loaded once for the design unit tests."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from keel.design.critics import PriceTable, load_prices
from keel.design.patterns import PatternCatalog, load_patterns

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "configs" / "design"
GOLDEN = Path(__file__).resolve().parent / "design_golden"


def raw_patterns() -> dict[str, Any]:
    return yaml.safe_load((CONFIG / "patterns.yaml").read_text())


def raw_prices() -> dict[str, Any]:
    return yaml.safe_load((CONFIG / "prices.yaml").read_text())


@cache
def catalog() -> PatternCatalog:
    return load_patterns(raw_patterns())


@cache
def prices() -> PriceTable:
    return load_prices(raw_prices())


def golden_cases() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(GOLDEN.glob("*.json"))}
